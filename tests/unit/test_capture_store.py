"""Session ids, the session store (memory:// and local), retention, and request checks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRejected, CaptureRequest
from exporter.capture.session import SessionRecord, TargetResult, check_session_id, new_session_id
from exporter.capture.store import SessionStore
from exporter.capture.targets import ProfilerTarget
from exporter.errors import ConfigError

BAD_IDS = ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "a..b", "x" * 129, "a b", "é", "-x"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_session_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="expected 1-128 characters"):
        check_session_id(bad)


def test_generated_ids_are_valid_unique_and_carry_the_name() -> None:
    ids = {new_session_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(check_session_id(i) for i in ids)
    named = new_session_id("x" * 128)
    assert len(named) <= 128 and named.startswith("xxx")
    with pytest.raises(ValueError):
        new_session_id("../up")


def _store(tmp_path: Path | None = None) -> SessionStore:
    return SessionStore(str(tmp_path) if tmp_path else f"memory://unit-{time.monotonic_ns()}")


def _record(session_id: str, status: str = "done") -> SessionRecord:
    return SessionRecord(
        id=session_id,
        status=status,  # type: ignore[arg-type]
        targets=[TargetResult(address="10.0.0.1:9999", host="h0", status="ok")],
    )


@pytest.mark.parametrize("where", ["memory", "local"])
def test_records_and_files_round_trip(where: str, tmp_path: Path) -> None:
    store = _store(tmp_path / "store" if where == "local" else None)
    record = _record("s1")
    store.write_record(record)
    assert store.read_record("s1") == record
    capture = tmp_path / "h0_9999.xplane.pb"
    capture.write_bytes(b"x" * 100)
    assert store.import_file("s1", capture) == 100
    assert not capture.exists()  # moved, not copied
    assert store.files("s1") == {"session.json": store.files("s1")["session.json"],
                                 "h0_9999.xplane.pb": 100}  # fmt: skip
    with store.local_file("s1", "h0_9999.xplane.pb") as path:
        assert path.read_bytes() == b"x" * 100
    assert store.session_ids() == ["s1"]
    assert store.read_record("missing") is None
    assert store.read_record("../s1") is None


def test_local_store_is_xprof_layout_and_refuses_escapes(tmp_path: Path) -> None:
    store = SessionStore(f"file://{tmp_path}")
    store.write_record(_record("abc"))
    assert (tmp_path / "plugins" / "profile" / "abc" / "session.json").is_file()
    (tmp_path / "plugins" / "profile" / "link").symlink_to(tmp_path.parent)
    with pytest.raises(ValueError, match="outside the store"):
        store.session_dir("link")
    for bad in ("..", "../abc", "a/b"):
        with pytest.raises(ValueError):
            store.session_dir(bad)
    with pytest.raises(ValueError, match="plain name"):
        store.write_file("abc", "../x.pb", b"")


@pytest.mark.parametrize("where", ["memory", "local"])
@pytest.mark.parametrize("name", ["../../x.xplane.pb", "../abc/session.json", "/etc/hostname",
                                  "sub/x.xplane.pb", ".hidden", "..", ""])  # fmt: skip
def test_session_file_names_from_a_record_cannot_escape(
    where: str, name: str, tmp_path: Path
) -> None:
    store = _store(tmp_path / "store" if where == "local" else None)
    store.write_record(_record("abc"))
    (tmp_path / "x.xplane.pb").write_bytes(b"outside")
    with pytest.raises(ValueError, match="plain name"), store.local_file("abc", name) as path:
        raise AssertionError(f"{name!r} gave {path}")  # never reached


def test_unknown_store_scheme_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="MLPROF_STORE='nope://x'"):
        SessionStore("nope://x")


def test_retention_deletes_oldest_finished_sessions_first(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for index in range(5):
        record = _record(f"s{index}", "running" if index == 0 else "done")
        record.processed = record.created
        store.write_record(record)
        store.write_file(record.id, "h.xplane.pb", b"x" * 1000)
        time.sleep(0.001)  # distinct creation times
    assert store.enforce_retention(max_count=3, max_bytes=0) == ["s1", "s2"]
    assert store.session_ids() == ["s0", "s3", "s4"]  # a running session is never deleted
    size = sum(store.files("s4").values())
    assert store.enforce_retention(max_count=0, max_bytes=2 * size + 10) == ["s3"]
    assert store.session_ids() == ["s0", "s4"]
    assert store.enforce_retention(max_count=1, max_bytes=1) == []  # running + newest stay
    assert store.enforce_retention(0, 0) == []


def test_retention_keeps_finished_sessions_until_they_are_processed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for index in range(4):
        record = _record(f"s{index}", "failed" if index == 2 else "done")
        if index == 1:
            record.processed = record.created
        store.write_record(record)
        time.sleep(0.001)  # distinct creation times
    # s0 still waits for its flame graphs; a failed session is never processed, and goes
    # first (a burst of refused requests must not push out the history).
    assert store.enforce_retention(max_count=1, max_bytes=0) == ["s2", "s1"]
    assert store.session_ids() == ["s0", "s3"]


def _engine(**limits: int) -> CaptureEngine:
    return CaptureEngine(_store(), Path("/nonexistent"), CaptureLimits(**limits))  # type: ignore[arg-type]


def test_durations_and_levels_are_clamped_and_recorded() -> None:
    engine = _engine(max_duration_ms=1000, max_host_tracer_level=1, max_python_tracer_level=0)
    options, clamped = engine.check(
        CaptureRequest(duration_ms=5000, host_tracer_level=3, python_tracer_level=1)
    )
    assert options["duration_ms"] == 1000 and options["host_tracer_level"] == 1
    assert options["python_tracer_level"] == 0 and options["device_tracer_level"] == 1
    assert clamped == {
        "duration_ms": {"requested": 5000, "max": 1000},
        "host_tracer_level": {"requested": 3, "max": 1},
        "python_tracer_level": {"requested": 1, "max": 0},
    }


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (CaptureRequest(duration_ms=0), "duration_ms=0: expected 1..3600000"),
        (CaptureRequest(duration_ms=-1), "duration_ms=-1: expected"),
        (CaptureRequest(delay_ms=-1), "delay_ms=-1: expected 0..3600000"),
        (CaptureRequest(host_tracer_level=4), "host_tracer_level=4: expected 0..3"),
        (CaptureRequest(device_tracer_level=-1), "device_tracer_level=-1: expected 0..1"),
        (CaptureRequest(name="../x"), "session name '../x'"),
        (CaptureRequest(kind="movie"), "kind='movie'"),  # type: ignore[arg-type]
        (CaptureRequest(trigger="cron"), "trigger='cron'"),
        (CaptureRequest(duration_ms="1"), "duration_ms='1': expected an integer"),  # type: ignore[arg-type]
    ],
)
def test_bad_requests_are_rejected_naming_the_field(request_: CaptureRequest, message: str) -> None:
    engine = _engine()
    with pytest.raises(CaptureRejected, match=message.replace("(", r"\(").replace(".", r"\.")):
        engine.submit(request_, [ProfilerTarget("127.0.0.1:1", "h", None, "static")])
    assert engine.store.session_ids() == []


def test_a_request_without_targets_is_rejected() -> None:
    with pytest.raises(CaptureRejected, match="targets: expected at least one"):
        _engine().submit(CaptureRequest(), [])


def test_reservations_make_a_target_busy_until_released() -> None:
    engine = _engine()
    target = ProfilerTarget("127.0.0.1:1", "h", None, "static")
    assert not engine.busy(target)
    assert engine.reserve(target, "ring")
    assert engine.busy(target) and not engine.reserve(target, "other")
    engine.release(target, "other")  # only the holder releases
    assert engine.busy(target)
    engine.release(target, "ring")
    assert not engine.busy(target)
