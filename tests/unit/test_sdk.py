"""The SDK inside a workload: nothing lost when the disk refuses writes, valid lines only,
and no JAX backend started on the workload's behalf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter import sdk
from exporter.sdk.steplog import StepLogWriter


def test_lines_survive_a_full_disk(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    writer = StepLogWriter(path, {"run_id": "r"})
    real_fd = writer._fd
    writer._fd = os.open("/dev/full", os.O_WRONLY)  # every write fails with ENOSPC
    try:
        writer.append("a\n")
        with pytest.raises(OSError):
            writer.flush()
        writer.append("b\n")
        with pytest.raises(OSError):
            writer.flush()
    finally:
        os.close(writer._fd)  # type: ignore[arg-type]
        writer._fd = real_fd  # the disk has room again
    writer.append("c\n")
    writer.close()
    assert path.read_text() == "a\nb\nc\n"
    assert writer.dropped_lines == 0


def test_a_step_that_raises_is_not_counted_and_tokens_stay_numbers(tmp_path: Path) -> None:
    with sdk.run("w", shared_dir=tmp_path, run_id="r", host="h") as run:
        with pytest.raises(RuntimeError), run.step(tokens=8):
            raise RuntimeError("out of memory")
        with run.step(tokens=True):  # anything int() accepts becomes a JSON number
            pass
        with pytest.raises(TypeError):
            run.step(tokens=None)  # type: ignore[arg-type]
    lines = [json.loads(x) for x in next((tmp_path / "steps").iterdir()).read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    assert [(x["step"], x["tokens"]) for x in steps] == [(1, 1)]


def test_sdk_run_does_not_start_jax_backends(tmp_path: Path) -> None:
    code = (
        "import jax, json, sys\n"
        "from jax._src import xla_bridge\n"
        "from exporter import sdk\n"
        f"r = sdk.run('w', shared_dir={str(tmp_path)!r})\n"
        "started = xla_bridge.backends_are_initialized()\n"
        "jax.numpy.ones(1).block_until_ready()\n"  # the workload starts JAX itself
        "import time, pathlib\n"
        f"p = pathlib.Path({str(tmp_path)!r}) / 'run.json'\n"
        "deadline = time.monotonic() + 60\n"  # the flusher thread completes run.json
        "while 'backend' not in p.read_text() and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        "r.close()\n"
        "print(json.dumps(started))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["system"]["backend"] == "cpu"
    assert info["software"]["jax"]
