"""Two runs on one node (issue 11 B): a taken profiler port is refused in one line, and a
closed run says so in its run file, so the sidecar stops treating it as a target."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from exporter import sdk


def test_a_taken_profiler_port_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as other:  # another run's profiler server
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with sdk.run("llama-8b", shared_dir=tmp_path, profiler_port=port, run_id="r2") as run:
            assert run.profiler_port is None
            info = json.loads((tmp_path / "runs" / "r2.json").read_text())
            assert info["profiler_port"] is None  # never claims the other run's server
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"profiler port {port} is already in use" in lines[0]
    assert "r2" in lines[0]


def test_a_closed_run_is_marked_ended_in_its_run_file(tmp_path: Path) -> None:
    with sdk.run("demo", shared_dir=tmp_path, run_id="r1") as run, run.step():
        pass
    info = json.loads((tmp_path / "runs" / "r1.json").read_text())
    assert info["ended_unix"] >= info["start_unix"]
