"""An alert's several captures (``MLPROF_ALERT_CAPTURES``): the setting, the policy's
request, the engine's rounds and the replicates a report compares.

The engine runs against a stand-in profiler server (a TCP listener the engine's probe
reaches, and a client that writes each trace's file where XProf's server writes it);
``tests/integration/test_alert_replicates.py`` runs the real JAX profiler server.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.alerts import AlertmanagerPayload, AlertPolicy, AlertPolicyConfig
from exporter.capture.engine import (
    CaptureEngine,
    CaptureLimits,
    CaptureRejected,
    CaptureRequest,
    capture_rounds,
)
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import PROFILE_DIR, SessionStore
from exporter.capture.targets import ProfilerTarget
from exporter.cli import main
from exporter.config import MAX_ALERT_CAPTURES, load_settings
from exporter.errors import ConfigError
from exporter.pipeline.replicates import plan_replicates, replicate_specs

# -- the setting -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", str(MAX_ALERT_CAPTURES + 1), "three", "2.5"])
def test_a_bad_alert_captures_value_is_one_line_naming_the_setting(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLPROF_ALERT_CAPTURES", value)
    with pytest.raises(ConfigError) as raised:
        load_settings(None)
    message = str(raised.value)
    assert message.startswith(f"MLPROF_ALERT_CAPTURES={value!r}: "), message
    assert "\n" not in message


def test_a_bad_alert_captures_in_the_yaml_file_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "mlprof.yaml"
    config.write_text("alert_captures: 0\n")
    with pytest.raises(ConfigError, match=r"^alert_captures=0 in .*mlprof\.yaml: .*1"):
        load_settings(config)
    config.write_text("alert_captures: 4\n")
    assert load_settings(config).alert_captures == 4


def test_serve_refuses_a_bad_alert_captures_in_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLPROF_ALERT_CAPTURES", "0")
    done = CliRunner().invoke(main, ["serve", "--shared-dir", str(tmp_path / "s")])
    assert done.exit_code == 2, done.output
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "MLPROF_ALERT_CAPTURES='0'" in lines[0], done.output
    assert "Traceback" not in done.output


# -- the policy ------------------------------------------------------------------------


class _Engine:
    def __init__(self) -> None:
        self.requests: list[CaptureRequest] = []

    def submit(self, request: CaptureRequest, targets: list[ProfilerTarget]) -> Any:
        self.requests.append(request)
        return SessionRecord(id=f"s{len(self.requests)}")

    def get(self, session_id: str) -> Any:
        return None


class _Targets:
    def select(self, run_id: str | None = None, hosts: object = None) -> list[ProfilerTarget]:
        return [ProfilerTarget("10.0.0.1:9999", "worker-0", "run-a", "k8s")]


def _fire(policy: AlertPolicy, fingerprint: str, **labels: str) -> dict[str, Any]:
    body = {
        "status": "firing",
        "fingerprint": fingerprint,
        "labels": {"alertname": "Slow", "run_id": "run-a", "mlprof_action": "capture", **labels},
    }
    answer = policy.handle(AlertmanagerPayload.model_validate({"alerts": [body]}))
    return answer.as_json()["alerts"][0]  # type: ignore[no-any-return]


def test_the_policy_asks_for_the_configured_captures_and_an_alert_may_override() -> None:
    engine = _Engine()
    config = AlertPolicyConfig(cooldown_s=0, max_concurrent=100, captures=3)
    policy = AlertPolicy(_Targets(), engine, config)
    assert _fire(policy, "a")["outcome"] == "started"
    assert _fire(policy, "b", mlprof_captures="5")["outcome"] == "started"
    assert _fire(policy, "c", mlprof_action="snapshot")["outcome"] == "started"
    assert [r.captures for r in engine.requests] == [3, 5, 1]  # a snapshot is one window
    for bad, expected in (("0", "positive"), ("99", f"1..{MAX_ALERT_CAPTURES}"), ("x", "whole")):
        answer = _fire(policy, f"bad-{bad}", mlprof_captures=bad)
        assert answer["outcome"] == "invalid" and expected in answer["reason"], answer
        assert f"mlprof_captures={bad!r}" in answer["reason"]
    assert len(engine.requests) == 3


def test_settings_reach_the_policy() -> None:
    settings = load_settings(None, alert_captures=4)
    assert AlertPolicyConfig.from_settings(settings).captures == 4


# -- the engine's rounds ---------------------------------------------------------------


class _Listener:
    """Something listening where the target is: the engine's probe reaches it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()


class _Client:
    """Writes each trace where XProf's server does: ``<logdir>/plugins/profile/<session>/
    <host>_<port>.xplane.pb``; fails the traces numbered in ``fail``."""

    def __init__(self, fail: set[int] | None = None) -> None:
        self.calls: list[tuple[int, int]] = []  # (duration_ms, delay_ms)
        self.fail = fail or set()

    def trace(
        self, address: str, logdir: str, duration_ms: int, options: Mapping[str, Any]
    ) -> None:
        self.calls.append((duration_ms, options["delay_ms"]))
        if len(self.calls) in self.fail:
            raise RuntimeError("UNAVAILABLE: another session")
        host, port = address.rsplit(":", 1)
        staging = Path(logdir) / PROFILE_DIR / options["session_id"]
        staging.mkdir(parents=True, exist_ok=True)
        (staging / f"{host}_{port}.xplane.pb").write_bytes(b"capture %d" % len(self.calls))

    def start_continuous(self, address: str, options: Mapping[str, Any]) -> None: ...

    def get_snapshot(self, address: str, logdir: str) -> None: ...

    def stop_continuous(self, address: str) -> None: ...


@pytest.fixture
def listener() -> Iterator[_Listener]:
    found = _Listener()
    yield found
    found.sock.close()


def _engine(tmp_path: Path, client: _Client) -> CaptureEngine:
    store = SessionStore(str(tmp_path / "store"))
    return CaptureEngine(store, tmp_path / "logdir", CaptureLimits(timeout_s=30), client)


def _capture(
    tmp_path: Path, client: _Client, target: ProfilerTarget, request: CaptureRequest
) -> SessionRecord:
    """One session of ``request`` on ``target``, run to its end: its final record."""
    engine = _engine(tmp_path, client)
    try:
        record = engine.wait(engine.submit(request, [target]).id, timeout=60)
    finally:
        engine.close()
    assert record is not None
    return record


def test_a_session_of_three_captures_takes_them_in_turn_and_names_each(
    tmp_path: Path, listener: _Listener
) -> None:
    client = _Client()
    target = ProfilerTarget(listener.address, "worker-0", "run-a", "static")
    request = CaptureRequest(duration_ms=3000, delay_ms=500, captures=3, trigger="alert")
    record = _capture(tmp_path, client, target, request)
    assert record.status == "done", record
    # The duration is split; the delay comes before the first capture only.
    assert client.calls == [(1000, 500), (1000, 0), (1000, 0)]
    assert record.options["captures"] == 3 and record.options["duration_ms"] == 3000
    stem = target.file_stem()
    names = [f"{stem}.r{i}.xplane.pb" for i in (1, 2, 3)]
    assert record.targets[0].files == names
    assert capture_rounds(record) == [[n] for n in names]
    stored = Path(SessionStore(str(tmp_path / "store")).session_dir(record.id))
    assert [(stored / n).read_bytes() for n in names] == [b"capture 1", b"capture 2", b"capture 3"]


def test_one_capture_keeps_the_name_and_options_it_always_had(
    tmp_path: Path, listener: _Listener
) -> None:
    target = ProfilerTarget(listener.address, "worker-0", "run-a", "static")
    record = _capture(tmp_path, _Client(), target, CaptureRequest(duration_ms=100))
    assert record.status == "done"
    assert "captures" not in record.options
    assert record.targets[0].files == [f"{target.file_stem()}.xplane.pb"]
    assert capture_rounds(record) == []


def test_a_failed_later_capture_keeps_the_earlier_ones_and_says_so(
    tmp_path: Path, listener: _Listener
) -> None:
    target = ProfilerTarget(listener.address, "worker-0", "run-a", "static")
    record = _capture(
        tmp_path, _Client(fail={2}), target, CaptureRequest(duration_ms=900, captures=3)
    )
    assert record.status == "done"
    [result] = record.targets
    assert result.files == [f"{target.file_stem()}.r1.xplane.pb"]
    assert "1 of 3 captures taken; capture 2:" in result.note
    assert "UNAVAILABLE" in result.note


def test_a_failed_first_capture_is_the_target_failure(tmp_path: Path, listener: _Listener) -> None:
    target = ProfilerTarget(listener.address, "worker-0", "run-a", "static")
    record = _capture(
        tmp_path, _Client(fail={1}), target, CaptureRequest(duration_ms=900, captures=3)
    )
    assert record.status == "failed"
    assert record.targets[0].status in ("busy", "failed") and not record.targets[0].files


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (CaptureRequest(captures=0), "captures=0: expected 1..16"),
        (CaptureRequest(captures=17), "captures=17: expected 1..16"),
        (CaptureRequest(captures=True), "captures=True: expected an integer"),
        (CaptureRequest(kind="snapshot", captures=2), "only a trace takes several"),
    ],
)
def test_bad_capture_counts_are_refused_naming_the_field(
    tmp_path: Path, request_: CaptureRequest, expected: str
) -> None:
    engine = _engine(tmp_path, _Client())
    try:
        with pytest.raises(CaptureRejected, match=expected):
            engine.check(request_)
    finally:
        engine.close()


# -- the replicates a report compares -------------------------------------------------

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _session(
    store: SessionStore,
    session_id: str,
    minutes: int,
    *,
    rounds: int = 1,
    hosts: tuple[str, ...] = ("worker-0",),
    trigger: str = "manual",
    run_id: str = "run-a",
) -> SessionRecord:
    directory = Path(store.session_dir(session_id))
    directory.mkdir(parents=True)
    targets = []
    for host in hosts:
        names = (
            [f"{host}_9999.r{i}.xplane.pb" for i in range(1, rounds + 1)]
            if rounds > 1
            else [f"{host}_9999.xplane.pb"]
        )
        for name in names:
            (directory / name).write_bytes(b"x")
        targets.append(
            TargetResult(address=f"{host}:9999", host=host, run_id=run_id, status="ok", files=names)
        )
    record = SessionRecord(
        id=session_id,
        status="done",
        trigger=trigger,
        run_id=run_id,
        workload="trainer",
        created=T0 + timedelta(minutes=minutes),
        options={"captures": rounds} if rounds > 1 else {},
        targets=targets,
    )
    store.write_record(record)
    return record


def test_an_alert_of_three_captures_is_compared_with_the_baseline_runs_newest_three(
    tmp_path: Path,
) -> None:
    store = SessionStore(str(tmp_path / "store"))
    for i, minutes in enumerate((0, 5, 10, 15)):
        _session(store, f"good-{i}", minutes)
    _session(store, "other-run", 12, run_id="run-b")  # newer than good-2, another run
    _session(store, "earlier-alert", 17, trigger="alert")
    alert = _session(store, "alert", 20, rounds=3, trigger="alert")
    _session(store, "later", 30)
    baselines = BaselineStore(store)
    chosen = baselines.choose(alert)
    assert chosen is not None and chosen.session_id == "good-3"
    plan = plan_replicates(alert, chosen.session_id, baselines)
    assert plan is not None
    assert plan.head == [[f"worker-0_9999.r{i}.xplane.pb"] for i in (1, 2, 3)]
    assert [s for s, _ in plan.base_sessions] == ["good-2", "good-1"]

    def local(session_id: str, names: list[str]) -> Any:
        from contextlib import nullcontext

        return nullcontext(Path(store.session_dir(session_id)))

    session_dir, base_dir = Path(store.session_dir("alert")), Path(store.session_dir("good-3"))
    with replicate_specs(plan, session_dir, base_dir, local) as (heads, bases):
        assert heads == [str(session_dir / f"worker-0_9999.r{i}.xplane.pb") for i in (1, 2, 3)]
        assert bases == [str(base_dir), store.session_dir("good-2"), store.session_dir("good-1")]


def test_a_baseline_of_several_captures_gives_its_own_and_hosts_stay_together(
    tmp_path: Path,
) -> None:
    store = SessionStore(str(tmp_path / "store"))
    hosts = ("worker-0", "worker-1")
    base = _session(store, "marked", 0, rounds=2, hosts=hosts, trigger="alert")
    (Path(store.session_dir("marked")) / "worker-1_9999.r2.xplane.pb").unlink()
    (Path(store.session_dir("marked")) / "worker-1_9999.r2.xplane.pb").symlink_to("/etc/passwd")
    alert = _session(store, "alert", 20, rounds=2, hosts=hosts, trigger="alert")
    plan = plan_replicates(alert, base.id, BaselineStore(store))
    assert plan is not None and plan.base_sessions == []
    assert plan.head == [
        ["worker-0_9999.r1.xplane.pb", "worker-1_9999.r1.xplane.pb"],
        ["worker-0_9999.r2.xplane.pb", "worker-1_9999.r2.xplane.pb"],
    ]
    session_dir, base_dir = Path(store.session_dir("alert")), Path(store.session_dir("marked"))
    with replicate_specs(plan, session_dir, base_dir, lambda *_: pytest.fail()) as (heads, bases):
        first = Path(heads[0])
        assert sorted(p.name for p in first.iterdir()) == [
            "session.json",
            "worker-0_9999.r1.xplane.pb",
            "worker-1_9999.r1.xplane.pb",
        ]
        # The link planted under a capture's name is no capture: that round keeps one file.
        assert bases[1] == str(base_dir / "worker-0_9999.r2.xplane.pb")
    assert not first.exists()  # the scratch copies go with the report


def test_a_session_of_one_capture_is_compared_as_one_side(tmp_path: Path) -> None:
    store = SessionStore(str(tmp_path / "store"))
    base = _session(store, "good", 0)
    alert = _session(store, "alert", 20, trigger="alert")
    assert plan_replicates(alert, base.id, BaselineStore(store)) is None


def test_a_lone_baseline_capture_keeps_one_side_each(tmp_path: Path) -> None:
    # 1 base capture against 3: the t test's 2 degrees of freedom cannot name work that
    # grew, which the rank test across one side each can.
    store = SessionStore(str(tmp_path / "store"))
    base = _session(store, "good", 0)
    _session(store, "other-run", 5, run_id="run-b")
    alert = _session(store, "alert", 20, rounds=3, trigger="alert")
    assert plan_replicates(alert, base.id, BaselineStore(store)) is None
    with replicate_specs(None, tmp_path, Path(store.session_dir("good")), lambda *_: None) as got:
        assert got == ([], [store.session_dir("good")])
