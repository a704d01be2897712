"""``POST /api/v1/alertmanager``: Alertmanager's webhook, starting captures on alerts.

Configure Alertmanager with a ``webhook_configs`` receiver whose URL is this endpoint
and whose ``http_config.authorization.credentials`` is ``MLPROF_AUTH_TOKEN``. Answers:

- ``202`` with ``sessions`` (ids started) and ``alerts`` (one outcome per alert, with
  the reason when nothing started: resolved, no action, duplicate, cooldown, no target…);
- ``401``/``403`` without or with a wrong bearer token (when a token is configured);
- ``400`` when the body is not JSON (or nests too deep, or holds text that is not valid
  Unicode), ``422`` when it is not a v4 payload (the message names the field), ``413``
  when it is larger than ``MLPROF_ALERT_MAX_BODY_BYTES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from exporter.api.auth import check_bearer
from exporter.api.body import read_limited
from exporter.api.json_body import openapi_body, parse_json_object
from exporter.capture.alerts import AlertmanagerPayload
from exporter.capture.events import alert_refused, alerts_received

if TYPE_CHECKING:
    from exporter.sidecar import Sidecar

__all__ = ["WEBHOOK_PATH", "describe_validation_error", "router"]

WEBHOOK_PATH = "/api/v1/alertmanager"

router = APIRouter(tags=["alerts"])


def _too_large(limit: int) -> str:
    return (
        f"body larger than {limit} bytes (MLPROF_ALERT_MAX_BODY_BYTES); "
        "lower max_alerts in Alertmanager's webhook_config"
    )


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each bad field, e.g. ``alerts[2].status: Input should be …``."""
    parts = []
    for error in exc.errors()[:5]:
        where = ""
        for part in error.get("loc", ()):
            where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
        parts.append(f"{where or 'body'}: {error.get('msg', 'invalid value')}")
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _parse(body: bytes) -> AlertmanagerPayload:
    data = parse_json_object(body)
    try:
        return AlertmanagerPayload.model_validate(data)
    except ValidationError as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,  # the deprecated _ENTITY name warned
            f"not an Alertmanager v4 webhook payload: {describe_validation_error(exc)}",
        ) from None


@router.post(
    WEBHOOK_PATH,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Alertmanager webhook: start captures for firing alerts with mlprof_action",
    openapi_extra=openapi_body(AlertmanagerPayload),
    responses={
        400: {"description": "body is not JSON"},
        401: {"description": "no bearer token"},
        403: {"description": "wrong bearer token"},
        413: {"description": "body too large"},
        422: {"description": "not an Alertmanager v4 payload"},
    },
)
async def alertmanager_webhook(request: Request) -> JSONResponse:
    """Start a capture for each firing alert with ``mlprof_action``; say why others were not."""
    sidecar: Sidecar = request.app.state.sidecar
    policy = sidecar.alerts
    try:
        check_bearer(request, sidecar.settings.token)
    except HTTPException as exc:
        policy.count("unauthorized")
        alert_refused(sidecar.events.emit, "unauthorized", str(exc.detail))
        raise
    try:
        limit = sidecar.settings.alert_max_body_bytes
        payload = _parse(await read_limited(request, limit, _too_large(limit)))
    except HTTPException as exc:
        outcome = "too_large" if exc.status_code == 413 else "malformed"
        policy.count(outcome)
        alert_refused(sidecar.events.emit, outcome, str(exc.detail))
        raise
    # Submitting writes session records to the store: keep blocking I/O off the loop.
    result = await run_in_threadpool(policy.handle, payload)
    alerts_received(sidecar.events.emit, payload, result)
    return JSONResponse(result.as_json(), status_code=status.HTTP_202_ACCEPTED)
