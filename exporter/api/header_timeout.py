"""uvicorn's h11 protocol with a deadline for each request's headers, and one for its body.

uvicorn (0.54, h11) arms no timer while a request's headers arrive: a client that opens
a connection and sends half a request line is held for ever (slowloris; 1,100 such
connections were all still held after 27 s). :class:`HeaderTimeoutProtocol` closes a
connection whose request headers are not complete ``header_timeout_s`` after it opened,
or after the first bytes of a later request on a kept-alive connection. Idle kept-alive
connections are still closed by uvicorn's own ``timeout_keep_alive``.

The body has its own deadline, ``body_timeout_s`` after its headers: a client sending
one byte every 3 s held an upload slot for as long as it liked, and a route that never
reads the body (a 404) kept the connection open while each byte re-armed uvicorn's
keep-alive timer. A late body is answered ``408`` (if nothing was answered yet) and the
connection closed; the route sees the client gone.

>>> uvicorn.Config(app, http=header_timeout_protocol(10.0, 30.0))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["BODY_TIMEOUT_S", "HEADER_TIMEOUT_S", "HeaderTimeoutProtocol", "header_timeout_protocol"]

# Seconds a client has to send a request's line and headers. Go's servers are usually
# given 5-10 s (ReadHeaderTimeout), nginx 60 s; a scraper or curl sends them in one
# packet. 10 s also leaves a slow link room.
HEADER_TIMEOUT_S: Final = 10.0
# Seconds a client has to send a request's whole body once its headers are in. The
# largest body the API takes (MLPROF_INGEST_MAX_BODY_BYTES' 16 MiB default) needs a
# link of 4.5 Mbit/s; a workload's agent on the same node or cluster sends it in well
# under a second, Alertmanager its webhook in one write.
BODY_TIMEOUT_S: Final = 30.0
_LATE_BODY: Final = b"request body not complete within %gs of its headers\n"


class HeaderTimeoutProtocol(H11Protocol):
    """H11Protocol that closes connections whose request headers arrive too slowly."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already received
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """Arm the timers while the client is between requests or sending a body."""
        closing = self.transport.is_closing()
        waiting = self.conn.their_state is h11.IDLE and not closing
        if waiting and self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)
        elif not waiting:
            self._cancel_header_timer()
        sending = self.conn.their_state is h11.SEND_BODY and not closing
        if sending and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_too_slow)
        elif not sending:
            self._cancel_body_timer()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_too_slow(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        cycle = self.cycle
        if (
            cycle is not None
            and not cycle.response_started
            and self.conn.our_state is h11.SEND_RESPONSE
        ):
            message = _LATE_BODY % self.body_timeout_s
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(message)).encode()),
                (b"connection", b"close"),
            ]
            self.transport.write(self.conn.send(h11.Response(status_code=408, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=message)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        if cycle is not None:
            # The route's later answer goes nowhere; its receive() says the client left.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

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


def header_timeout_protocol(
    timeout_s: float, body_timeout_s: float = BODY_TIMEOUT_S
) -> type[HeaderTimeoutProtocol]:
    """The protocol class with its header and body deadlines set, in seconds."""
    deadlines = {"header_timeout_s": timeout_s, "body_timeout_s": body_timeout_s}
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), deadlines)
