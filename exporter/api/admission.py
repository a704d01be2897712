"""Admission of expensive requests: a few at work, a few waiting, the rest refused.

The API's costly endpoints (comparisons in a child, profile uploads that inflate) each
hold an :class:`AdmissionPool` in ``app.state``: a request that finds every place taken
is answered at once (429 with ``Retry-After``) rather than queued without bound.
Profile uploads take their place once their body is in: a client trickling a body
cannot hold one. What their bodies hold meanwhile is bounded in bytes
(:class:`ByteBudget`), which a trickle barely touches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

from fastapi import HTTPException

__all__ = [
    "MAX_API_REQUESTS",
    "SCRAPE_PATHS",
    "AdmissionPool",
    "ApiRequestCap",
    "ByteBudget",
    "app_budget",
    "app_pool",
]

# API requests (all but scrapes and health checks) in the app at once. A sidecar serves
# a few clients (the CLI, a capture page, Alertmanager, one profiler agent); 1,500
# connections trickling bodies to the webhook had stalled /metrics for 9 s while each
# went through the middleware stack. Beyond this they are answered 503 at once.
MAX_API_REQUESTS: Final = 64
API_RETRY_AFTER_S: Final = 5
# Prometheus' scrape and the probes keep their own capacity: never counted, never refused.
SCRAPE_PATHS: Final = frozenset({"/metrics", "/healthz", "/readyz"})

T = TypeVar("T")


class AdmissionPool:
    """At most ``workers`` jobs at once and ``queue`` more waiting; ``admit`` refuses beyond.

    >>> pool = AdmissionPool(workers=2, queue=4)
    >>> if pool.admit():
    ...     try:
    ...         print(pool.run(lambda: 42))
    ...     finally:
    ...         pool.release()
    42
    """

    def __init__(self, workers: int, queue: int) -> None:
        self.workers = workers
        self.queue = queue
        self._running = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self.admitted = 0  # running or waiting
        self.refused = 0

    def admit(self) -> bool:
        """Take a place (running or waiting); False when every place is taken."""
        with self._lock:
            if self.admitted >= self.workers + self.queue:
                self.refused += 1
                return False
            self.admitted += 1
            return True

    def release(self) -> None:
        """Give the place back (in ``finally``, once per successful ``admit``)."""
        with self._lock:
            self.admitted -= 1

    def run(self, job: Callable[[], T]) -> T:
        """Run ``job`` once a worker is free (the caller has been admitted)."""
        with self._running:
            return job()


class ByteBudget:
    """Bytes that request bodies being read (and not yet done with) may hold together.

    >>> budget = ByteBudget(1024, "uploads hold 1 KiB", retry_after_s=5)
    >>> budget.take(1000), budget.take(100)
    (True, False)
    """

    def __init__(self, limit: int, busy: str, retry_after_s: int) -> None:
        self.limit = limit
        self.busy = busy
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self.held = 0

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing held) when that would pass the limit."""
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken before."""
        with self._lock:
            self.held -= n

    def refusal(self) -> HTTPException:
        """429 with ``Retry-After``, saying what is spent."""
        headers = {"Retry-After": str(self.retry_after_s)}
        return HTTPException(429, f"{self.busy}: try again in {self.retry_after_s}s", headers)


def app_budget(app: Any, name: str, limit: int, busy: str, retry_after_s: int) -> ByteBudget:
    """The byte budget ``name`` of an app (``app.state.<name>``), made on first use."""
    budget = getattr(app.state, name, None)
    if budget is None:
        budget = ByteBudget(limit, busy, retry_after_s)
        setattr(app.state, name, budget)
    return budget


def app_pool(app: Any, name: str, workers: int, queue: int) -> AdmissionPool:
    """The pool ``name`` of an app (``app.state.<name>``), made on first use."""
    pool = getattr(app.state, name, None)
    if pool is None:
        pool = AdmissionPool(workers, queue)
        setattr(app.state, name, pool)
    return pool


class ApiRequestCap:
    """ASGI middleware: at most ``limit`` API requests in the app; scrapes never wait on them.

    The answer beyond is built here, before the app's middleware, and closes the
    connection: refusing must cost less than serving.
    """

    def __init__(self, app: Any, limit: int = MAX_API_REQUESTS) -> None:
        self.app = app
        self.limit = limit
        self.active = 0  # one event loop: no lock
        self.refused = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in SCRAPE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            self.refused += 1
            body = (
                f"{self.limit} API requests in progress: try again in {API_RETRY_AFTER_S}s\n"
            ).encode()
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(API_RETRY_AFTER_S).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
