"""REST API of comparison and analysis: session reports, compare, baselines.

``GET /api/v1/sessions/{id}/report`` serves the session's ``analysis.json`` (or its
``summary.html`` with ``Accept: text/html``); ``GET /api/v1/compare`` compares two
sessions, runs or Pyroscope selections in a bounded child process, at most
``COMPARE_WORKERS`` at once with ``COMPARE_QUEUE`` more waiting (beyond that: 429 with
``Retry-After``); ``PUT
/api/v1/baselines/{workload}`` marks a workload's baseline session. Sides are session
ids, ``run:<id>`` or ``pyroscope:{...}``: never a file path, so nothing outside the
store is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from exporter.api.admission import AdmissionPool, app_pool
from exporter.api.auth import check_bearer
from exporter.api.json_body import parse_json_object
from exporter.capture.session import check_session_id
from exporter.errors import MlprofError, UnavailableError

if TYPE_CHECKING:
    from exporter.capture.store import SessionStore
    from exporter.sidecar import Sidecar

__all__ = ["router"]

MAX_BODY_BYTES = 4096
# Replicates a comparison may name in all: each is a capture the child reads.
MAX_SIDES = 32
# Comparison children at once, and requests waiting for one: each child may take
# MLPROF_REPORT_MAX_MEMORY_MB (4 GiB) for MLPROF_REPORT_TIMEOUT_S (300 s), so six at
# once filled an 8 GiB cgroup. Two keep a dashboard's pair of comparisons quick.
COMPARE_WORKERS = 2
COMPARE_QUEUE = 4
RETRY_AFTER_S = 10


def _compare_pool(request: Request) -> AdmissionPool:
    return app_pool(request.app, "compare_pool", COMPARE_WORKERS, COMPARE_QUEUE)


def _sidecar(request: Request) -> Sidecar:
    return request.app.state.sidecar  # type: ignore[no-any-return]


def require_token(request: Request) -> None:
    check_bearer(request, _sidecar(request).settings.token)


router = APIRouter(prefix="/api/v1", tags=["analysis"], dependencies=[Depends(require_token)])


def _wants_html(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept.split(",")[0]


def _session_or_error(sidecar: Sidecar, session_id: str) -> None:
    try:
        check_session_id(session_id)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if sidecar.captures.store.read_record(session_id) is None:
        raise HTTPException(404, f"no session {session_id!r} in the store")


@router.get("/sessions/{session_id}/report", response_model=None)
def get_report(request: Request, session_id: str) -> Response:
    """The session's analysis report: JSON, or the HTML page with ``Accept: text/html``.

    202 while the report is being made, 500 with the reason when the analysis failed.
    The store is the bucket's, anyone's who may write there: a report is streamed (a
    MiB at a time) and refused past MAX_REPORT_BYTES; an ``analysis-error.json`` is
    read bounded and parsed by the shared parser, a bad one still "the analysis
    failed: ..."; a store that does not answer is 503 in bounded time.
    """
    from exporter.pipeline.job import REPORT_HTML, REPORT_JSON
    from exporter.pipeline.worker import ERROR_FILE

    sidecar = _sidecar(request)
    store = sidecar.captures.store
    try:
        files = store.session_files(session_id)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    except OSError as exc:
        raise HTTPException(503, f"the session store does not answer: {exc}") from None
    _session_or_error(sidecar, session_id)
    directory = store.session_dir(session_id)
    if REPORT_JSON in files:
        html = _wants_html(request) and REPORT_HTML in files
        name = REPORT_HTML if html else REPORT_JSON
        return _stream_report(
            store, f"{directory}/{name}", "text/html; charset=utf-8" if html else "application/json"
        )
    if ERROR_FILE in files:
        failed = _analysis_error(store, directory)
        return JSONResponse({"detail": f"the analysis failed: {failed}"}, 500)
    record = store.read_record(session_id)
    if sidecar.settings.reports and record is not None and record.report is None:
        sidecar.reports(record, on_request=True)  # queued once; a no-op if it is already
    state = "pending" if sidecar.settings.reports else "off (MLPROF_REPORTS=false)"
    return JSONResponse(
        {"session_id": session_id, "report": state}, 202 if sidecar.settings.reports else 404
    )


def _stream_report(store: SessionStore, path: str, media_type: str) -> Response:
    """A report object streamed a MiB at a time: refused (500, counted) past its bound."""
    from exporter.capture.store import COPY_CHUNK_BYTES, MAX_REPORT_BYTES
    from exporter.regular_files import FileTooLargeError, NotRegularFileError

    stack = contextlib.ExitStack()
    try:
        handle = stack.enter_context(store.open_object(path, MAX_REPORT_BYTES))
    except (FileTooLargeError, NotRegularFileError) as exc:
        store.refuse(path, exc)
        raise HTTPException(500, f"the report is not served: {exc}") from None
    except FileNotFoundError:
        raise HTTPException(404, "the report was removed meanwhile") from None
    except OSError as exc:
        raise HTTPException(503, f"the session store does not answer: {exc}") from None

    def chunks() -> Iterator[bytes]:
        with stack:
            while chunk := handle.read(COPY_CHUNK_BYTES):
                yield chunk

    return StreamingResponse(chunks(), media_type=media_type)


def _analysis_error(store: SessionStore, directory: str) -> str:
    """What ``analysis-error.json`` says failed, or why it cannot say (one line)."""
    from exporter.capture.store import MAX_ERROR_BYTES
    from exporter.pipeline.worker import ERROR_FILE

    path = f"{directory}/{ERROR_FILE}"
    try:
        error = store.read_json(path, MAX_ERROR_BYTES, ERROR_FILE)
    except OSError as exc:
        return f"its record ({ERROR_FILE}) cannot be read: {exc}"
    said = None if error is None else error.get("error")
    if not isinstance(said, str):
        return f"its record ({ERROR_FILE}) is unreadable; the log or a new capture tells more"
    return said[:2000]


def _side(sidecar: Sidecar, value: str, name: str) -> str:
    from exporter.usecases import NoSuchSessionError, stored_side

    try:
        return stored_side(
            sidecar.captures.store,
            value,
            pyroscope=bool(sidecar.settings.pyroscope_url),
            field=name,
        )
    except NoSuchSessionError as exc:
        raise HTTPException(404, str(exc)) from None
    except UnavailableError as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except MlprofError as exc:
        raise HTTPException(422, str(exc)) from None


@router.get("/compare", response_model=None)
async def get_compare(
    request: Request,
    base: Annotated[list[str], Query(description="A base side (repeat: replicates)")],
    head: Annotated[list[str], Query(description="A head side (repeat: replicates)")],
    history: Annotated[
        list[str] | None, Query(description="An earlier run of the workload (repeat; 3+)")
    ] = None,
    kind: str | None = Query(None, pattern="^(device|host|memory)$"),
    top: int = Query(20, ge=1, le=500),
    time_from: str | None = Query(None, alias="from"),
    until: str | None = None,
) -> Response:
    """Compare two sides (JSON, or the differential flame graph with ``Accept: text/html``).

    Each side is a session id, ``run:<id>`` (``~N``: its N newest sessions) or
    ``pyroscope:{...}``; repeat ``base``/``head`` for several captures a side, and
    ``history`` for earlier runs of the workload whose spread judges the changes.
    """
    from exporter import usecases
    from exporter.pipeline.job import COMPARE_HTML, COMPARE_JSON, ChildLimits, in_child

    sidecar = _sidecar(request)
    history = history or []
    if len(base) + len(head) + len(history) > MAX_SIDES:
        raise HTTPException(422, f"at most {MAX_SIDES} sides in all (base, head and history)")
    bases = [_side(sidecar, value, "base") for value in base]
    heads = [_side(sidecar, value, "head") for value in head]
    earlier = [_side(sidecar, value, "history") for value in history]
    settings = sidecar.settings
    context = usecases.side_context(settings, time_from=time_from, time_until=until)
    options = ["--top", str(top), *(["--kind", kind] if kind else [])]
    options += [f"--base={b}" for b in bases] + [f"--head={h}" for h in heads]
    options += [f"--history={e}" for e in earlier]
    wanted = COMPARE_HTML if _wants_html(request) else COMPARE_JSON
    pool = _compare_pool(request)
    if not pool.admit():
        raise HTTPException(
            429,
            f"{pool.workers} comparisons are running and {pool.queue} waiting: "
            f"try again in {RETRY_AFTER_S}s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    try:
        found = await run_in_threadpool(
            pool.run,
            lambda: in_child(
                "compare",
                [],
                context,
                ChildLimits.from_settings(settings),
                options,
                read=[wanted],
            ),
        )
    except UnavailableError as exc:  # the child's deadline or no memory budget: busy
        raise HTTPException(503, str(exc), headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except MlprofError as exc:
        raise HTTPException(422, str(exc)) from None
    finally:
        pool.release()
    if wanted == COMPARE_HTML:
        return HTMLResponse(found[wanted].decode("utf-8"))
    return Response(found[wanted], media_type="application/json")


async def _body(request: Request) -> dict[str, Any]:
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise HTTPException(413, f"request body over {MAX_BODY_BYTES} bytes")
    # The shared parser: 400 for bad or too deeply nested JSON (never a RecursionError
    # as a 500), 422 for another JSON type.
    data = parse_json_object(raw or b"{}")
    if not isinstance(data.get("session_id"), str):
        raise HTTPException(422, 'expected {"session_id": "<a session id in the store>"}')
    return data


@router.put("/baselines/{workload}")
async def put_baseline(request: Request, workload: str) -> dict[str, Any]:
    """Mark a session as the baseline of ``workload`` (body ``{"session_id": ...}``)."""
    from exporter.analysis.sides.baselines import BaselineStore, check_name

    sidecar = _sidecar(request)
    try:
        check_name(workload)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    body = await _body(request)
    try:
        check_session_id(body["session_id"])
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    marks = BaselineStore(sidecar.captures.store)
    try:
        return await run_in_threadpool(marks.set, workload, body["session_id"], by="api")
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/baselines")
def list_baselines(request: Request) -> dict[str, Any]:
    """Every workload's baseline mark (503 when the store does not answer, in bounded time)."""
    from exporter.analysis.sides.baselines import BaselineStore

    try:
        return {"baselines": BaselineStore(_sidecar(request).captures.store).marks(strict=True)}
    except OSError as exc:
        raise HTTPException(503, f"the session store does not answer: {exc}") from None
