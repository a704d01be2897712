"""Run events of the capture subsystem: capture requested / finished, alert received.

The sidecar hands these the event sink's ``emit``: the engine's ``on_submit`` and the
session hooks call :func:`capture_requested` and :func:`capture_finished`, the webhook
calls :func:`alerts_received` (schema in ``docs/events.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.capture.alerts import AlertmanagerPayload, WebhookResult
    from exporter.capture.session import SessionRecord, TargetResult
    from exporter.sinks.events import Emit

__all__ = ["alert_refused", "alerts_received", "capture_finished", "capture_requested"]

# A finished session's status -> severity: a partial capture needs a look, a failed one
# means the profiler servers could not be captured at all.
_FINISHED_SEVERITY = {"done": "INFO", "partial": "WARNING", "failed": "ERROR"}
# An alert whose capture could not start is worth a warning; the other outcomes are the
# policy working as configured.
_ALERT_SEVERITY = {"failed": "ERROR", "invalid": "WARNING", "no_target": "WARNING"}


def _identity(record: SessionRecord) -> dict[str, str | None]:
    hosts = {t.host for t in record.targets}
    return {
        "session_id": record.id,
        "run_id": record.run_id,
        "workload": record.workload,
        "host": hosts.pop() if len(hosts) == 1 else None,
    }


def _alert_name(record: SessionRecord) -> str | None:
    return str(record.alert.get("name")) if record.alert else None


def _target(result: TargetResult) -> dict[str, object]:
    return {
        "address": result.address,
        "host": result.host,
        "status": result.status,
        "error": result.error or None,
        "files": result.files,
        "bytes": result.bytes,
    }


def capture_requested(emit: Emit, record: SessionRecord) -> None:
    """``capture_requested``: a session was submitted (before it runs)."""
    emit(
        "capture_requested",
        f"capture {record.id} requested ({record.kind}, {record.trigger}) on "
        f"{len(record.targets)} target(s)",
        **_identity(record),
        kind=record.kind,
        trigger=record.trigger,
        requester=record.requester,
        targets=[t.address for t in record.targets],
        alert=_alert_name(record),
        options=record.options,
    )


def capture_finished(emit: Emit, record: SessionRecord) -> None:
    """``capture_finished``: status, each target's result and files, trigger, alert name."""
    ok = sum(1 for t in record.targets if t.status == "ok")
    emit(
        "capture_finished",
        f"capture {record.id} {record.status}: {ok}/{len(record.targets)} target(s) captured",
        severity=_FINISHED_SEVERITY.get(record.status, "WARNING"),
        **_identity(record),
        status=record.status,
        kind=record.kind,
        trigger=record.trigger,
        alert=_alert_name(record),
        targets=[_target(t) for t in record.targets],
        files=sum(len(t.files) for t in record.targets),
    )


def alerts_received(emit: Emit, payload: AlertmanagerPayload, result: WebhookResult) -> None:
    """One ``alert_received`` per alert of a webhook call: outcome, reason, session."""
    for alert, outcome in zip(payload.alerts, result.outcomes, strict=False):
        reason = f": {outcome.reason}" if outcome.reason else ""
        emit(
            "alert_received",
            f"alert {outcome.alert} ({alert.status}): {outcome.outcome}{reason}",
            severity=_ALERT_SEVERITY.get(outcome.outcome),
            run_id=alert.labels.get("run_id") or None,
            workload=alert.labels.get("workload") or None,
            host=alert.labels.get("host") or None,
            session_id=outcome.session_id,
            alert=outcome.alert,
            fingerprint=outcome.fingerprint,
            status=alert.status,
            outcome=outcome.outcome,
            reason=outcome.reason or None,
            targets=list(outcome.targets) or None,
        )


def alert_refused(emit: Emit, outcome: str, reason: str) -> None:
    """``alert_received`` for a webhook call refused whole (unauthorized, malformed, too large)."""
    emit(
        "alert_received",
        f"Alertmanager webhook refused ({outcome}): {reason}",
        severity="WARNING",
        outcome=outcome,
        reason=reason,
    )
