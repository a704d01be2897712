"""The MLPROF_MALLOC item of issue 31: a value other than unset or ``default`` is refused
in one line naming the accepted ones (it had silently meant "keep freed blocks")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config import load_settings
from exporter.errors import ConfigError
from exporter.heap import malloc_choice
from exporter.testing.synthetic import write_tpu_capture

EXPECTED = (
    "MLPROF_MALLOC='glibc': expected 'default' (glibc's own allocator settings) or unset "
    "(converting processes keep freed blocks for reuse)"
)


def test_the_accepted_values() -> None:
    assert malloc_choice({}) == "keep"
    assert malloc_choice({"MLPROF_MALLOC": ""}) == "keep"
    assert malloc_choice({"MLPROF_MALLOC": " Default "}) == "default"


@pytest.mark.parametrize("value", ["glibc", "defualt", "off", "0"])
def test_another_value_is_refused_naming_the_accepted_ones(value: str) -> None:
    with pytest.raises(ConfigError, match=r"expected 'default' \(glibc's own allocator"):
        malloc_choice({"MLPROF_MALLOC": value})


def test_settings_refuse_it_before_serve_starts_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLPROF_MALLOC", "glibc")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == EXPECTED


def test_a_converting_command_exits_2_with_one_line(tmp_path: Path) -> None:
    capture = tmp_path / "vm.xplane.pb"
    write_tpu_capture(capture, devices=1, steps=2, ops_per_step=10)
    # A fresh interpreter: the allocator setting is applied once per process.
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "flamegraph", str(capture), "-o",
         str(tmp_path / "out.pb")],
        capture_output=True, text=True, env={**os.environ, "MLPROF_MALLOC": "glibc"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"mlprof: {EXPECTED}\n"
    assert not (tmp_path / "out.pb").exists()
