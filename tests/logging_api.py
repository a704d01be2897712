"""A stand-in of Cloud Logging's ``entries:write`` (REST v2) for tests (never shipped).

Serves ``POST /v2/entries:write`` on 127.0.0.1 and checks requests as the API does for
what the sidecar sends: a JSON body with ``entries``; each entry with a ``logName`` of
the form ``projects/<project>/logs/<name>`` (its own or the request's), a monitored
``resource`` with a ``type``, exactly one payload (``jsonPayload``, ``textPayload`` or
``protoPayload``), a ``severity`` of the LogSeverity enum, string-to-string ``labels``
and an RFC 3339 ``timestamp``. A bad request is answered 400 with Google's error JSON.
``hold()`` makes requests wait until ``release()`` (an endpoint that stopped answering).

The real client (google-cloud-logging, HTTP transport, anonymous credentials) talks
to it in the tests: ``Client(project=..., credentials=AnonymousCredentials(),
client_options={"api_endpoint": standin.url}, _use_grpc=False)``.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.http_standin import HttpStandIn

__all__ = ["LoggingApiStandIn"]

WRITE_PATH = "/v2/entries:write"
LOG_NAME_RE = re.compile(r"^projects/[^/]+/logs/[A-Za-z0-9_./%-]{1,512}$")
SEVERITIES = frozenset(
    {"DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"}
)
PAYLOADS = ("jsonPayload", "textPayload", "protoPayload")


class _BadRequestError(Exception):
    pass


def _check_entry(entry: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    merged = {**{k: v for k, v in defaults.items() if k in ("logName", "resource")}, **entry}
    if not LOG_NAME_RE.match(str(merged.get("logName", ""))):
        raise _BadRequestError(f"invalid logName {merged.get('logName')!r}")
    resource = merged.get("resource")
    if not isinstance(resource, dict) or not resource.get("type"):
        raise _BadRequestError("entry has no monitored resource type")
    if sum(1 for key in PAYLOADS if key in merged) != 1:
        raise _BadRequestError("an entry needs exactly one payload")
    severity = merged.get("severity", "DEFAULT")
    if severity not in SEVERITIES:
        raise _BadRequestError(f"invalid severity {severity!r}")
    labels = {**defaults.get("labels", {}), **merged.get("labels", {})}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise _BadRequestError("labels must map strings to strings")
    merged["labels"] = labels
    if "timestamp" in merged:
        datetime.fromisoformat(str(merged["timestamp"]).replace("Z", "+00:00"))
    return merged


class LoggingApiStandIn(HttpStandIn):
    """``entries`` lists every entry accepted (request defaults merged in)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.requests = 0
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._open = threading.Event()
        self._open.set()
        super().__init__()

    def stop(self) -> None:
        self.release()
        super().stop()

    def hold(self) -> None:
        """Keep every request waiting (until ``release``), as a hung endpoint does."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.entries) >= count, timeout):
                raise AssertionError(
                    f"stand-in got {len(self.entries)} entries, expected {count}; "
                    f"errors: {self.errors}"
                )
            return list(self.entries)

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        self._open.wait()
        with self._cond:
            self.requests += 1
        try:
            if handler.path.split("?")[0] != WRITE_PATH:
                self._reply(handler, 404, {"error": {"code": 404, "status": "NOT_FOUND"}})
                return
            body = json.loads(raw)
            entries = body.get("entries")
            if not isinstance(entries, list) or not entries:
                raise _BadRequestError("entries: expected at least one entry")
            accepted = [_check_entry(entry, body) for entry in entries]
        except (ValueError, _BadRequestError) as exc:
            with self._cond:
                self.errors.append(str(exc))
            error = {"code": 400, "message": str(exc), "status": "INVALID_ARGUMENT"}
            self._reply(handler, 400, {"error": error})
            return
        with self._cond:
            self.entries.extend(accepted)
            self._cond.notify_all()
        self._reply(handler, 200, {})
