"""Issue 31 (6): numbers in files and variables are ASCII digits; ``str.isdigit()`` is not.

``"²".isdigit()`` is True and ``int("²")`` raises: a capture whose ``kernel_details``
said ``regs:²``, or whose ``profile_start_time`` was ``"²"``, ended ``mlprof analyze``
in a traceback.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.analysis.facts.gpu_kernels import parse_kernel_details
from exporter.ascii_digits import parse_ascii_int
from exporter.cli import main
from exporter.config import parse_hostport
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.xspace import stat_int
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture
from exporter.testing.synthetic_gpu import gpu_capture

# superscript two, Arabic-Indic one two, fullwidth one two, mathematical bold seven
NOT_ASCII = ["²", "١٢", "\uff11\uff12", "\U0001d7d5"]


@pytest.mark.parametrize("text", NOT_ASCII)
def test_digits_that_are_not_ascii_are_no_number(text: str) -> None:
    assert text.isdigit()  # what the old checks trusted
    assert parse_ascii_int(text) is None
    assert parse_ascii_int(f"-{text}", signed=True) is None


def test_ascii_numbers_and_what_else_is_refused() -> None:
    assert parse_ascii_int("0042") == 42
    assert parse_ascii_int("-7", signed=True) == -7
    assert parse_ascii_int("-7") is None  # unsigned by default
    for text in ("", "--5", "+5", " 5", "5\n", "5_000", "1" * 5000):
        assert parse_ascii_int(text, signed=True) is None, text


def test_kernel_details_with_a_superscript_keep_the_rest() -> None:
    config = parse_kernel_details("regs:² static_shared:0 grid:1,1,1 block:²,1,1 occ_pct:50")
    assert config is not None
    assert (config.registers_per_thread, config.block, config.occupancy_pct) == (0, (1, 1, 1), 50)


def test_a_stat_of_unicode_digits_or_not_finite_holds_no_number() -> None:
    stat = xplane_pb2.XStat(str_value="²")
    assert stat_int(stat) == 0
    assert stat_int(xplane_pb2.XStat(str_value="-12")) == -12
    for value in (math.nan, math.inf):
        assert stat_int(xplane_pb2.XStat(double_value=value)) == 0


def test_folded_stacks_and_ports_with_unicode_digits_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="line 1: expected 'frame;frame VALUE'"):
        FlameGraph.from_folded("a;b ²\n")
    with pytest.raises(ValueError, match="line 1"):
        FlameGraph.from_folded("a;b --5\n")
    with pytest.raises(ValueError, match="expected a port 1-65535"):
        parse_hostport("localhost:٩٤٦٤")


def _gpu_with_superscript_registers(path: Path) -> Path:
    space = gpu_capture(steps=2, kernels_per_step=6).space
    for plane in space.planes:
        for meta in plane.stat_metadata.values():
            if meta.name.startswith("regs:"):
                meta.name = "regs:² " + meta.name.split(" ", 1)[1]
    path.write_bytes(space.SerializeToString())
    return path


def _tpu_with_superscript_start(path: Path) -> Path:
    space = tpu_capture(devices=1, steps=2, ops_per_step=20).space
    env = next(p for p in space.planes if p.name == "Task Environment")
    names = {m.id: m.name for m in env.stat_metadata.values()}
    for stat in env.stats:
        if names[stat.metadata_id] == "profile_start_time":
            stat.str_value = "²"
    path.write_bytes(space.SerializeToString())
    return path


@pytest.mark.parametrize("make", [_gpu_with_superscript_registers, _tpu_with_superscript_start])
def test_analyze_of_a_capture_with_unicode_digits_ends_without_a_traceback(
    tmp_path: Path, make: object
) -> None:
    capture = make(tmp_path / "vm.xplane.pb")  # type: ignore[operator]
    done = CliRunner().invoke(main, ["analyze", str(capture), "--no-xprof", "--format", "json"])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    assert "Traceback" not in done.output
    assert done.exit_code in (0, 1), done.output


def test_memory_settings_and_child_arguments_of_unicode_digits_are_no_number(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from exporter import sandbox
    from exporter.profiles import torch_memory

    monkeypatch.setenv("MLPROF_MEMORY_LIMIT_MB", "²")
    assert sandbox._limit_from_env() == sandbox.default_memory_limit_mb()  # was ValueError
    assert torch_memory.main(["--memory-limit", "²", "snapshot.pickle"]) == 2
    assert "usage: python -m exporter.profiles.torch_memory" in capsys.readouterr().err
