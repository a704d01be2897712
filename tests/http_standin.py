"""An HTTP server on 127.0.0.1 in a thread: the base of the tests' stand-ins for outside
services (never shipped).

A subclass answers each ``POST`` in :meth:`HttpStandIn._handle`; ``with`` (or
``start()``/``stop()``) runs and stops the server.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

__all__ = ["HttpStandIn"]


class HttpStandIn:
    """Serves on ``port`` (0: any free one) until :meth:`stop`."""

    def __init__(self, port: int = 0) -> None:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                return

            def do_POST(self) -> None:
                standin._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        """Answer one ``POST``."""
        raise NotImplementedError
