"""A real torch.profiler trace through the sidecar: `mlprof serve` takes it from the
shared dir, stores it as a session, pushes its flame graphs to Pyroscope (the double
speaks the real push protocol) and writes its report.

The trace is made by CPU torch in its own process through the SDK
(``run.torch_profile``, ``torch_sdk_workload.py``); a second one is written where
``tensorboard_trace_handler`` writes (no identity, taken once it stops changing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter import schema
from exporter.capture.session import SessionRecord
from exporter.capture.store import SessionStore
from exporter.profiles.torch_trace import trace_flamegraphs
from tests.harness import Proc, free_port, wait_http, wait_until
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.integration

WORKLOAD = Path(__file__).with_name("torch_sdk_workload.py")
FOREIGN = re.compile(r"XLA|JAX|jax\.|TraceMe|flax|tf\.data|xprof", re.IGNORECASE)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[str, Path, SessionStore, PyroscopeReceiver]]:
    port = free_port()
    shared = tmp_path / "shared"
    with PyroscopeReceiver(legacy_names=True) as receiver:
        env = {
            "MLPROF_LISTEN": f"127.0.0.1:{port}",
            "MLPROF_SHARED_DIR": str(shared),
            "MLPROF_STORE": str(tmp_path / "store"),
            "MLPROF_SPOOL_DIR": str(tmp_path / "spool"),
            "MLPROF_PYROSCOPE_URL": receiver.url,
            "MLPROF_COLLECT_INTERVAL_S": "0.5",
            "MLPROF_REPORT_XPROF": "false",
            "MLPROF_SOURCES": "jax",
        }
        proc = Proc.python(["-m", "exporter.cli", "serve"], tmp_path / "sidecar.log", env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/healthz", timeout=60)
            yield url, shared, SessionStore(tmp_path / "store"), receiver
        finally:
            code = proc.stop()
            log = proc.log.read_text(errors="replace")
            assert "Traceback" not in log, log
            assert code in (0, -15), log


def _session(store: SessionStore, done: bool = True) -> SessionRecord:
    """The trace's session; with ``done``, once both hooks have written to it: the report
    worker its report and the processor its flame-graph artifacts (the processor records
    them after its pushes, so the receiver can hold the graphs before the record does)."""

    def found() -> SessionRecord | None:
        for session_id in store.session_ids():
            record = store.read_record(session_id)
            if record is None:
                continue
            if not done:
                return record
            if record.report is not None and record.processed:
                return record
        return None

    return wait_until(found, timeout=240, interval=0.5, what="the trace's session and report")


def test_an_sdk_trace_is_stored_pushed_and_reported(
    sidecar: tuple[str, Path, SessionStore, PyroscopeReceiver],
) -> None:
    url, shared, store, receiver = sidecar
    # Before: torch_traces/ was read by nobody; the trace stayed there, unseen.
    subprocess.run([sys.executable, str(WORKLOAD), str(shared)], check=True, timeout=300)
    series = receiver.wait_for(2, timeout=240)
    by_source = {s.labels["profile_source"]: s for s in series}
    assert set(by_source) == {"torch_host", "torch_memory"}  # CPU only: no device graph
    host = by_source["torch_host"]
    assert {k: v for k, v in host.labels.items() if k != "session_id"} == {
        "__name__": "wall",
        "service_name": "torch-trainer",
        "run_id": "run-t",
        "host": "cpu-a",
        "trigger": "programmatic",
        "profile_source": "torch_host",
    }
    record = _session(store)
    assert host.labels["session_id"] == record.id
    assert (record.kind, record.requester, record.status) == ("torch_trace", "sdk", "done")
    (name,) = record.targets[0].files
    # What Pyroscope holds is the stored trace's own conversion, frame for frame.
    with store.local_file(record.id, name) as path:
        graphs = trace_flamegraphs(path)
    local = graphs["torch_host"]
    assert sum(host.folded().values()) == local.root.total
    stacks = host.folded()
    assert any("ProfilerStep" in s.split(";") and s.endswith("aten::addmm") for s in stacks)
    memory = by_source["torch_memory"]
    assert memory.sample_types == [("alloc_space", "bytes")]
    assert sum(memory.folded().values()) == graphs["torch_memory"].root.total > 0
    # The artifacts beside the trace, and the report through the report worker.
    artifacts = {a["profile_source"]: a for a in record.artifacts if a["kind"] == "flamegraph"}
    assert {a["push"]["status"] for a in artifacts.values()} == {"ok"}
    assert record.report is not None and record.report["status"] in ("OPTIMAL", "NEEDS_ATTENTION")
    answer = httpx.get(f"{url}/api/v1/sessions/{record.id}/report", timeout=30)
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["facts"]["capture_format"] == "torch_trace"
    assert report["facts"]["steps"]["count"] == 6
    worded = " ".join(f[k] for f in report["findings"] for k in ("title", "detail", "suggestion"))
    assert FOREIGN.findall(worded + report["summary"]) == []
    assert list((shared / schema.TORCH_TRACES_DIR).iterdir()) == []  # taken, once


def test_a_tensorboard_handler_trace_and_a_planted_fifo(
    sidecar: tuple[str, Path, SessionStore, PyroscopeReceiver], tmp_path: Path
) -> None:
    """A trace written in place with no identity is taken once settled; a FIFO under a
    trace's name beside it neither wedges the loop nor stops the trace."""
    _, shared, store, receiver = sidecar
    made = tmp_path / "made"
    subprocess.run([sys.executable, str(WORKLOAD), str(made)], check=True, timeout=300)
    (trace,) = (made / schema.TORCH_TRACES_DIR).glob("*.pt.trace.json")
    directory = shared / schema.TORCH_TRACES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    os.mkfifo(directory / "planted.pt.trace.json")
    target = directory / "cpu-b_77.1790000000000000000.pt.trace.json"
    shutil.copy(trace, target)
    os.utime(target, (0, 0))  # written long ago: settled at the second sight
    series = receiver.wait_for(2, timeout=240)
    assert {s.labels["profile_source"] for s in series} == {"torch_host", "torch_memory"}
    record = _session(store, done=False)
    assert record.requester == "tensorboard_trace_handler"
    assert record.targets[0].host == "cpu-b_77"
    state = json.loads((shared / schema.SIDECAR_DIR / "torch-traces.json").read_text())
    assert "not a regular file" in state["failed"]["planted.pt.trace.json"]
