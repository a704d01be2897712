"""Issue 31 (4, 7): clients that trickle request bodies, against the served sidecar.

A body has a deadline after its headers (408, then the connection is closed); an
upload takes its parsing slot once its body is in, so trickling clients hold none;
API requests beyond MAX_API_REQUESTS are refused at once while scrapes are answered;
a client that leaves mid-body leaves no traceback in the log.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from exporter.api.admission import MAX_API_REQUESTS
from exporter.api.header_timeout import header_timeout_protocol
from exporter.api.ingest import MAX_CONCURRENT_INGESTS
from tests.harness import free_port, wait_http, wait_until
from tests.sidecar_app import ServedSidecar, settings_in

pytestmark = pytest.mark.integration

# Bounds a read of an answer, so that a broken server fails the test rather than hangs
# it; never a measure of speed.
READ_BOUND_S = 20


def trickle(port: int, path: str, first: bytes = b"x") -> socket.socket:
    """A connection that sent a POST's headers and ``first`` of a 100,000-byte body."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
    )
    sock.sendall(head.encode() + first)
    return sock


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(READ_BOUND_S)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (message := await receive())["type"] == "http.request" and message["more_body"]:
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"read"})


@pytest.fixture(scope="module")
def quick_deadline() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        _read_body, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
        http=header_timeout_protocol(10.0, 0.2),
    )  # fmt: skip
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    wait_http(f"http://127.0.0.1:{port}/", timeout=30)
    yield port
    served.should_exit = True
    thread.join(30)


def test_a_body_past_its_deadline_is_answered_408_and_closed(quick_deadline: int) -> None:
    with trickle(quick_deadline, "/") as sock:
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b"request body not complete within 0.2s of its headers\n")


def test_a_body_sent_in_time_is_read(quick_deadline: int) -> None:
    reply = httpx.post(f"http://127.0.0.1:{quick_deadline}/", content=b"x" * 100_000)
    assert (reply.status_code, reply.text) == (200, "read")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServedSidecar]:
    settings = settings_in(tmp_path, pyroscope_url="http://127.0.0.1:9")
    with ServedSidecar(settings) as served:
        yield served


def in_flight(served: ServedSidecar) -> int:
    return len(served.server.server_state.tasks)


def test_trickling_uploads_hold_no_upload_slot(served: ServedSidecar) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    slow = [
        trickle(port, "/ingest?name=a&format=folded") for _ in range(2 * MAX_CONCURRENT_INGESTS)
    ]
    try:
        wait_until(lambda: in_flight(served) >= len(slow), what="the trickling uploads in the app")
        reply = httpx.post(
            f"{served.url}/ingest", params={"name": "a", "format": "folded"}, content=b"a;b 1\n",
            headers={"content-type": "text/plain"}, timeout=READ_BOUND_S,
        )  # fmt: skip
        # Was 429 ("4 profile uploads are being read and 4 wait") for as long as they trickled.
        assert reply.status_code == 200, reply.text
    finally:
        for sock in slow:
            sock.close()


def test_a_flood_of_api_requests_leaves_scrapes_answered(served: ServedSidecar) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    slow = [trickle(port, "/api/v1/alertmanager") for _ in range(MAX_API_REQUESTS)]
    try:
        wait_until(lambda: in_flight(served) >= len(slow), what="the flood in the app")
        scrape = httpx.get(f"{served.url}/metrics", timeout=READ_BOUND_S)
        assert scrape.status_code == 200
        refused = httpx.post(f"{served.url}/api/v1/alertmanager", json={}, timeout=READ_BOUND_S)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert refused.text == f"{MAX_API_REQUESTS} API requests in progress: try again in 5s\n"
    finally:
        for sock in slow:
            sock.close()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_client_leaving_mid_body_leaves_no_traceback(served: ServedSidecar) -> None:
    records = _Records()
    logging.getLogger("uvicorn.error").addHandler(records)
    try:
        port = int(served.url.rsplit(":", 1)[1])
        for path in ("/api/v1/alertmanager", "/ingest?name=a&format=folded"):
            sock = trickle(port, path)
            wait_until(lambda: in_flight(served) == 1, what="the request in the app")
            sock.close()
            wait_until(lambda: in_flight(served) == 0, what="the request to end")
    finally:
        logging.getLogger("uvicorn.error").removeHandler(records)
    assert not [m for m in records.messages if "Exception in ASGI application" in m]
