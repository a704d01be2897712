"""Session processing: a push that raises is recorded in its artifact, not fatal."""

from __future__ import annotations

import time
from pathlib import Path

from exporter.capture.processing import SessionProcessor
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.profiles.flamegraph import FlameGraph


def _graph(path: Path) -> dict[str, FlameGraph]:
    assert path.read_bytes() == b"capture"
    return {"xprof_host": FlameGraph.from_folded("main;step 10\nmain;load 5\n")}


def test_a_push_refusing_the_labels_is_recorded_and_the_session_still_processed() -> None:
    store = SessionStore(f"memory://processing-{time.monotonic_ns()}")
    pushed: list[dict[str, str]] = []
    # A workload-written record (programmatic) may carry a trigger Pyroscope labels refuse.
    record = SessionRecord(
        id="warmup-1",
        status="done",
        trigger="nightly build",
        targets=[TargetResult(address="local", host="vm", status="ok", files=["vm.xplane.pb"])],
    )
    store.write_record(record)
    store.write_file(record.id, "vm.xplane.pb", b"capture")
    processor = SessionProcessor(store, _graph, lambda graph, labels: pushed.append(labels))

    processed = processor.process(record.id)

    assert processed is not None and processed.processed is not None
    stored = store.read_record(record.id)
    assert stored is not None and stored.processed is not None
    [artifact] = stored.artifacts
    assert artifact["file"] == "vm.xprof_host.pb.gz"  # the pprof file is still written
    assert artifact["push"]["status"] == "rejected"
    assert "trigger='nightly build'" in artifact["push"]["message"]
    assert pushed == []
    assert "vm.xprof_host.pb.gz" in store.files(record.id)
