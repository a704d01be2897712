"""The capture engine when the session store fails: sessions end and targets are freed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from exporter.capture.alerts import AlertmanagerPayload, AlertPolicy, AlertPolicyConfig
from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRequest, CaptureStoreError
from exporter.capture.session import SessionRecord
from exporter.capture.store import SessionStore
from exporter.capture.targets import ProfilerTarget
from tests.harness import free_port


class FlakyStore(SessionStore):
    """A real memory:// store whose record writes fail after ``good_writes`` succeeded."""

    def __init__(self, good_writes: int) -> None:
        super().__init__(f"memory://engine-{time.monotonic_ns()}")
        self.good_writes = good_writes
        self.writes = 0

    def write_record(self, record: SessionRecord) -> None:
        self.writes += 1
        if self.writes > self.good_writes:
            raise OSError(28, "No space left on device")
        super().write_record(record)


def _dead_target() -> ProfilerTarget:
    # Nobody listens there: the capture ends at once as "unreachable", no profiler needed.
    return ProfilerTarget(f"127.0.0.1:{free_port()}", "h0", "run-a", "static")


def test_a_store_that_refuses_the_new_record_leaves_nothing_reserved(tmp_path: Path) -> None:
    engine = CaptureEngine(FlakyStore(good_writes=0), tmp_path, CaptureLimits(timeout_s=1))
    target = _dead_target()
    try:
        with pytest.raises(CaptureStoreError, match="cannot write its record into the store"):
            engine.submit(CaptureRequest(duration_ms=100, name="first"), [target])
        assert not engine.busy(target)
        assert engine.reserve(target, "ring")  # free for anyone else
    finally:
        engine.close()


def test_a_store_failing_during_the_capture_still_ends_the_session(tmp_path: Path) -> None:
    store = FlakyStore(good_writes=1)  # the submit's "running" record only
    engine = CaptureEngine(store, tmp_path, CaptureLimits(timeout_s=1))
    finished: list[str] = []
    engine.on_complete.append(lambda record: finished.append(record.status))
    target = _dead_target()
    try:
        submitted = engine.submit(CaptureRequest(duration_ms=100), [target])
        record = engine.wait(submitted.id, timeout=60)
        assert record is not None and record.status == "failed", record
        assert record.targets[0].status == "unreachable"
        assert not engine.get_live(submitted.id)
        assert not engine.busy(target)
        assert finished == ["failed"]
        # The store still says "running"; the engine answers with what really happened.
        stored = store.read_record(submitted.id)
        assert stored is not None and stored.status == "running"
    finally:
        engine.close()


def test_store_failures_do_not_use_up_the_alert_capture_limit(tmp_path: Path) -> None:
    store = FlakyStore(good_writes=10**9)
    engine = CaptureEngine(store, tmp_path, CaptureLimits(timeout_s=1))
    target = _dead_target()

    class Targets:
        def select(self, run_id: str | None = None, hosts: object = None) -> list[ProfilerTarget]:
            return [target]

    policy = AlertPolicy(Targets(), engine, AlertPolicyConfig(cooldown_s=0, max_concurrent=1))

    def fire(fingerprint: str) -> str:
        payload = AlertmanagerPayload.model_validate({
            "status": "firing",
            "alerts": [{
                "status": "firing",
                "fingerprint": fingerprint,
                "labels": {"alertname": "Slow", "run_id": "run-a", "mlprof_action": "capture"},
            }],
        })  # fmt: skip
        [outcome] = policy.handle(payload).outcomes
        if outcome.session_id:
            engine.wait(outcome.session_id, timeout=60)
        return outcome.outcome

    try:
        store.good_writes = store.writes + 1  # each session's final record is refused
        assert fire("fp1") == "started"
        store.good_writes = store.writes + 1
        assert fire("fp2") == "started"  # not "limit": the first session is over
        assert policy.running() == []
        store.good_writes = store.writes  # now the new record itself is refused
        assert fire("fp3") == "failed"
        assert not engine.busy(target)
        store.good_writes = 10**9
        assert fire("fp4") == "started"
    finally:
        engine.close()


def test_a_snapshot_without_a_kept_one_says_it_became_a_trace(tmp_path: Path) -> None:
    import click
    from click.testing import CliRunner

    from exporter.cli_capture import _report

    engine = CaptureEngine(
        SessionStore(f"memory://snap-{time.monotonic_ns()}"), tmp_path, CaptureLimits(timeout_s=1)
    )
    target = _dead_target()
    try:
        submitted = engine.submit(CaptureRequest(kind="snapshot", duration_ms=100), [target])
        record = engine.wait(submitted.id, timeout=60)
    finally:
        engine.close()
    assert record is not None
    [result] = record.targets
    assert result.mode == "trace"
    assert result.note.startswith(f"no snapshot kept for {target.address}")
    assert "trace was taken instead" in result.note
    stored = engine.store.read_record(submitted.id)
    assert stored is not None and stored.targets[0].note == result.note  # in the record too
    shown = record.model_dump(mode="json")
    printed = CliRunner().invoke(click.command()(lambda: _report(shown, False)))
    assert f"note: {result.note}" in printed.output  # `mlprof capture` prints it


def test_a_restart_removes_the_captures_a_killed_sidecar_left_staged(tmp_path: Path) -> None:
    import asyncio

    from exporter.capture.session import TargetResult
    from exporter.sidecar import Sidecar
    from tests.sidecar_app import settings_in

    settings = settings_in(tmp_path)
    logdir = settings.shared_dir / "captures"
    staged = logdir / "plugins" / "profile"
    store = SessionStore(settings.store)

    def stage(name: str, *files: str) -> Path:
        (staged / name).mkdir(parents=True)
        for file in files:
            (staged / name / file).write_bytes(b"x" * 1000)
        return staged / name

    # kill -9 during a capture: the record says running, the trace stays in the shared dir.
    running = TargetResult(address="h:1", host="h", status="running")
    store.write_record(SessionRecord(id="killed", targets=[running]))
    stage("killed", "h_1.xplane.pb")
    stage("sdk-writing", "vm.xplane.pb")  # programmatic, no record yet: the SDK's
    stage("sdk-done", "vm.xplane.pb", "session.json")  # programmatic, for the watcher
    kept = TargetResult(address="h:1", host="h", status="ok", unimported=["h_1.xplane.pb"])
    store.write_record(SessionRecord(id="retry", status="done", targets=[kept]))
    stage("retry", "h_1.xplane.pb", "session.json")  # kept for the import to be retried
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("mine")
    store.write_record(SessionRecord(id="linked", status="done"))
    (staged / "linked").symlink_to(outside)  # planted: never followed
    ring = logdir / ".ring" / "plugins" / "profile" / "w1"
    ring.mkdir(parents=True)
    (ring / "h_1.xplane.pb").write_bytes(b"x" * 1000)  # a ring window: none survives a restart

    sidecar = Sidecar(settings)

    async def start_and_stop() -> None:
        await sidecar.start()
        await sidecar.stop()

    asyncio.run(start_and_stop())
    assert sorted(p.name for p in staged.iterdir()) == [
        "linked",
        "retry",
        "sdk-done",
        "sdk-writing",
    ]
    assert not (logdir / ".ring").exists()
    assert (outside / "precious").read_text() == "mine"
