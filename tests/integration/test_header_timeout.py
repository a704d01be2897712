"""Issue 22 (9): a connection that never finishes its request headers is closed
(uvicorn's h11 alone held 1,100 of them, all still open after 27 s)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from exporter.api.header_timeout import HeaderTimeoutProtocol, header_timeout_protocol
from tests.harness import free_port, wait_http
from tests.sidecar_app import settings_in

pytestmark = pytest.mark.integration

# Bounds a read of an answer, so that a broken server fails the test rather than hangs
# it; never a measure of speed (the close comes ~0.2 s after the last byte).
READ_BOUND_S = 60


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    headers = [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        _hello, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
        http=header_timeout_protocol(0.2),
    )  # fmt: skip
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    wait_http(f"http://127.0.0.1:{port}/", timeout=30)
    yield port
    served.should_exit = True
    thread.join(30)


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(READ_BOUND_S)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_half_sent_headers_are_closed(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert _read_all(sock) == b""  # closed by the server, without an answer


def test_a_request_sent_in_parts_is_still_answered_and_kept_alive(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: ")
        sock.sendall(b"127.0.0.1\r\n\r\n")
        sock.settimeout(READ_BOUND_S)
        first = b""
        while not first.endswith(b"hello") and (chunk := sock.recv(65536)):
            first += chunk
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"hello")
        # A later request on the kept-alive connection that stops halfway is closed too.
        sock.sendall(b"GET / HTTP/1.1\r\n")
        assert _read_all(sock) == b""


def test_mlprof_serve_uses_the_header_deadline(tmp_path: Path) -> None:
    from exporter.cli import _build_server

    server = _build_server(settings_in(tmp_path))
    assert issubclass(server.config.http, HeaderTimeoutProtocol)
