"""Alert → capture policy: which Alertmanager alerts start a capture, on which targets.

Pure policy, no HTTP: the webhook parses the payload into :class:`AlertmanagerPayload`
and hands it to :meth:`AlertPolicy.handle`, which for each alert decides one outcome:

``started``      a capture session was submitted to the engine
``resolved``     the alert is resolved (nothing to capture)
``no_action``    no (or an unknown) ``mlprof_action`` label/annotation
``invalid``      an ``mlprof_*`` parameter is not a valid value
``duplicate``    the same firing (fingerprint, startsAt) was captured within the dedup window
``no_target``    the alert's ``run_id``/``host``/``instance`` labels match no known target
``cooldown``     the run was captured less than the cooldown ago
``limit``        the global number of running alert-triggered sessions is reached
``failed``       the engine refused or failed to start the session

Only targets the registry already knows are ever selected: nothing taken from the
payload (an address, an ``instance``) is dialled.

>>> policy = AlertPolicy(registry, engine, AlertPolicyConfig())  # doctest: +SKIP
>>> policy.handle(AlertmanagerPayload.model_validate(body)).as_json()  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from exporter.capture.engine import MAX_CAPTURES, CaptureRejected, CaptureRequest
from exporter.config import ALERT_CAPTURES, parse_hostport

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from exporter.capture.session import SessionRecord
    from exporter.capture.targets import ProfilerTarget
    from exporter.config import Settings

__all__ = [
    "ACTION_LABEL",
    "OUTCOMES",
    "REQUEST_OUTCOMES",
    "AlertOutcome",
    "AlertPolicy",
    "AlertPolicyConfig",
    "AlertmanagerAlert",
    "AlertmanagerPayload",
    "WebhookResult",
]

log = logging.getLogger(__name__)

Outcome = Literal[
    "started",
    "resolved",
    "no_action",
    "invalid",
    "duplicate",
    "no_target",
    "cooldown",
    "limit",
    "failed",
]
OUTCOMES: Final[tuple[str, ...]] = (
    "started", "resolved", "no_action", "invalid", "duplicate",
    "no_target", "cooldown", "limit", "failed",
)  # fmt: skip

# Requests the webhook refuses before any alert is read (counted under these outcomes).
REQUEST_OUTCOMES: Final[tuple[str, ...]] = ("unauthorized", "too_large", "malformed")

ACTION_LABEL: Final = "mlprof_action"
ACTION_KINDS: Final[Mapping[str, Literal["trace", "snapshot"]]] = {
    "capture": "trace",
    "snapshot": "snapshot",
}
# Optional per-alert capture parameters (label or annotation) -> CaptureRequest field.
PARAMETERS: Final[Mapping[str, str]] = {
    "mlprof_duration_ms": "duration_ms",
    "mlprof_host_tracer_level": "host_tracer_level",
    "mlprof_device_tracer_level": "device_tracer_level",
    "mlprof_python_tracer_level": "python_tracer_level",
    "mlprof_captures": "captures",  # this alert's captures, beside MLPROF_ALERT_CAPTURES
}
# A flood of distinct fingerprints must not grow memory without bound; past this many
# remembered fingerprints the oldest are forgotten first.
MAX_REMEMBERED: Final = 100_000


class AlertmanagerAlert(BaseModel):
    """One alert of Alertmanager's webhook payload (v4); unknown fields are tolerated."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime | None = Field(None, alias="startsAt")
    ends_at: datetime | None = Field(None, alias="endsAt")
    generator_url: str | None = Field(None, alias="generatorURL")
    fingerprint: str | None = None

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def key(self) -> str:
        """The fingerprint; computed from the labels when the sender left it out."""
        if self.fingerprint:
            return self.fingerprint
        text = json.dumps(sorted(self.labels.items()), separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def value(self, name: str) -> str | None:
        """A label, else an annotation of that name (labels win: they are routed on)."""
        found = self.labels.get(name)
        if found is None:
            found = self.annotations.get(name)
        return found.strip() if found is not None else None


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook body (``version: "4"``); unknown fields are tolerated."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    version: str | None = None
    group_key: str | None = Field(None, alias="groupKey")
    truncated_alerts: int = Field(0, alias="truncatedAlerts")
    status: str | None = None
    receiver: str | None = None
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str | None = Field(None, alias="externalURL")
    alerts: list[AlertmanagerAlert]


@dataclass(frozen=True)
class AlertPolicyConfig:
    """Limits of the policy; the sidecar builds it from ``MLPROF_ALERT_*`` settings."""

    cooldown_s: float = 600.0
    dedup_window_s: float = 3600.0
    max_concurrent: int = 2
    # A trace's captures, its duration split among them: the report's replicates.
    captures: int = ALERT_CAPTURES

    @classmethod
    def from_settings(cls, settings: Settings) -> AlertPolicyConfig:
        return cls(
            cooldown_s=settings.alert_cooldown_s,
            dedup_window_s=settings.alert_dedup_window_s,
            max_concurrent=settings.alert_max_concurrent,
            captures=settings.alert_captures,
        )


@dataclass(frozen=True)
class AlertOutcome:
    """What happened to one alert of a webhook call."""

    alert: str
    fingerprint: str
    outcome: Outcome
    reason: str = ""
    session_id: str | None = None
    targets: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "alert": self.alert,
            "fingerprint": self.fingerprint,
            "outcome": self.outcome,
        }
        if self.reason:
            out["reason"] = self.reason
        if self.session_id is not None:
            out["session_id"] = self.session_id
            out["targets"] = list(self.targets)
        return out


@dataclass
class WebhookResult:
    """The answer to one webhook call: sessions started, and one outcome per alert."""

    outcomes: list[AlertOutcome] = field(default_factory=list)

    @property
    def sessions(self) -> list[str]:
        return [o.session_id for o in self.outcomes if o.session_id is not None]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes:
            counts[outcome.outcome] = counts.get(outcome.outcome, 0) + 1
        return counts

    def as_json(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "counts": self.counts(),
            "alerts": [o.as_json() for o in self.outcomes],
        }


class TargetSelector(Protocol):
    """The part of ``TargetRegistry`` the policy uses."""

    def select(
        self, run_id: str | None = None, hosts: Collection[str] | None = None
    ) -> list[ProfilerTarget]: ...


class CaptureSubmitter(Protocol):
    """The part of ``CaptureEngine`` the policy uses."""

    def submit(self, request: CaptureRequest, targets: list[ProfilerTarget]) -> SessionRecord: ...

    def get(self, session_id: str) -> SessionRecord | None: ...


class _IgnoredError(Exception):
    def __init__(self, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.outcome: Outcome = outcome
        self.reason = reason


def _instance_host(alert: AlertmanagerAlert) -> str | None:
    """The host part of the ``instance`` label (the scraped sidecar's address)."""
    instance = alert.labels.get("instance", "").strip()
    if not instance:
        return None
    try:
        return parse_hostport(instance, default_port=0)[0]
    except ValueError:
        return instance


def _int_parameter(alert: AlertmanagerAlert, name: str) -> int | None:
    text = alert.value(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise _IgnoredError("invalid", f"{name}={text!r}: expected a whole number") from None
    if value < 0 or (name in ("mlprof_duration_ms", "mlprof_captures") and value == 0):
        raise _IgnoredError("invalid", f"{name}={text!r}: expected a positive number") from None
    if name == "mlprof_captures" and value > MAX_CAPTURES:
        raise _IgnoredError("invalid", f"{name}={text!r}: expected 1..{MAX_CAPTURES}")
    return value


class AlertPolicy:
    """Turns Alertmanager alerts into capture sessions: dedup, cooldown, limit, targets.

    Thread-safe: one lock serialises decisions, so concurrent webhook calls carrying the
    same alert start one capture.
    """

    def __init__(
        self,
        targets: TargetSelector,
        captures: CaptureSubmitter,
        config: AlertPolicyConfig | None = None,
        *,
        meter: Meter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = targets
        self.captures = captures
        self.config = config or AlertPolicyConfig()
        self._clock = clock
        self._lock = threading.Lock()
        # "<fingerprint>@<startsAt>" -> capture time
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._cooled: dict[str, float] = {}  # run key -> capture time
        self._active: list[str] = []  # alert-triggered session ids maybe still running
        self._counter = (
            meter.create_counter(
                "mlprof.alerts.received",
                unit="{alert}",
                description="Alertmanager alerts received by the webhook, by outcome.",
            )
            if meter is not None
            else None
        )
        if self._counter is not None:  # at 0 from the start, so increase() sees the first
            for outcome in (*OUTCOMES, *REQUEST_OUTCOMES):
                self._counter.add(0, {"outcome": outcome})

    def count(self, outcome: str, n: int = 1) -> None:
        """Add to the received-alerts counter (the webhook also counts refused requests)."""
        if self._counter is not None and n:
            self._counter.add(n, {"outcome": outcome})

    def handle(self, payload: AlertmanagerPayload) -> WebhookResult:
        """Decide every alert of one webhook call; start the captures it allows."""
        result = WebhookResult()
        with self._lock:
            now = self._clock()
            self._forget(now)
            for alert in payload.alerts:
                result.outcomes.append(self._decide(alert, now))
        for outcome, n in result.counts().items():
            self.count(outcome, n)
        return result

    def running(self) -> list[str]:
        """Alert-triggered sessions still running (as far as the engine says)."""
        with self._lock:
            return list(self._still_running())

    def _still_running(self) -> list[str]:
        alive = []
        for session_id in self._active:
            record = self.captures.get(session_id)
            if record is not None and record.status == "running":
                alive.append(session_id)
        self._active = alive
        return alive

    def _forget(self, now: float) -> None:
        window = self.config.dedup_window_s
        while self._seen:
            fingerprint, seen_at = next(iter(self._seen.items()))
            if now - seen_at < window and len(self._seen) <= MAX_REMEMBERED:
                break
            del self._seen[fingerprint]
        cooldown = self.config.cooldown_s
        for key in [k for k, t in self._cooled.items() if now - t >= cooldown]:
            del self._cooled[key]

    def _decide(self, alert: AlertmanagerAlert, now: float) -> AlertOutcome:
        name, fingerprint = alert.name, alert.key()
        try:
            session_id, targets = self._start(alert, fingerprint, now)
        except _IgnoredError as rejected:
            log.debug("alert %s (%s): %s", name, fingerprint, rejected.reason)
            return AlertOutcome(name, fingerprint, rejected.outcome, rejected.reason)
        log.info(
            "alert %s (%s) started capture session %s on %s",
            name,
            fingerprint,
            session_id,
            ", ".join(t.address for t in targets),
        )
        return AlertOutcome(
            name, fingerprint, "started", "", session_id, tuple(t.address for t in targets)
        )

    def _resolve(
        self, alert: AlertmanagerAlert
    ) -> tuple[list[ProfilerTarget], str | None, list[str] | None]:
        """Known targets of the alert's run, narrowed to its ``host`` (or ``instance``)."""
        run_id = alert.labels.get("run_id", "").strip() or None
        host = alert.labels.get("host", "").strip() or None
        if host is not None:
            return self.targets.select(run_id=run_id, hosts=[host]), run_id, [host]
        instance = _instance_host(alert)
        if instance is None:
            if run_id is None:
                raise _IgnoredError("no_target", "alert has no run_id, host or instance label")
            return self.targets.select(run_id=run_id), run_id, None
        targets = self.targets.select(run_id=run_id, hosts=[instance])
        if not targets and run_id is not None:
            # ``instance`` is whoever was scraped: the sidecar beside the workload, but
            # also a collector or a federating Prometheus; then the run alone decides.
            return self.targets.select(run_id=run_id), run_id, None
        return targets, run_id, [instance]

    def _start(
        self, alert: AlertmanagerAlert, fingerprint: str, now: float
    ) -> tuple[str, list[ProfilerTarget]]:
        if alert.status != "firing":
            raise _IgnoredError("resolved", "alert is resolved")
        action = alert.value(ACTION_LABEL)
        if not action:
            raise _IgnoredError("no_action", f"no {ACTION_LABEL} label or annotation")
        kind = ACTION_KINDS.get(action)
        if kind is None:
            raise _IgnoredError(
                "no_action",
                f"{ACTION_LABEL}={action!r}: expected {' or '.join(map(repr, ACTION_KINDS))}",
            )
        parameters = {
            field_name: value
            for label, field_name in PARAMETERS.items()
            if (value := _int_parameter(alert, label)) is not None
        }
        # One firing is one capture: an alert that resolves and fires again is a new
        # firing with a new startsAt (Alertmanager repeats keep the same one).
        starts = alert.starts_at.isoformat() if alert.starts_at else ""
        dedup_key = f"{fingerprint}@{starts}"
        seen_at = self._seen.get(dedup_key)
        if seen_at is not None:
            ago = now - seen_at
            raise _IgnoredError(
                "duplicate",
                f"fingerprint {fingerprint} (firing since {starts or 'unknown'}) started a "
                f"capture {ago:.0f}s ago (dedup window {self.config.dedup_window_s:g}s)",
            )
        targets, run_id, hosts = self._resolve(alert)
        if not targets:
            wanted = ", ".join(
                [*([f"run_id={run_id!r}"] if run_id else []), *(f"host={h!r}" for h in hosts or [])]
            )
            raise _IgnoredError("no_target", f"no known profiler target matches {wanted}")
        keys = {f"run:{run_id}"} if run_id else {_run_key(t) for t in targets}
        cooling = sorted(k for k in keys if k in self._cooled)
        if cooling:
            ago = now - self._cooled[cooling[0]]
            raise _IgnoredError(
                "cooldown",
                f"{cooling[0].partition(':')[2]} was captured {ago:.0f}s ago "
                f"(cooldown {self.config.cooldown_s:g}s)",
            )
        running = self._still_running()
        if len(running) >= self.config.max_concurrent:
            raise _IgnoredError(
                "limit",
                f"{len(running)} alert-triggered captures running "
                f"(limit {self.config.max_concurrent})",
            )
        request = CaptureRequest(
            kind=kind,
            # A snapshot is one kept window; a trace is split into replicates.
            captures=self.config.captures if kind == "trace" else 1,
            trigger="alert",
            requester="alertmanager",
            alert={
                "name": alert.name,
                "fingerprint": fingerprint,
                "labels": dict(alert.labels),
                "startsAt": alert.starts_at.isoformat() if alert.starts_at else None,
            },
        )
        for field_name, value in parameters.items():
            setattr(request, field_name, value)
        try:
            record = self.captures.submit(request, targets)
        except CaptureRejected as exc:
            raise _IgnoredError("invalid", str(exc)) from None
        except Exception as exc:  # the engine's failure must not fail the other alerts
            log.exception("alert %s: capture could not start", alert.name)
            raise _IgnoredError("failed", f"capture could not start: {exc}") from None
        self._seen[dedup_key] = now
        self._seen.move_to_end(dedup_key)
        for key in keys:
            self._cooled[key] = now
        self._active.append(record.id)
        return record.id, targets


def _run_key(target: ProfilerTarget) -> str:
    # A target of unknown run (a static address) cools down on its own.
    return f"run:{target.run_id}" if target.run_id else f"target:{target.address}"
