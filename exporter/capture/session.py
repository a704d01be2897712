"""Capture sessions: the record kept as ``session.json`` and session-id rules."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from exporter.capture.names import SESSION_ID_RE, check_session_id

__all__ = [
    "SESSION_FILE",
    "SESSION_ID_RE",
    "SessionRecord",
    "TargetResult",
    "check_session_id",
    "new_session_id",
    "utcnow",
]

SESSION_FILE: Final = "session.json"

SessionStatus = Literal["running", "done", "partial", "failed"]
TargetStatus = Literal["running", "ok", "busy", "unreachable", "failed", "timeout"]


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_session_id(name: str | None = None) -> str:
    """A fresh id, sortable by time: ``<UTC stamp>-<hex>`` or ``<name>-<stamp>-<hex>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    suffix = f"{stamp}-{secrets.token_hex(3)}"
    if name is None:
        return suffix
    check_session_id(name)
    return f"{name[: 128 - len(suffix) - 1]}-{suffix}"


class TargetResult(BaseModel):
    """What happened on one profiler target of a session."""

    model_config = ConfigDict(extra="allow")

    address: str
    host: str
    run_id: str | None = None
    status: TargetStatus = "running"
    error: str = ""
    files: list[str] = Field(default_factory=list)  # names inside the session directory
    bytes: int = 0
    started: datetime | None = None
    finished: datetime | None = None
    mode: str = "trace"  # trace | continuous | ring
    # Beside the status, what the user should know: a snapshot asked for where none is
    # kept says that it became a trace.
    note: str = ""
    # Capture files the store refused: kept in the staging dir, the watcher retries them.
    unimported: list[str] = Field(default_factory=list)


class SessionRecord(BaseModel):
    """One capture session, as ``plugins/profile/<id>/session.json`` holds it."""

    model_config = ConfigDict(extra="allow")

    id: str
    status: SessionStatus = "running"
    kind: str = "trace"
    trigger: str = "manual"
    requester: str = "api"
    run_id: str | None = None
    workload: str | None = None  # the run's workload name (service_name in Pyroscope)
    # schema.config_fingerprint of the run's configs: with the workload, which earlier
    # sessions are the same workload's history (None: unknown).
    config_fingerprint: str | None = None
    alert: dict[str, Any] | None = None
    name: str | None = None
    created: datetime = Field(default_factory=utcnow)
    started: datetime | None = None
    finished: datetime | None = None
    # What was asked and what ran after clamping to the configured maxima.
    options: dict[str, int] = Field(default_factory=dict)
    clamped: dict[str, dict[str, int]] = Field(default_factory=dict)
    targets: list[TargetResult] = Field(default_factory=list)
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    processed: datetime | None = None  # when conversion/push hooks finished
    # The analysis report's verdict once written: {"status", "findings": {P0..P2},
    # "file"} or {"status": "error", "error"}; the report itself is analysis.json.
    report: dict[str, Any] | None = None

    @property
    def finished_ok(self) -> bool:
        return self.status in ("done", "partial")

    def in_run(self, run_id: str) -> bool:
        """Whether the session belongs to run ``run_id`` (its own or a target's run)."""
        return self.run_id == run_id or any(t.run_id == run_id for t in self.targets)

    def summarize(self) -> SessionStatus:
        """The session status from its targets' results: done, partial or failed."""
        ok = sum(1 for t in self.targets if t.status == "ok")
        if ok and ok == len(self.targets):
            return "done"
        return "partial" if ok else "failed"
