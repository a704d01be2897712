"""What ``mlprof flamegraph`` loads to convert one XProf capture (its start-up cost).

On a small capture the process is mostly start-up: the interpreter, numpy's import and
whatever else the command imports. These tests hold the command to what the
conversion needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.profiles import convert, torch_memory
from exporter.testing.synthetic import write_tpu_capture

ROOT = Path(__file__).resolve().parents[2]
# Runs the CLI as the console script does, then reports (at exit, after click's
# sys.exit) the modules loaded and the threads alive; json is imported after the modules
# are listed, so the list is the command's own.
_PROBE = """
import atexit, os, sys
report_path = sys.argv[1]
def report():
    modules = sorted(sys.modules)
    tasks = "/proc/self/task"
    threads = len(os.listdir(tasks)) if os.path.isdir(tasks) else None
    import json
    with open(report_path, "w") as out:
        json.dump({"modules": modules, "threads": threads}, out)
atexit.register(report)
sys.argv = ["mlprof", *sys.argv[2:]]
from exporter.cli import main
main()
"""


def _probe(tmp_path: Path, *args: str) -> dict[str, object]:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(report), *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(report.read_text())
    return result


def test_a_capture_s_graph_loads_no_pytorch_reader_nor_pprof_writer(tmp_path: Path) -> None:
    capture = tmp_path / "tpu-vm-0.xplane.pb"
    write_tpu_capture(capture, devices=1, steps=2, ops_per_step=20, distinct_ops=5)
    out = tmp_path / "out.folded"
    loaded = _probe(tmp_path, "flamegraph", str(capture), "--kind", "host", "-o", str(out))
    assert "python" in out.read_text()  # the host graph was written
    modules = set(loaded["modules"])  # type: ignore[call-overload]
    assert "exporter.profiles.xplane" in modules
    for unneeded in (
        "exporter.profiles.torch_trace",
        "exporter.profiles.torch_memory",
        "exporter.profiles.pprof",
        "exporter.proto.profile_pb2",
        "pydantic",
    ):
        assert unneeded not in modules


def test_a_capture_s_graph_loads_nothing_only_the_sidecar_commands_use(tmp_path: Path) -> None:
    # serve, demo, fake-tpu and memory-profile import these in themselves (and xspace
    # tempfile for chunked captures alone): ~15 ms of a ~120 ms process on 2 k events.
    capture = tmp_path / "tpu-vm-0.xplane.pb"
    write_tpu_capture(capture, devices=1, steps=2, ops_per_step=20, distinct_ops=5)
    out = tmp_path / "out.folded"
    loaded = _probe(tmp_path, "flamegraph", str(capture), "--kind", "host", "-o", str(out))
    assert "python" in out.read_text()
    modules = set(loaded["modules"])  # type: ignore[call-overload]
    assert {"numpy", "click", "exporter.proto.xplane_pb2"} <= modules  # what it needs
    unneeded = {
        "logging", "subprocess", "shutil", "tempfile", "signal", "hashlib", "json",
        "exporter.schema", "exporter.config", "yaml", "rich", "uvicorn", "fastapi",
    }  # fmt: skip
    assert sorted(unneeded & modules) == []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_conversion_starts_no_openblas_thread_pool(tmp_path: Path) -> None:
    # OpenBLAS starts a thread per core at numpy's import; a conversion does no BLAS.
    capture = tmp_path / "tpu-vm-0.xplane.pb"
    write_tpu_capture(capture, devices=1, steps=2, ops_per_step=20, distinct_ops=5)
    loaded = _probe(tmp_path, "flamegraph", str(capture), "-o", str(tmp_path / "out.folded"))
    assert loaded["threads"] == 1


def test_the_snapshot_suffixes_are_the_pytorch_reader_s() -> None:
    # convert keeps its own copy so that finding memory files imports no PyTorch reader.
    assert convert.SNAPSHOT_SUFFIXES == torch_memory.SNAPSHOT_SUFFIXES
