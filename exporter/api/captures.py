"""REST API of the capture engine: targets, captures, sessions and snapshots.

``POST /api/v1/captures`` answers ``202`` with the session id and a status URL at once;
the capture runs in the background. Targets are chosen among *known* targets only (by
address, host, or run); nothing in a request body is dialled as such.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exporter.api.auth import check_bearer
from exporter.api.body import read_limited
from exporter.api.json_body import openapi_body, parse_json_object
from exporter.capture.engine import (
    HARD_MAX_DURATION_MS,
    CaptureRejected,
    CaptureRequest,
    CaptureStoreError,
)
from exporter.capture.session import SessionRecord, check_session_id
from exporter.capture.targets import ProfilerTarget
from exporter.config import MAX_ALERT_CAPTURES

if TYPE_CHECKING:
    from exporter.sidecar import Sidecar

__all__ = ["CaptureBody", "SnapshotBody", "router"]

MAX_BODY_BYTES = 64 * 1024
M = TypeVar("M", bound=BaseModel)


def _sidecar(request: Request) -> Sidecar:
    return request.app.state.sidecar  # type: ignore[no-any-return]


def require_token(request: Request) -> None:
    check_bearer(request, _sidecar(request).settings.token)


router = APIRouter(prefix="/api/v1", tags=["captures"], dependencies=[Depends(require_token)])


class _Selector(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[str] | None = Field(
        None, description="Known targets by address or host (default: every known target)."
    )
    run_id: str | None = Field(None, description="Only targets of this run.")


class CaptureBody(_Selector):
    """``POST /api/v1/captures``."""

    kind: Literal["trace", "snapshot"] = "trace"
    duration_ms: int = Field(2000, ge=1, le=HARD_MAX_DURATION_MS)
    host_tracer_level: int = Field(2, ge=0, le=3)
    device_tracer_level: int = Field(1, ge=0, le=1)
    python_tracer_level: int = Field(0, ge=0, le=1)
    delay_ms: int = Field(0, ge=0, le=HARD_MAX_DURATION_MS)
    name: str | None = Field(None, description="Session name (A-Z a-z 0-9 . _ -, <= 128).")
    captures: int = Field(
        1,
        ge=1,
        le=MAX_ALERT_CAPTURES,
        description="Traces of each target one after another, duration_ms split among them: "
        "the session's replicates, as an alert's MLPROF_ALERT_CAPTURES (a snapshot is one).",
    )

    @model_validator(mode="after")
    def _one_snapshot(self) -> CaptureBody:
        if self.kind == "snapshot" and self.captures != 1:
            raise ValueError("captures: a snapshot is one window (captures 1)")
        return self


class SnapshotBody(_Selector):
    """``POST /api/v1/snapshots/start`` and ``/stop``."""


def _error_text(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error.get("loc", ())) or "body"
        msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


async def _parse(request: Request, model: type[M]) -> M:
    raw = await read_limited(request, MAX_BODY_BYTES, f"request body over {MAX_BODY_BYTES} bytes")
    data = parse_json_object(raw or b"{}", "request body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise HTTPException(422, _error_text(exc)) from None


def _select(sidecar: Sidecar, body: _Selector) -> list[ProfilerTarget]:
    registry = sidecar.targets
    if registry.refreshed is None:
        registry.refresh(check=False)
    else:
        registry.refresh_cheap()  # a run that started seconds ago is a target already
    if body.targets is not None:
        if not body.targets:
            raise HTTPException(422, "targets: expected at least one address or host")
        chosen: dict[str, ProfilerTarget] = {}
        for wanted in body.targets:
            found = registry.select(run_id=body.run_id, hosts=[wanted])
            if not found:
                raise HTTPException(
                    422,
                    f"targets: {wanted!r} is not a known profiler target"
                    + (f" of run {body.run_id!r}" if body.run_id else "")
                    + " (see GET /api/v1/targets)",
                )
            chosen.update((t.address, t) for t in found)
        return list(chosen.values())
    found = registry.select(run_id=body.run_id)
    if not found:
        where = f"of run {body.run_id!r}" if body.run_id else "at all"
        raise HTTPException(
            422, f"no known profiler target {where}: configure MLPROF_TARGETS or discovery"
        )
    return found


def _status_url(session_id: str) -> str:
    return f"/api/v1/captures/{session_id}"


@router.get("/targets")
def list_targets(request: Request) -> dict[str, Any]:
    """Known profiler targets with their last reachability and discovery errors."""
    registry = _sidecar(request).targets
    if registry.refreshed is None:
        registry.refresh(check=False)
    else:
        registry.refresh_cheap()  # a run that started seconds ago is listed already
    engine = _sidecar(request).captures
    known = registry.known()
    targets = [
        entry | {"busy": engine.busy(target)}
        for entry, target in zip(registry.describe(known), known, strict=True)
    ]
    return {"targets": targets, "discovery_errors": registry.errors()}


@router.post("/captures", status_code=202, openapi_extra=openapi_body(CaptureBody, False))
async def post_capture(request: Request) -> JSONResponse:
    """Start a capture session on known targets; answer 202 with its status URL."""
    sidecar = _sidecar(request)
    body = await _parse(request, CaptureBody)
    targets = await run_in_threadpool(_select, sidecar, body)
    capture = CaptureRequest(
        kind=body.kind,
        duration_ms=body.duration_ms,
        host_tracer_level=body.host_tracer_level,
        device_tracer_level=body.device_tracer_level,
        python_tracer_level=body.python_tracer_level,
        delay_ms=body.delay_ms,
        name=body.name,
        captures=body.captures,
        # A snapshot asked for by hand is found with `mlprof sessions --trigger snapshot`.
        trigger="snapshot" if body.kind == "snapshot" else "manual",
        requester="api",
    )
    try:
        record = await run_in_threadpool(sidecar.captures.submit, capture, targets)
    except CaptureRejected as exc:
        raise HTTPException(422, str(exc)) from None
    except CaptureStoreError as exc:  # the store is down: nothing started, try again later
        raise HTTPException(503, str(exc)) from None
    answer = {
        "session_id": record.id,
        "status": record.status,
        "status_url": _status_url(record.id),
        "targets": [t.model_dump(mode="json") for t in record.targets],
        "options": record.options,
        "clamped": record.clamped,
    }
    return JSONResponse(answer, status_code=202, headers={"Location": _status_url(record.id)})


def _record_or_404(sidecar: Sidecar, session_id: str) -> SessionRecord:
    try:
        check_session_id(session_id)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    record = sidecar.captures.get(session_id)
    if record is None:
        raise HTTPException(404, f"no session {session_id!r} in the store")
    return record


@router.get("/captures/{session_id}")
def get_capture(request: Request, session_id: str) -> dict[str, Any]:
    """A session's record: status, per-target results, files and artifacts."""
    record = _record_or_404(_sidecar(request), session_id)
    return record.model_dump(mode="json")


@router.get("/sessions")
def list_sessions(
    request: Request,
    run_id: str | None = None,
    trigger: str | None = None,
    status: str | None = None,
    since: Annotated[datetime | None, Query(description="Created at or after (ISO 8601).")] = None,
    until: Annotated[datetime | None, Query(description="Created before (ISO 8601).")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    """Sessions in the store, newest first, filtered by run, trigger, status and time.

    ``total``: the sessions that match; ``stored``: all sessions with a record;
    ``unrecorded``: session directories without one (still analysable).
    """
    from exporter.errors import UnavailableError
    from exporter.usecases import list_sessions

    try:
        return list_sessions(
            _sidecar(request).captures.store,
            run_id=run_id,
            trigger=trigger,
            status=status,
            since=None if since is None else _aware(since),
            until=None if until is None else _aware(until),
            limit=limit,
        )
    except UnavailableError as exc:  # the store does not answer: not "no sessions"
        raise HTTPException(503, str(exc)) from None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@router.get("/snapshots")
def snapshot_status(request: Request) -> dict[str, Any]:
    """Targets kept for snapshots: mode, windows kept, last error."""
    return {"snapshots": _sidecar(request).snapshots.status()}


@router.post("/snapshots/start", openapi_extra=openapi_body(SnapshotBody, False))
async def snapshot_start(request: Request) -> dict[str, Any]:
    """Keep snapshots of the chosen targets (continuous profiling or a ring of captures)."""
    sidecar = _sidecar(request)
    body = await _parse(request, SnapshotBody)
    targets = await run_in_threadpool(_select, sidecar, body)
    started = await run_in_threadpool(sidecar.snapshots.start, targets)
    return {"snapshots": started}


@router.post("/snapshots/stop", openapi_extra=openapi_body(SnapshotBody, False))
async def snapshot_stop(request: Request) -> dict[str, Any]:
    """Stop keeping snapshots of the chosen targets (default: all)."""
    sidecar = _sidecar(request)
    body = await _parse(request, SnapshotBody)
    addresses = None
    if body.targets is not None or body.run_id is not None:
        addresses = [t.address for t in await run_in_threadpool(_select, sidecar, body)]
    stopped = await run_in_threadpool(sidecar.snapshots.stop, addresses)
    return {"stopped": stopped}
