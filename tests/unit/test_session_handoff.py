"""The session processor hands a session on (``on_processed``) once it is done with it:
processed, or given up on, so the report worker takes back a report the session child
did not make (exporter.pipeline.processing)."""

from __future__ import annotations

import time
from pathlib import Path

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.pipeline.processing import SessionProcessor
from exporter.profiles.flamegraph import FlameGraph


class FailingStore(SessionStore):
    """A store whose record writes after processing always fail (a bucket down)."""

    def write_record(self, record: SessionRecord) -> None:
        if record.processed is not None:
            raise OSError("503 Service Unavailable")
        super().write_record(record)


def _store(kind: type[SessionStore] = SessionStore) -> SessionStore:
    store = kind(f"memory://handoff-{time.monotonic_ns()}")
    target = TargetResult(address="x:1", host="vm", status="ok", files=["vm.xplane.pb"])
    store.write_record(SessionRecord(id="s1", status="done", targets=[target]))
    store.write_file("s1", "vm.xplane.pb", b"capture")
    return store


def _convert(path: Path) -> dict[str, FlameGraph]:
    return {"xprof_host": FlameGraph.from_folded("main;step 10\n")}


def test_a_processed_session_is_handed_on_and_no_longer_pending() -> None:
    processor = SessionProcessor(_store(), _convert)
    handed: list[tuple[str, bool]] = []
    processor.on_processed.append(lambda r: handed.append((r.id, processor.pending(r.id))))
    record = processor.store.read_record("s1")
    assert record is not None
    processor(record).result(timeout=60)  # type: ignore[union-attr]
    assert handed == [("s1", False)]


def test_a_session_given_up_on_is_handed_on_too() -> None:
    # Its report waited for the processor (ReportWorker.deferred): without the hand-off
    # it would wait until the sidecar restarts.
    processor = SessionProcessor(_store(FailingStore), _convert, retry_delays_s=())
    handed: list[str] = []
    processor.on_processed.append(lambda r: handed.append(r.id))
    record = processor.store.read_record("s1")
    assert record is not None
    processor(record).result(timeout=60)  # type: ignore[union-attr]
    assert processor.given_up == 1 and handed == ["s1"] and not processor.pending("s1")
