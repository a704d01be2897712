"""``GET /ui/capture``: a small page that starts a capture, for links from Grafana.

A dashboard link cannot POST, so it opens this page with the run and hosts filled in;
the person presses *Capture* and the page calls ``POST /api/v1/captures`` (same origin,
bearer token typed by the person when the sidecar has one) and follows the session.
The page holds no data: serving it needs no token.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

__all__ = ["router"]

router = APIRouter(tags=["ui"])

# Read once at import: the page is static; only the JSON blob in it varies.
_PAGE = (Path(__file__).with_name("capture.html")).read_text(encoding="utf-8")


@router.get("/ui/capture", response_class=HTMLResponse, include_in_schema=True)
def capture_page(
    request: Request, run_id: str = "", host: str = "", duration_ms: int | None = None
) -> HTMLResponse:
    """The capture form, prefilled from ``run_id``, ``host`` (comma-separated) and duration."""
    sidecar = request.app.state.sidecar
    # "All" is what Grafana sends for a multi-value variable with everything selected.
    hosts = "" if host.strip() in ("", "All", "$__all") else host
    init = {
        "run_id": run_id,
        "hosts": hosts,
        "duration_ms": duration_ms,
        "token_required": sidecar.settings.token is not None,
        "base": request.scope.get("root_path", "").rstrip("/") + "/",  # behind a proxy prefix
    }
    # Values reach the page only as JSON inside a non-executed script element; "<" is
    # escaped so that no value can close that element.
    blob = json.dumps(init).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    # Never framed: the page may hold a token in sessionStorage (clickjacking).
    headers = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}
    return HTMLResponse(_PAGE.replace("__INIT__", blob), headers=headers)
