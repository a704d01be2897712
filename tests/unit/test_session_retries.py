"""Session processing that raised is retried (bounded); remembered ids stay bounded."""

from __future__ import annotations

import time
from pathlib import Path

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.capture.watcher import SessionWatcher
from exporter.pipeline.processing import SessionProcessor
from exporter.profiles.flamegraph import FlameGraph
from tests.harness import wait_until

RETRY_S = (0.05, 0.05)  # the shipped delays are 30 s, 2 min, 10 min


def _store_with(*session_ids: str, kind: type[SessionStore] = SessionStore) -> SessionStore:
    store = kind(f"memory://retries-{time.monotonic_ns()}")
    for session_id in session_ids:
        store.write_record(
            SessionRecord(
                id=session_id,
                status="done",
                targets=[
                    TargetResult(address="x:1", host="vm", status="ok", files=["vm.xplane.pb"])
                ],
            )
        )
        store.write_file(session_id, "vm.xplane.pb", b"capture")
    return store


class CountingConverter:
    """A converter that counts its calls (one per processing attempt here)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> dict[str, FlameGraph]:
        self.calls += 1
        return {"xprof_host": FlameGraph.from_folded("main;step 10\n")}


class FlakyStore(SessionStore):
    """A store whose record writes fail the first ``failures`` times (gs:// hiccups)."""

    failures = 0

    def write_record(self, record: SessionRecord) -> None:
        if record.processed is not None and self.failures > 0:
            self.failures -= 1
            raise OSError("503 Service Unavailable")
        super().write_record(record)


def test_a_session_whose_processing_raised_is_processed_on_a_retry() -> None:
    store = _store_with("s1", kind=FlakyStore)
    assert isinstance(store, FlakyStore)
    store.failures = 1
    processor = SessionProcessor(store, CountingConverter(), retry_delays_s=RETRY_S)
    try:
        processor(store.read_record("s1"))  # type: ignore[arg-type]
        wait_until(
            lambda: (r := store.read_record("s1")) is not None and r.processed is not None,
            timeout=10,
            what="the session to be processed on a retry (it used to wait for a restart)",
        )
        record = store.read_record("s1")
        assert record is not None
        assert [a.get("profile_source") for a in record.artifacts] == ["xprof_host"]
        assert processor._pending == {}  # nothing remembered once done
    finally:
        processor.close()


def test_retries_are_bounded_and_then_given_up() -> None:
    store = _store_with("s1", kind=FlakyStore)
    assert isinstance(store, FlakyStore)
    store.failures = 100  # the store never comes back
    converter = CountingConverter()
    processor = SessionProcessor(store, converter, retry_delays_s=RETRY_S)
    try:
        processor(store.read_record("s1"))  # type: ignore[arg-type]
        wait_until(lambda: processor.given_up == 1, timeout=10, what="the retries to give up")
        assert converter.calls == 1 + len(RETRY_S)
        assert processor._pending == {}
        record = store.read_record("s1")
        assert record is not None and record.processed is None  # left for the next restart
    finally:
        processor.close()


def test_the_watcher_forgets_sessions_retention_deleted() -> None:
    store = _store_with("a", "b", "c")
    watcher = SessionWatcher(store, Path("/nonexistent-logdir"))
    watcher.poll()
    assert watcher._settled == {"a", "b", "c"}
    store.delete("a")  # retention
    watcher.poll()
    assert watcher._settled == {"b", "c"}
