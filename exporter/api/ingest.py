"""Pyroscope's ingest API on the sidecar, for the workload's host profiler.

``POST /push.v1.PusherService/Push`` (Connect unary, what pyroscope-io >= 1.0 sends) and
``POST /ingest`` (the legacy API of older agents) take a profile from the workload and
forward it through the sidecar's Pyroscope sink: one network path, one spool and one
place for credentials. Answers:

- ``200`` when Pyroscope took it, or when it was spooled to be sent later;
- ``400`` for a body that is not what the format says (the message names what);
- ``401``/``403`` without or with a wrong bearer token (when ``MLPROF_AUTH_TOKEN`` is set);
- ``413`` beyond ``MLPROF_INGEST_MAX_BODY_BYTES``; ``415`` for another content type,
  encoding or format;
- ``429`` with ``Retry-After`` when ``MAX_CONCURRENT_INGESTS`` uploads are being parsed
  and as many wait already (each may inflate to tens of MiB), or when the bodies being
  received hold as many bytes as that many uploads could (a slot is taken once a body
  is in: a client trickling its body holds no slot, and only the bytes it sent);
- ``503`` when the sidecar has no Pyroscope (``MLPROF_PYROSCOPE_URL`` unset: answered
  before the body is read or parsed) or could neither deliver nor spool it;
  Pyroscope's own refusals come back with its status.

Push errors are Connect's JSON (``{"code", "message"}``), which the agents log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from exporter.api.admission import AdmissionPool, ByteBudget, app_budget, app_pool
from exporter.api.auth import check_bearer
from exporter.api.body import read_limited
from exporter.profiles.ingest import IngestError, push_from_connect, push_from_ingest
from exporter.proto import pyroscope_push_pb2
from exporter.sinks.pyroscope import PUSH_PATH, PushResult

if TYPE_CHECKING:
    from exporter.sidecar import Sidecar

__all__ = ["INGEST_PATH", "router"]

INGEST_PATH = "/ingest"
# Uploads parsed at once, and as many more waiting: an agent sends one every 10-15 s,
# and each may decompress to IngestLimits' tens of MiB (4 at once reached 8 GB before
# the per-request bounds). Beyond that: 429 with Retry-After.
MAX_CONCURRENT_INGESTS = 4
INGEST_RETRY_AFTER_S = 5
NO_PYROSCOPE = "the sidecar pushes no profiles: MLPROF_PYROSCOPE_URL is unset"
# Connect's error codes for the HTTP statuses these endpoints answer.
_CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    413: "resource_exhausted",
    415: "internal",
    429: "resource_exhausted",
    503: "unavailable",
}

router = APIRouter(tags=["profiles"])


class _RefusedError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _forward(sidecar: Sidecar, parse: Callable[[], pyroscope_push_pb2.PushRequest]) -> PushResult:
    """Parse an upload and forward it through the sink; a refusal raises ``_RefusedError``."""
    try:
        request = parse()
    except IngestError as exc:
        raise _RefusedError(exc.status, exc.message) from None
    sink = sidecar.pyroscope
    if sink is None:
        raise _RefusedError(503, NO_PYROSCOPE)
    result = sink.forward(request)
    if result.status == "rejected":
        raise _RefusedError(result.http_status or 400, f"Pyroscope refused it: {result.message}")
    if result.status == "dropped":
        raise _RefusedError(503, f"not delivered and not spooled: {result.message}")
    return result


def _budget(request: Request, sidecar: Sidecar) -> ByteBudget:
    # As many bytes as the uploads the pool admits could hold: the memory bound the
    # pool gave when slots were taken before reading.
    limit = sidecar.settings.ingest_max_body_bytes * 2 * MAX_CONCURRENT_INGESTS
    busy = f"profile uploads being received hold {limit} bytes"
    return app_budget(request.app, "ingest_budget", limit, busy, INGEST_RETRY_AFTER_S)


async def _body(request: Request, sidecar: Sidecar, budget: ByteBudget) -> bytes:
    limit = sidecar.settings.ingest_max_body_bytes
    return await read_limited(
        request,
        limit,
        f"profile upload larger than {limit} bytes (MLPROF_INGEST_MAX_BODY_BYTES)",
        budget,
    )


def _connect_error(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    code = _CONNECT_CODES.get(status, "unknown")
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)


def _pool(request: Request) -> AdmissionPool:
    return app_pool(request.app, "ingest_pool", MAX_CONCURRENT_INGESTS, MAX_CONCURRENT_INGESTS)


def _busy(pool: AdmissionPool) -> tuple[str, dict[str, str]]:
    message = (
        f"{pool.workers} profile uploads are being parsed and {pool.queue} wait: "
        f"try again in {INGEST_RETRY_AFTER_S}s"
    )
    return message, {"Retry-After": str(INGEST_RETRY_AFTER_S)}


@router.post(
    PUSH_PATH,
    summary="Pyroscope push API (Connect): forward the workload's profiles to Pyroscope",
    response_class=Response,
    responses={
        200: {"description": "delivered or spooled", "content": {"application/proto": {}}},
        400: {"description": "not a valid PushRequest"},
        413: {"description": "body too large"},
        415: {"description": "not application/proto, or an unknown encoding"},
        503: {"description": "Pyroscope is off in the sidecar, or delivery failed"},
    },
)
async def push(request: Request) -> Response:
    """Forward a ``PushRequest`` (as pyroscope-io's agent sends it) through the sink."""
    sidecar: Sidecar = request.app.state.sidecar
    try:
        check_bearer(request, sidecar.settings.token)
    except HTTPException as exc:
        return _connect_error(exc.status_code, str(exc.detail))
    if sidecar.pyroscope is None:  # before reading or parsing anything
        return _connect_error(503, NO_PYROSCOPE)
    budget = _budget(request, sidecar)
    try:
        body = await _body(request, sidecar, budget)
    except HTTPException as exc:
        return _connect_error(exc.status_code, str(exc.detail), dict(exc.headers or {}))
    try:
        pool = _pool(request)
        if not pool.admit():
            return _connect_error(429, *_busy(pool))
        try:
            ctype = request.headers.get("content-type", "")
            encoding = request.headers.get("content-encoding", "")
            await run_in_threadpool(
                pool.run,
                lambda: _forward(sidecar, lambda: push_from_connect(body, ctype, encoding)),
            )
        except _RefusedError as exc:
            return _connect_error(exc.status, exc.message)
        finally:
            pool.release()
    finally:
        budget.give(len(body))
    return Response(
        pyroscope_push_pb2.PushResponse().SerializeToString(), media_type="application/proto"
    )


@router.post(
    INGEST_PATH,
    summary="Pyroscope legacy ingest (?name=app{tags}&format=pprof|folded): forward to Pyroscope",
    responses={
        400: {"description": "bad query or body"},
        413: {"description": "body too large"},
        415: {"description": "multipart, or another format or encoding"},
        503: {"description": "Pyroscope is off in the sidecar, or delivery failed"},
    },
)
async def ingest(request: Request) -> JSONResponse:
    """Forward one legacy ``/ingest`` upload (older pyroscope-io agents) through the sink."""
    sidecar: Sidecar = request.app.state.sidecar
    check_bearer(request, sidecar.settings.token)
    if sidecar.pyroscope is None:  # before reading or parsing anything
        return JSONResponse({"detail": NO_PYROSCOPE}, status_code=503)
    budget = _budget(request, sidecar)
    body = await _body(request, sidecar, budget)
    try:
        pool = _pool(request)
        if not pool.admit():
            message, headers = _busy(pool)
            return JSONResponse({"detail": message}, status_code=429, headers=headers)
        try:
            query = dict(request.query_params)
            ctype = request.headers.get("content-type", "")
            encoding = request.headers.get("content-encoding", "")
            now_s = int(time.time())
            result = await run_in_threadpool(
                pool.run,
                lambda: _forward(
                    sidecar, lambda: push_from_ingest(query, body, ctype, encoding, now_s=now_s)
                ),
            )
        except _RefusedError as exc:
            return JSONResponse({"detail": exc.message}, status_code=exc.status)
        finally:
            pool.release()
    finally:
        budget.give(len(body))
    return JSONResponse({"status": result.status})
