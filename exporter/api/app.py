"""The FastAPI application: health, /metrics, and the routers of each capability."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Depends, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.middleware.trustedhost import TrustedHostMiddleware

from exporter import __version__
from exporter.api.admission import ApiRequestCap
from exporter.api.alertmanager import router as alertmanager_router
from exporter.api.analysis import router as analysis_router
from exporter.api.auth import check_bearer
from exporter.api.captures import router as captures_router
from exporter.api.ingest import router as ingest_router
from exporter.api.ui import router as ui_router
from exporter.errors import MlprofError
from exporter.pipeline.memory_watcher import (
    MEMORY_REQUEST_ID,
    answers_to,
    request_memory_profile,
)
from exporter.profiles import xspace
from exporter.sidecar import Sidecar

__all__ = ["create_app"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# ``?format=`` values a reader may ask for in a link, and the Accept header they mean.
FORMAT_ACCEPT = {"json": b"application/json", "html": b"text/html"}


class ExplicitFormatWins:
    """On GET, ``?format=json`` (or ``html``) replaces the request's Accept header.

    A browser following the report's "JSON" link sends ``Accept: text/html,...``; what
    the link asks for explicitly wins over what the browser prefers. (``format`` on
    POST is the Pyroscope ingest's body format and is left alone.)
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            accept = FORMAT_ACCEPT.get((query.get("format") or [""])[-1].lower())
            if accept is not None:
                headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"accept"]
                scope = {**scope, "headers": [*headers, (b"accept", accept)]}
        await self.app(scope, receive, send)


def create_app(sidecar: Sidecar) -> FastAPI:
    """Build the app; its lifespan starts and stops the sidecar's background loops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await sidecar.start()
        try:
            yield
        finally:
            await sidecar.stop()

    # /docs and /redoc load Swagger UI and ReDoc from the installed fastapi-offline
    # package, not a CDN: they work in an air-gapped cluster.
    app = FastAPIOffline(
        title="mlprof-exporter",
        version=__version__,
        summary="ML workload metrics, profiles and captures for the Grafana stack.",
        lifespan=lifespan,
    )
    app.state.sidecar = sidecar
    token = sidecar.settings.token

    @app.middleware("http")
    async def refuse_cross_origin_writes(request: Request, call_next: Any) -> Response:
        """Refuse state-changing requests a browser sends from another site.

        On loopback without a token, any web page could otherwise POST to the sidecar;
        browsers always send ``Origin`` on cross-site POSTs, Alertmanager and curl never do.
        """
        origin = request.headers.get("origin")
        # Hosts, not schemes: behind a TLS-terminating proxy the page is https and the
        # sidecar sees http, yet they are the same site.
        if (
            request.method not in SAFE_METHODS
            and origin is not None
            and urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()
        ):
            return JSONResponse(
                {"detail": f"cross-origin request from {origin} refused"}, status_code=403
            )
        response: Response = await call_next(request)
        return response

    # Added last, so it runs first. DNS rebinding: a page on attacker.example, whose name
    # is made to resolve to 127.0.0.1, reaches the sidecar with ``Host:
    # attacker.example`` and a matching Origin, which the origin check above accepts.
    # Only the names the sidecar is known by are answered (MLPROF_ALLOWED_HOSTS).
    app.add_middleware(ExplicitFormatWins)
    app.add_middleware(
        TrustedHostMiddleware, allowed_hosts=sidecar.settings.trusted_hosts, www_redirect=False
    )
    # Outermost: API requests past MAX_API_REQUESTS are refused before any other work,
    # and scrapes are never counted among them (a flood must not stall /metrics).
    app.add_middleware(ApiRequestCap)

    def require_token(request: Request) -> None:
        check_bearer(request, token)

    async def require_metrics_token(request: Request) -> None:  # async: no thread per scrape
        if sidecar.settings.metrics_auth:
            check_bearer(request, token)

    # Health answers from the event loop: they must not wait for a worker thread, which
    # may all be busy (or stuck) when something else goes wrong.
    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process serves HTTP."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Readiness: each component's state; 503 until the required ones ran once, or
        while one is stalled. ``waiting``: working, no data yet (no workload seen)."""
        ready, components = sidecar.readiness()
        body = {"ready": ready, "version": __version__, "decoder": xspace.DECODER,
                "components": components}  # fmt: skip
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["metrics"], dependencies=[Depends(require_metrics_token)])
    async def metrics() -> Response:
        """Prometheus exposition of every OpenTelemetry instrument."""
        # Cached bytes are served from the event loop; a rendering runs in a worker thread.
        cache = sidecar.exposition
        body = cache.get_cached() or await run_in_threadpool(cache.get)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/api/v1/memory-profiles",
        status_code=202,
        tags=["profiles"],
        dependencies=[Depends(require_token)],
    )
    def post_memory_profile() -> JSONResponse:
        """Ask the workload (SDK) for a device-memory profile; it is pushed when it appears."""
        try:
            request_id = request_memory_profile(sidecar.settings.shared_dir)
        except MlprofError as exc:  # e.g. requests/ made a link: one line, no traceback
            return JSONResponse({"detail": str(exc)}, 500)
        return JSONResponse(
            {"request_id": request_id, "status_url": f"/api/v1/memory-profiles/{request_id}"},
            202,
        )

    @app.get(
        "/api/v1/memory-profiles/{request_id}",
        tags=["profiles"],
        dependencies=[Depends(require_token)],
    )
    def get_memory_profile(request_id: str) -> JSONResponse:
        """The profiles written in answer to a request (empty while the workload works)."""
        if not MEMORY_REQUEST_ID.fullmatch(request_id):
            return JSONResponse({"detail": "expected a request id like 1700000000-0a1b2c3d"}, 404)
        found = answers_to(sidecar.settings.shared_dir, request_id)
        watcher = sidecar.memory_profiles
        # Processed is recorded before a conversion: the one converting now is pending.
        done = [
            p.name for p in found if p.name in watcher.processed and p.name != watcher.converting
        ]
        errors = {name: watcher.failed[name] for name in done if name in watcher.failed}
        state = "pending"
        if found and len(done) == len(found):
            state = "failed" if errors else "converted"
        body: dict[str, object] = {
            "request_id": request_id,
            "state": state,
            "profiles": [p.name for p in found],
        }
        if errors:
            body["errors"] = errors
        return JSONResponse(body)

    app.state.require_token = require_token
    app.include_router(alertmanager_router)  # checks the token itself (counts refusals)
    app.include_router(captures_router)  # targets, captures, sessions, snapshots
    app.include_router(ui_router)  # the capture page Grafana links to
    app.include_router(ingest_router)  # Pyroscope ingest for the workload's host profiler
    app.include_router(analysis_router)  # session reports, compare, baselines
    return app
