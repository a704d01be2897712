"""The session watcher: programmatic sessions imported, orphans failed, hooks called once."""

from __future__ import annotations

import time
from pathlib import Path

from exporter.capture.session import SessionRecord, TargetResult, utcnow
from exporter.capture.store import SessionStore
from exporter.capture.watcher import SessionWatcher


def _programmatic(logdir: Path, session_id: str, status: str) -> Path:
    directory = logdir / "plugins" / "profile" / session_id
    directory.mkdir(parents=True)
    (directory / "vm.xplane.pb").write_bytes(b"\x0a\x00" * 50)
    record = SessionRecord(
        id=session_id,
        status=status,  # type: ignore[arg-type]
        trigger="programmatic",
        requester="sdk",
        run_id="r1",
        targets=[TargetResult(address="local", host="vm", status="ok", files=["vm.xplane.pb"])],
    )
    (directory / "session.json").write_text(record.model_dump_json())
    return directory


def test_finished_programmatic_sessions_move_into_the_store_and_reach_the_hooks(
    tmp_path: Path,
) -> None:
    store = SessionStore(f"memory://watcher-{time.monotonic_ns()}")
    watcher = SessionWatcher(store, tmp_path)
    seen: list[str] = []
    watcher.on_complete.append(lambda record: seen.append(record.id))
    done = _programmatic(tmp_path, "warmup-1", "done")
    still_running = _programmatic(tmp_path, "warmup-2", "running")
    (tmp_path / "plugins" / "profile" / "not a session id").mkdir()

    watcher.poll()
    assert store.session_ids() == ["warmup-1"]
    assert store.files("warmup-1")["vm.xplane.pb"] == 100
    assert not done.exists() and still_running.exists()
    assert seen == ["warmup-1"]

    watcher.poll()  # once only
    assert seen == ["warmup-1"]


def _finished(session_id: str) -> SessionRecord:
    return SessionRecord(
        id=session_id,
        status="done",
        processed=utcnow(),
        targets=[TargetResult(address="x:1", host="x", status="ok")],
    )


def test_a_programmatic_record_cannot_name_another_session_or_outside_files(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path / "store")
    victim = _finished("s-victim").model_copy(update={"report": {"status": "OPTIMAL"}})
    store.write_record(victim)
    directory = _programmatic(tmp_path / "logdir", "warmup-1", "done")
    forged = SessionRecord.model_validate_json((directory / "session.json").read_bytes())
    forged.id = "s-victim"
    forged.targets[0].files = ["vm.xplane.pb", "../../../../etc/passwd", "other.xplane.pb"]
    (directory / "session.json").write_text(forged.model_dump_json())
    watcher = SessionWatcher(store, tmp_path / "logdir")
    handed: list[SessionRecord] = []
    watcher.on_complete.append(handed.append)

    watcher.poll()
    assert store.read_record("s-victim") == victim  # untouched
    imported = store.read_record("warmup-1")
    assert imported is not None and imported.id == "warmup-1"
    assert imported.targets[0].files == ["vm.xplane.pb"]  # only what the directory held
    assert [r.id for r in handed] == ["warmup-1"]


def test_a_programmatic_session_cannot_replace_a_finished_session(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "store")
    victim = _finished("s-victim")
    store.write_record(victim)
    directory = _programmatic(tmp_path / "logdir", "s-victim", "done")
    SessionWatcher(store, tmp_path / "logdir").poll()
    assert store.read_record("s-victim") == victim
    assert "vm.xplane.pb" not in store.files("s-victim")
    assert directory.is_dir()  # left where it is, not deleted


def test_sessions_left_running_by_a_previous_sidecar_are_failed_on_start(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "store")
    orphan = SessionRecord(
        id="s-orphan",
        targets=[
            TargetResult(address="10.0.0.1:9999", host="a", status="ok", files=["a.xplane.pb"]),
            TargetResult(address="10.0.0.2:9999", host="b"),
        ],
    )
    store.write_record(orphan)
    live = SessionRecord(id="s-live", targets=[TargetResult(address="x:1", host="x")])
    store.write_record(live)
    watcher = SessionWatcher(store, tmp_path / "logdir", running=lambda sid: sid == "s-live")
    handed: list[str] = []
    watcher.on_complete.append(lambda record: handed.append(record.id))
    watcher.poll()
    record = store.read_record("s-orphan")
    assert record is not None and record.status == "partial"
    assert record.targets[1].status == "failed"
    assert record.targets[1].error == "the sidecar stopped during the capture"
    assert handed == ["s-orphan"]  # its good capture still gets converted
    live_record = store.read_record("s-live")
    assert live_record is not None and live_record.status == "running"


def test_session_hooks_run_once_per_session_and_survive_a_failing_hook() -> None:
    from exporter.pipeline.service import SessionHooks

    hooks = SessionHooks(remember=2)
    calls: list[str] = []

    def broken(record: SessionRecord) -> None:
        raise RuntimeError("boom")

    hooks.add(broken)
    hooks.add(lambda record: calls.append(record.id))
    hooks(SessionRecord(id="a", status="running"))
    for session_id in ["a", "a", "b", "a"]:
        hooks(SessionRecord(id=session_id, status="done"))
    assert calls == ["a", "b"]


def test_a_session_a_restart_left_without_its_report_is_handed_over_again(
    tmp_path: Path,
) -> None:
    """Flame graphs were made, the queued report was lost with the old sidecar."""
    from datetime import timedelta

    from exporter.pipeline.worker import ReportWorker

    store = SessionStore(tmp_path / "store")
    store.write_record(_finished("s-unreported"))
    store.write_record(_finished("s-reported").model_copy(update={"report": {"status": "OPTIMAL"}}))
    old = _finished("s-old").model_copy(update={"created": utcnow() - timedelta(days=3)})
    store.write_record(old)
    worker = ReportWorker(store)
    queued: list[str] = []
    watcher = SessionWatcher(store, tmp_path / "logdir")
    watcher.on_complete.append(lambda r: worker(r) and queued.append(r.id))
    try:
        watcher.poll()
        assert queued == ["s-unreported"]  # reported: done; three days old: on request only
        assert worker(old, on_request=True) is not None
    finally:
        worker.close()
