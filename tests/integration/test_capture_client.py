"""The CLI's API client against a server that is not (quite) a sidecar: one-line errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from exporter.api.client import ApiClient
from exporter.errors import InputError, MlprofError

pytestmark = pytest.mark.integration

ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "/html": (200, "text/html", b"<html>a login page</html>"),
    "/list": (422, "application/json", b'[{"loc": ["body"], "msg": "bad"}]'),
    "/detail": (404, "application/json", b'{"detail": "no session \'x\' in the store"}'),
    "/ok": (200, "application/json", b'{"targets": []}'),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code, kind, body = ANSWERS[self.path]
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass


@pytest.fixture
def client() -> Iterator[ApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = ApiClient(f"127.0.0.1:{server.server_address[1]}", timeout_s=10)
    yield api
    api.close()
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_a_non_json_success_is_a_clear_error(client: ApiClient) -> None:
    with pytest.raises(MlprofError, match=r"GET /html: 200 answer is not JSON \(text/html") as info:
        client.get("/html")
    assert f"is {client.base_url} an mlprof sidecar" in str(info.value)


def test_error_details_of_any_json_shape_are_one_line(client: ApiClient) -> None:
    # A list of validation errors is said field by field, not dumped (issue 11).
    with pytest.raises(InputError, match=r"^GET /list: 422 body: bad$"):
        client.get("/list")
    with pytest.raises(InputError, match="GET /detail: 404 no session 'x' in the store"):
        client.get("/detail")
    assert client.get("/ok") == {"targets": []}
