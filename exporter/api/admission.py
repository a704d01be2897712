"""Admission of expensive requests: a few at work, a few waiting, the rest refused.

The API's costly endpoints (comparisons in a child, profile uploads that inflate) each
hold an :class:`AdmissionPool` in ``app.state``: a request that finds every place taken
is answered at once (429 with ``Retry-After``) rather than queued without bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["AdmissionPool", "app_pool"]

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


def app_pool(app: Any, name: str, workers: int, queue: int) -> AdmissionPool:
    """The pool ``name`` of an app (``app.state.<name>``), made on first use."""
    pool = getattr(app.state, name, None)
    if pool is None:
        pool = AdmissionPool(workers, queue)
        setattr(app.state, name, pool)
    return pool
