"""The FastAPI application: health, /metrics, and the routers of each capability."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from exporter import __version__
from exporter.api.auth import check_bearer
from exporter.sidecar import Sidecar

__all__ = ["create_app"]


def create_app(sidecar: Sidecar) -> FastAPI:
    """Build the app; its lifespan starts and stops the sidecar's background loops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await sidecar.start()
        try:
            yield
        finally:
            await sidecar.stop()

    app = FastAPI(
        title="mlprof-exporter",
        version=__version__,
        summary="ML workload metrics, profiles and captures for the Grafana stack.",
        lifespan=lifespan,
    )
    app.state.sidecar = sidecar
    token = sidecar.settings.token

    def require_token(request: Request) -> None:
        check_bearer(request, token)

    def require_metrics_token(request: Request) -> None:
        if sidecar.settings.metrics_auth:
            check_bearer(request, token)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process serves HTTP."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> JSONResponse:
        """Readiness: each component's state; 503 until the required ones ran once."""
        ready, components = sidecar.readiness()
        body = {"ready": ready, "components": components}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["metrics"], dependencies=[Depends(require_metrics_token)])
    def metrics() -> Response:
        """Prometheus exposition of every OpenTelemetry instrument."""
        return Response(generate_latest(sidecar.telemetry.registry), media_type=CONTENT_TYPE_LATEST)

    app.state.require_token = require_token
    return app
