"""Several processes of one run on one node (one per GPU, as JAX and PyTorch jobs run):
each is a capture target with its own profiler server, each pid maps to the run, and
one process ending takes only itself off the targets. Real SDK processes, real servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.capture.targets import LocalRunDiscovery
from exporter.metrics.run_pids import RunPids
from tests.harness import ROOT, Proc, free_port, wait_until

pytestmark = pytest.mark.integration

PROCESS = """
import sys, time
from pathlib import Path
from exporter import sdk

shared, port, stop = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
with sdk.run("multi", shared_dir=shared, run_id="r-multi", profiler_port=port) as run:
    while not stop.exists():
        with run.step(tokens=1):
            time.sleep(0.05)
"""


def test_every_process_of_a_run_is_a_target_and_a_pid_of_the_run(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    ports = sorted({free_port() for _ in range(2)})
    assert len(ports) == 2
    stops = [tmp_path / f"stop-{port}" for port in ports]
    env = {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    procs = [
        Proc.python(
            ["-c", PROCESS, str(shared), str(port), str(stop)], tmp_path / f"{port}.log", env=env
        )
        for port, stop in zip(ports, stops, strict=True)
    ]
    try:
        discovery = LocalRunDiscovery(shared)
        found = wait_until(
            lambda: len(targets := discovery.discover()) == 2 and targets,
            timeout=60,
            what="both processes of the run as targets",
        )
        assert [(t.address, t.run_id, t.workload) for t in found] == [
            (f"127.0.0.1:{port}", "r-multi", "multi") for port in ports
        ]
        pids = RunPids(shared)
        for proc in procs:
            assert pids.identity(proc.pid) == {"run_id": "r-multi", "workload": "multi"}

        stops[0].touch()  # the first process ends cleanly; the second trains on
        wait_until(lambda: not procs[0].alive(), timeout=30, what="the first process to end")
        assert procs[0].popen.returncode == 0, procs[0].output()
        assert [t.address for t in discovery.discover()] == [f"127.0.0.1:{ports[1]}"]
    finally:
        for stop in stops:
            stop.touch()
        for proc in procs:
            proc.stop()
