"""uvicorn's h11 protocol with a deadline for each request's headers.

uvicorn (0.54, h11) arms no timer while a request's headers arrive: a client that opens
a connection and sends half a request line is held for ever (slowloris; 1,100 such
connections were all still held after 27 s). :class:`HeaderTimeoutProtocol` closes a
connection whose request headers are not complete ``header_timeout_s`` after it opened,
or after the first bytes of a later request on a kept-alive connection. Idle kept-alive
connections are still closed by uvicorn's own ``timeout_keep_alive``.

>>> uvicorn.Config(app, http=header_timeout_protocol(10.0))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEADER_TIMEOUT_S", "HeaderTimeoutProtocol", "header_timeout_protocol"]

# Seconds a client has to send a request's line and headers. Go's servers are usually
# given 5-10 s (ReadHeaderTimeout), nginx 60 s; a scraper or curl sends them in one
# packet. 10 s also leaves a slow link room.
HEADER_TIMEOUT_S: Final = 10.0


class HeaderTimeoutProtocol(H11Protocol):
    """H11Protocol that closes connections whose request headers arrive too slowly."""

    header_timeout_s: float = HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """Arm the timer while the client is between requests; stop it once they came."""
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)
        elif not waiting:
            self._cancel_header_timer()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        # Still no complete request (a kept-alive connection that went idle is uvicorn's
        # keep-alive timer's to close, and then the transport is closing already).
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def header_timeout_protocol(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class with its header deadline set to ``timeout_s`` seconds."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})
