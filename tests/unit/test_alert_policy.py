"""The alert → capture policy on its own: a fake registry and a recording engine."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pytest

from exporter.capture.alerts import (
    AlertmanagerAlert,
    AlertmanagerPayload,
    AlertPolicy,
    AlertPolicyConfig,
)
from exporter.capture.engine import CaptureRejected, CaptureRequest
from exporter.capture.targets import ProfilerTarget
from exporter.metrics.telemetry import build_telemetry

RUN_A = [
    ProfilerTarget("10.0.0.1:9999", "worker-0", "run-a", "k8s"),
    ProfilerTarget("10.0.0.2:9999", "worker-1", "run-a", "k8s"),
]
RUN_B = [ProfilerTarget("10.0.1.1:9999", "worker-b0", "run-b", "k8s")]
STATIC = [ProfilerTarget("127.0.0.1:9999", "127.0.0.1", None, "static")]


class Registry:
    """Selects among a fixed list, with the contract's matching rules."""

    def __init__(self, targets: list[ProfilerTarget]) -> None:
        self.targets = targets
        self.calls: list[tuple[str | None, list[str] | None]] = []

    def select(
        self, run_id: str | None = None, hosts: Collection[str] | None = None
    ) -> list[ProfilerTarget]:
        self.calls.append((run_id, None if hosts is None else list(hosts)))
        return [
            t
            for t in self.targets
            if (run_id is None or t.run_id == run_id)
            and (hosts is None or t.host in hosts or t.address.rpartition(":")[0] in hosts)
        ]


@dataclass
class Session:
    id: str
    status: str = "running"


@dataclass
class Engine:
    """Records what the policy submits; sessions run until ``finish``."""

    submitted: list[tuple[CaptureRequest, list[ProfilerTarget]]] = field(default_factory=list)
    sessions: dict[str, Session] = field(default_factory=dict)
    fail_with: Exception | None = None

    def submit(self, request: CaptureRequest, targets: list[ProfilerTarget]) -> Session:
        if self.fail_with is not None:
            raise self.fail_with
        self.submitted.append((request, targets))
        session = Session(f"s{len(self.submitted)}")
        self.sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def finish(self, status: str = "done") -> None:
        for session in self.sessions.values():
            session.status = status


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def alert(status: str = "firing", fingerprint: str | None = "fp1", **labels: str) -> dict[str, Any]:
    labels = {"alertname": "MLWorkloadDutyCycleLow", "mlprof_action": "capture", **labels}
    body: dict[str, Any] = {
        "status": status,
        "labels": {k: v for k, v in labels.items() if v != ""},
        "annotations": {"summary": "duty cycle low"},
        "startsAt": "2026-11-29T07:00:00.123Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
    }
    if fingerprint is not None:
        body["fingerprint"] = fingerprint
    return body


def payload(*alerts: dict[str, Any]) -> AlertmanagerPayload:
    return AlertmanagerPayload.model_validate(
        {
            "version": "4",
            "groupKey": '{}:{alertname="x"}',
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "mlprof",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager",
            "alerts": list(alerts),
            "somethingNew": {"added": "in a later Alertmanager"},
        }
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def registry() -> Registry:
    return Registry(RUN_A + RUN_B + STATIC)


@pytest.fixture
def policy(registry: Registry, engine: Engine, clock: Clock) -> AlertPolicy:
    config = AlertPolicyConfig(cooldown_s=600, dedup_window_s=3600, max_concurrent=2)
    return AlertPolicy(registry, engine, config, clock=clock)


def test_firing_alert_captures_every_host_of_its_run(policy: AlertPolicy, engine: Engine) -> None:
    result = policy.handle(payload(alert(run_id="run-a", instance="10.9.9.9:9464")))

    assert result.sessions == ["s1"]
    [(request, targets)] = engine.submitted
    assert targets == RUN_A
    assert (request.kind, request.trigger, request.requester) == ("trace", "alert", "alertmanager")
    assert request.alert == {
        "name": "MLWorkloadDutyCycleLow",
        "fingerprint": "fp1",
        "labels": {
            "alertname": "MLWorkloadDutyCycleLow",
            "mlprof_action": "capture",
            "run_id": "run-a",
            "instance": "10.9.9.9:9464",
        },
        "startsAt": "2026-11-29T07:00:00.123000+00:00",
    }
    body = result.as_json()
    assert body["alerts"] == [
        {
            "alert": "MLWorkloadDutyCycleLow",
            "fingerprint": "fp1",
            "outcome": "started",
            "session_id": "s1",
            "targets": ["10.0.0.1:9999", "10.0.0.2:9999"],
        }
    ]


def test_host_label_narrows_to_that_host(policy: AlertPolicy, engine: Engine) -> None:
    policy.handle(payload(alert(run_id="run-a", host="worker-1")))
    assert engine.submitted[0][1] == [RUN_A[1]]


def test_instance_host_part_is_used_when_there_is_no_host_label(
    policy: AlertPolicy, engine: Engine, registry: Registry
) -> None:
    policy.handle(payload(alert(instance="10.0.1.1:9464")))
    assert registry.calls == [(None, ["10.0.1.1"])]
    assert engine.submitted[0][1] == RUN_B


def test_instance_narrows_a_run_when_it_is_the_sidecar_beside_a_host(
    policy: AlertPolicy, engine: Engine
) -> None:
    policy.handle(payload(alert(run_id="run-a", instance="10.0.0.2:9464")))
    assert engine.submitted[0][1] == [RUN_A[1]]


def test_snapshot_action_and_parameters_from_labels_and_annotations(
    policy: AlertPolicy, engine: Engine
) -> None:
    body = alert(run_id="run-b", mlprof_action="snapshot", mlprof_duration_ms="1500")
    body["annotations"].update(mlprof_host_tracer_level="3", mlprof_python_tracer_level="1")
    policy.handle(payload(body))
    request = engine.submitted[0][0]
    assert request.kind == "snapshot"
    assert (request.duration_ms, request.host_tracer_level, request.python_tracer_level) == (
        1500,
        3,
        1,
    )


@pytest.mark.parametrize(
    ("body", "outcome", "reason"),
    [
        (alert(status="resolved", run_id="run-a"), "resolved", "resolved"),
        (alert(run_id="run-a", mlprof_action=""), "no_action", "no mlprof_action"),
        (alert(run_id="run-a", mlprof_action="reboot"), "no_action", "'reboot'"),
        (alert(run_id="run-a", mlprof_duration_ms="2s"), "invalid", "mlprof_duration_ms='2s'"),
        (alert(run_id="run-a", mlprof_host_tracer_level="-1"), "invalid", "host_tracer_level"),
        (alert(host="gpu-node-17"), "no_target", "host='gpu-node-17'"),
        (alert(run_id="run-zzz"), "no_target", "run_id='run-zzz'"),
        (alert(instance="203.0.113.7:9999"), "no_target", "host='203.0.113.7'"),
        (alert(), "no_target", "no run_id, host or instance"),
    ],
)
def test_ignored_alerts_say_why_and_start_nothing(
    policy: AlertPolicy, engine: Engine, body: dict[str, Any], outcome: str, reason: str
) -> None:
    result = policy.handle(payload(body))
    [answer] = result.as_json()["alerts"]
    assert answer["outcome"] == outcome
    assert reason in answer["reason"]
    assert result.sessions == []
    assert engine.submitted == []


def test_address_labels_in_the_payload_are_never_targets(
    policy: AlertPolicy, engine: Engine
) -> None:
    body = alert(run_id="run-b", address="203.0.113.7:9999", target="203.0.113.7:9999")
    policy.handle(payload(body))
    assert [t.address for t in engine.submitted[0][1]] == ["10.0.1.1:9999"]


def test_same_alert_a_hundred_times_captures_once(
    policy: AlertPolicy, engine: Engine, clock: Clock
) -> None:
    outcomes = []
    for _ in range(100):
        clock.now += 1
        outcomes += [o.outcome for o in policy.handle(payload(alert(run_id="run-a"))).outcomes]
    assert outcomes.count("started") == 1
    assert outcomes.count("duplicate") == 99
    assert len(engine.submitted) == 1


def test_duplicates_within_one_payload(policy: AlertPolicy, engine: Engine) -> None:
    result = policy.handle(payload(alert(run_id="run-a"), alert(run_id="run-a")))
    assert [o.outcome for o in result.outcomes] == ["started", "duplicate"]


def test_fingerprint_captures_again_after_the_dedup_window(
    policy: AlertPolicy, engine: Engine, clock: Clock
) -> None:
    policy.handle(payload(alert(run_id="run-a")))
    engine.finish()
    clock.now += 3599
    assert policy.handle(payload(alert(run_id="run-a"))).outcomes[0].outcome == "duplicate"
    clock.now += 2
    assert policy.handle(payload(alert(run_id="run-a"))).outcomes[0].outcome == "started"


def test_an_alert_firing_again_after_resolving_is_not_a_duplicate(
    policy: AlertPolicy, engine: Engine, clock: Clock
) -> None:
    first = alert(run_id="run-a")
    assert policy.handle(payload(first)).outcomes[0].outcome == "started"
    engine.finish()
    clock.now += 700  # past the cooldown, well inside the dedup window
    assert policy.handle(payload(alert("resolved", run_id="run-a"))).outcomes[0].outcome == (
        "resolved"
    )
    assert policy.handle(payload(first)).outcomes[0].outcome == "duplicate"  # a repeat
    again = alert(run_id="run-a") | {"startsAt": "2026-11-29T07:20:00Z"}  # a new firing
    assert policy.handle(payload(again)).outcomes[0].outcome == "started"
    assert len(engine.submitted) == 2


def test_cooldown_is_per_run(policy: AlertPolicy, engine: Engine, clock: Clock) -> None:
    policy.handle(payload(alert(fingerprint="a1", run_id="run-a", host="worker-0")))
    engine.finish()
    clock.now += 300
    result = policy.handle(
        payload(
            alert(fingerprint="a2", run_id="run-a", host="worker-1"),
            alert(fingerprint="b1", run_id="run-b"),
        )
    )
    first, second = result.outcomes
    assert first.outcome == "cooldown"
    assert "run-a was captured 300s ago (cooldown 600s)" in first.reason
    assert second.outcome == "started"
    clock.now += 301
    assert policy.handle(payload(alert(fingerprint="a3", run_id="run-a"))).sessions


def test_cooldown_by_host_resolves_to_the_targets_run(policy: AlertPolicy, engine: Engine) -> None:
    policy.handle(payload(alert(fingerprint="a1", host="worker-0")))
    engine.finish()
    result = policy.handle(payload(alert(fingerprint="a2", host="worker-1")))
    assert result.outcomes[0].outcome == "cooldown"


def test_static_targets_without_run_cool_down_per_address(
    policy: AlertPolicy, engine: Engine
) -> None:
    policy.handle(payload(alert(fingerprint="x1", instance="127.0.0.1:9464")))
    engine.finish()
    result = policy.handle(payload(alert(fingerprint="x2", host="127.0.0.1")))
    assert result.outcomes[0].outcome == "cooldown"
    assert "127.0.0.1:9999" in result.outcomes[0].reason


def test_global_limit_of_running_alert_captures(
    policy: AlertPolicy, engine: Engine, registry: Registry
) -> None:
    registry.targets = [
        ProfilerTarget(f"10.1.0.{i}:9999", f"h{i}", f"run-{i}", "k8s") for i in range(5)
    ]
    bodies = [alert(fingerprint=f"f{i}", run_id=f"run-{i}") for i in range(4)]
    result = policy.handle(payload(*bodies))
    assert [o.outcome for o in result.outcomes] == ["started", "started", "limit", "limit"]
    assert "2 alert-triggered captures running (limit 2)" in result.outcomes[2].reason
    assert policy.running() == ["s1", "s2"]
    engine.sessions["s1"].status = "done"
    # Alertmanager re-sends; the refused alert was not remembered, so it starts now.
    again = policy.handle(payload(bodies[2]))
    assert again.sessions == ["s3"]


def test_burst_of_a_thousand_alerts_is_answered_with_bounded_captures(
    policy: AlertPolicy, engine: Engine, registry: Registry
) -> None:
    registry.targets = [
        ProfilerTarget(f"10.2.0.{i}:9999", f"h{i}", f"run-{i}", "k8s") for i in range(50)
    ]
    bodies = [alert(fingerprint=f"f{i}", run_id=f"run-{i % 60}") for i in range(1000)]
    result = policy.handle(payload(*bodies))
    counts = result.counts()
    assert sum(counts.values()) == 1000
    assert counts["started"] == 2
    assert len(engine.submitted) == 2
    assert set(counts) == {"started", "limit", "cooldown", "no_target"}


def test_engine_rejection_is_reported_and_not_remembered(
    policy: AlertPolicy, engine: Engine
) -> None:
    engine.fail_with = CaptureRejected("duration_ms: expected at most 60000, got 999999")
    result = policy.handle(payload(alert(run_id="run-a", mlprof_duration_ms="999999")))
    assert result.outcomes[0].outcome == "invalid"
    assert "duration_ms" in result.outcomes[0].reason
    engine.fail_with = OSError("store is read-only")
    assert policy.handle(payload(alert(run_id="run-a"))).outcomes[0].outcome == "failed"
    engine.fail_with = None
    assert policy.handle(payload(alert(run_id="run-a"))).sessions == ["s1"]


def test_outcomes_are_counted_in_the_self_metric(registry: Registry, engine: Engine) -> None:
    telemetry = build_telemetry()
    policy = AlertPolicy(registry, engine, AlertPolicyConfig(), meter=telemetry.meter)
    policy.handle(payload(alert(run_id="run-a"), alert(run_id="run-a"), alert(status="resolved")))
    policy.count("unauthorized")

    def value(outcome: str) -> float | None:
        return telemetry.registry.get_sample_value(
            "mlprof_alerts_received_total", {"outcome": outcome}
        )

    assert (value("started"), value("duplicate"), value("resolved")) == (1, 1, 1)
    assert value("unauthorized") == 1
    # Present at 0 before the first one (issue 11): increase() sees the first failure.
    assert (value("cooldown"), value("failed"), value("malformed")) == (0, 0, 0)


def test_payload_without_fingerprint_gets_a_stable_one() -> None:
    one = AlertmanagerAlert.model_validate(alert(fingerprint=None, run_id="r", host="h"))
    two = AlertmanagerAlert.model_validate(alert(fingerprint=None, host="h", run_id="r"))
    other = AlertmanagerAlert.model_validate(alert(fingerprint=None, run_id="r", host="g"))
    assert one.key() == two.key() != other.key()
    assert len(one.key()) == 16
