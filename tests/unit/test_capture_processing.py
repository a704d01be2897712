"""Session processing: a push that raises is recorded in its artifact, not fatal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.pipeline.processing import SessionProcessor
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


def test_each_graph_is_pushed_with_the_sessions_labels() -> None:
    store = SessionStore(f"memory://processing-{time.monotonic_ns()}")
    pushed: list[dict[str, str]] = []
    record = SessionRecord(
        id="s-1",
        status="done",
        trigger="alert",
        run_id="r1",
        workload="trainer",
        targets=[
            TargetResult(
                address="h:9999", host="h", run_id="r1", status="ok", files=["h.xplane.pb"]
            )
        ],
    )
    store.write_record(record)
    store.write_file(record.id, "h.xplane.pb", b"capture")
    processor = SessionProcessor(store, _graph, lambda graph, labels: pushed.append(labels))

    processor.process(record.id)

    assert pushed == [
        {
            "service_name": "trainer",
            "run_id": "r1",
            "host": "h",
            "trigger": "alert",
            "profile_source": "xprof_host",
            "session_id": "s-1",
        }
    ]


def _staircase_capture(n: int) -> bytes:
    """A host thread of ``n`` events, each starting inside the previous and outliving it."""
    from exporter.proto import xplane_pb2
    from tests.xspace_builder import PlaneBuilder

    space = xplane_pb2.XSpace()
    plane = PlaneBuilder(space, "/host:CPU")
    line = plane.line("python3", line_id=1)
    for i in range(n):
        plane.event(line, f"op{i}", i, n)  # starts at i ns, lasts n ns
    return bytes(space.SerializeToString())


def _session(store: SessionStore, session_id: str, capture: bytes, **extra: object) -> None:
    record = SessionRecord(
        id=session_id,
        status="done",
        targets=[TargetResult(address="local", host="vm", status="ok", files=["vm.xplane.pb"])],
        **extra,  # type: ignore[arg-type]
    )
    store.write_record(record)
    store.write_file(session_id, "vm.xplane.pb", capture)


def test_a_staircase_capture_converts_in_the_bounded_child_with_exact_totals() -> None:
    # 10,000 staircase events (316 KB planted as a session drove the sidecar to 8 GB and
    # an OOM kill at every restart). Converted in a child bounded to 1 GiB: the host
    # graph's total is the thread's busy time, the pprof written beside the capture.
    from exporter.pipeline.processing import bounded_flamegraphs

    n = 10_000
    store = SessionStore(f"memory://staircase-{time.monotonic_ns()}")
    _session(store, "stairs-1", _staircase_capture(n))
    processor = SessionProcessor(store, bounded_flamegraphs(120, 1024))
    processed = processor.process("stairs-1")
    assert processed is not None and processed.processed is not None
    [artifact] = processed.artifacts
    assert artifact.get("error") is None, artifact
    assert artifact["profile_source"] == "xprof_host"
    assert artifact["total"] == (2 * n - 1)  # ns: busy from 0 to 2n - 1
    assert "conversion_starts" not in (processed.model_extra or {})
    assert artifact["nodes"] <= 4 * n  # linear: the quadratic rule made 50M segments
    from exporter.profiles.pprof import decode_pprof, from_pprof

    data = store.fs.cat_file(f"{store.session_dir('stairs-1')}/vm.xprof_host.pb.gz")
    graph = from_pprof(decode_pprof(data))
    assert graph.root.total == 2 * n - 1
    graph.check()  # total = self + children everywhere


def test_a_capture_the_child_cannot_convert_is_recorded_once_not_retried() -> None:
    from exporter.pipeline.processing import bounded_flamegraphs

    store = SessionStore(f"memory://bad-capture-{time.monotonic_ns()}")
    _session(store, "bad-1", b"\x08\x96\x01 not an xspace")
    processed = SessionProcessor(store, bounded_flamegraphs(60, 1024)).process("bad-1")
    assert processed is not None and processed.processed is not None
    [artifact] = processed.artifacts
    assert artifact["error"].startswith("cannot convert: ")
    assert "\n" not in artifact["error"] and "Traceback" not in artifact["error"]


def test_a_session_whose_conversion_never_finished_is_given_up() -> None:
    # A conversion that took the sidecar down at each of 3 starts: the 4th start records
    # why and marks the session processed instead of converting it again.
    calls: list[Path] = []

    def convert(path: Path) -> dict[str, FlameGraph]:
        calls.append(path)
        return {}

    store = SessionStore(f"memory://interrupted-{time.monotonic_ns()}")
    _session(store, "loop-1", b"capture", conversion_starts=2)
    first = SessionProcessor(store, convert).process("loop-1")
    assert first is not None and first.processed is not None and len(calls) == 1
    assert "conversion_starts" not in (first.model_extra or {})  # finished: forgotten
    _session(store, "loop-2", b"capture", conversion_starts=3)
    given_up = SessionProcessor(store, convert).process("loop-2")
    assert len(calls) == 1
    assert given_up is not None and given_up.processed is not None
    [artifact] = given_up.artifacts
    assert "started 3 times without finishing" in artifact["error"]


class _Killed(BaseException):
    """Stands for kill -9: nothing after it runs (no except Exception catches it)."""


def test_a_push_delivered_before_a_kill_is_not_sent_again_after_the_restart() -> None:
    store = SessionStore(f"memory://pushed-{time.monotonic_ns()}")
    _session(store, "s1", b"capture")

    def two_graphs(path: Path) -> dict[str, FlameGraph]:
        return {
            "xprof_host": FlameGraph.from_folded("main;step 10\n"),
            "xprof_device": FlameGraph.from_folded("jit_step;dot 7\n"),
        }

    delivered: list[int] = []

    def push_then_die(graph: FlameGraph, labels: dict[str, str]) -> str:
        delivered.append(graph.root.total)
        if len(delivered) == 2:
            raise _Killed  # the sidecar dies with the second push in flight
        return "ok"

    first = SessionProcessor(store, two_graphs, push_then_die)
    with pytest.raises(_Killed):
        first.process("s1")
    stored = store.read_record("s1")
    assert stored is not None and stored.processed is None  # the restart processes it again
    assert delivered == [10, 7]

    again: list[FlameGraph] = []
    restarted = SessionProcessor(
        store, two_graphs, lambda graph, labels: again.append(graph) or "ok"
    )
    processed = restarted.process("s1")
    assert processed is not None and processed.processed is not None
    # Before: both graphs pushed again, the first one delivered twice.
    assert [g.root.total for g in again] == [7]  # only the one whose push never finished
    pushes = {a["profile_source"]: a["push"] for a in processed.artifacts}
    assert pushes["xprof_host"]["message"] == "pushed before the sidecar restarted; not sent again"
    assert pushes["xprof_device"]["status"] == "ok"
    assert "pushed" not in (processed.model_extra or {})  # the note goes once processed
