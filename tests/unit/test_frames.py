"""The frame-label convention users read in flame graphs."""

from __future__ import annotations

import pytest

from exporter.profiles.frames import (
    TRAMPOLINE,
    FrameLabel,
    label_address,
    label_native,
    label_python,
    parse_python_tracer,
)


@pytest.mark.parametrize(
    ("qualname", "expected"),
    [
        ("Transformer.__call__", "Transformer > __call__"),
        ("pkg_fn", "pkg_fn"),
        ("outer.<locals>.inner", "inner"),
        ("Model.step.<locals>.loss_fn", "loss_fn"),
        ("Outer.Inner.method", "Inner > method"),
        ("<module>", "<module>"),
    ],
)
def test_python_labels(qualname: str, expected: str) -> None:
    assert label_python(qualname, "m.py", 3) == FrameLabel(expected, "m.py", 3)


@pytest.mark.parametrize(
    ("symbol", "expected"),
    [
        ("_PyEval_EvalFrameDefault", TRAMPOLINE),
        ("PyObject_Call", TRAMPOLINE),
        ("cfunction_call", TRAMPOLINE),
        ("xla::PjRtClient::Compile", "PjRtClient > Compile"),
        ("xla::cpu::compile_module", "compile_module"),
        ("ThreadpoolListener::StartRegion", "ThreadpoolListener > StartRegion"),
        ("tsl::profiler::TraceMe::Stop", "TraceMe > Stop"),
        (
            "ThunkExecutor::Execute (wait for completion)",
            "ThunkExecutor::Execute (wait for completion)",
        ),
        ("memcpy", "memcpy"),
    ],
)
def test_native_labels(symbol: str, expected: str) -> None:
    assert label_native(symbol).name == expected


def test_native_without_symbol_is_address() -> None:
    assert label_native("", address=0x7F00DEAD).name == "0x7f00dead"
    assert label_address(255).name == "0xff"


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ("$train.py:61 train_step", FrameLabel("train_step", "train.py", 61)),
        ("$builtins isinstance", FrameLabel("isinstance", "builtins", 0)),
        ("$<unknown> __exit__", FrameLabel("__exit__", "", 0)),
        ("ThunkExecutor::Execute", None),
    ],
)
def test_python_tracer_events(event: str, expected: FrameLabel | None) -> None:
    assert parse_python_tracer(event) == expected
