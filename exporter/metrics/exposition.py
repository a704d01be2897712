"""``/metrics``: rendered per scrape, or ahead of the scrape when rendering is expensive.

Rendering the registry goes through the OpenTelemetry SDK (callbacks, aggregation,
translation) and costs ~15 us per series: ~1 ms for a sidecar with a few chips, but
~16 ms for 256 TPU chips (1,024 series), more than a scrape should wait.

While a rendering costs less than ``ahead_above_s`` of CPU, every scrape renders in
place: /metrics shows a change as soon as it happens. Above that, scrapers come at a
fixed interval, so after each scrape the next rendering is scheduled for shortly
before the next one is expected (the last gap minus a lead) and the scrape only
copies bytes. The device values were already as old as the collect interval; a
rendering younger than ``max_age_s`` adds at most that. A scrape that finds none
(the first, or an irregular scraper) renders in place. Either way: one rendering
per scrape, none when nobody scrapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

__all__ = ["ExpositionCache"]

MAX_LEAD_S = 0.5  # render this long before the predicted scrape (bounded by gap / 2)
MAX_PREDICTED_GAP_S = 600.0  # beyond this a "gap" is a pause, not a scrape interval
# Render ahead only when a rendering costs more CPU than this (~200 series): with the
# HTTP path's ~1.5 ms it would use up the 5 ms scrape budget. Below it, read-after-write
# beats a millisecond or two.
AHEAD_ABOVE_S = 0.003


class ExpositionCache:
    """The text of ``registry`` for scrapes, rendered ahead of the expected scrape.

    >>> cache = ExpositionCache(registry, max_age_s=1.0)  # doctest: +SKIP
    >>> body = cache.get()  # doctest: +SKIP
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        max_age_s: float,
        render: Callable[[CollectorRegistry], bytes] = generate_latest,
        clock: Callable[[], float] = time.monotonic,
        ahead_above_s: float = AHEAD_ABOVE_S,
    ) -> None:
        self.registry = registry
        self.max_age_s = max_age_s
        self.ahead_above_s = ahead_above_s
        self.ahead = False  # rendering ahead of scrapes (the last rendering was expensive)
        self._render_fn = render
        self._clock = clock
        self._render_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._body: bytes | None = None
        self._rendered_at = float("-inf")
        self._last_scrape: float | None = None
        self._timer: threading.Timer | None = None
        self._closed = False
        self.renders = 0  # how many renderings were made (tests, bench)
        self.inline_renders = 0  # how many a scrape waited for

    def get_cached(self) -> bytes | None:
        """The exposition if a young enough one is cached (never renders), else None."""
        now = self._clock()
        with self._state_lock:
            body = self._fresh(now)
        if body is not None:
            self._schedule(now)
        return body

    def _fresh(self, now: float) -> bytes | None:
        if not self.ahead or now - self._rendered_at > self.max_age_s:
            return None
        return self._body

    def get(self) -> bytes:
        """The exposition for a scrape arriving now."""
        now = self._clock()
        with self._state_lock:
            body = self._fresh(now)
        if body is None:
            self.inline_renders += 1
            # Ahead mode: a rendering under way (started within max_age) will do.
            body = self._render(newer_than=now - self.max_age_s if self.ahead else now)
        self._schedule(now)
        return body

    def _render(self, newer_than: float = float("-inf")) -> bytes:
        with self._render_lock:
            with self._state_lock:
                if self._body is not None and self._rendered_at >= newer_than:
                    return self._body  # rendered while this caller waited for the lock
            started, cpu = self._clock(), time.thread_time()
            body = self._render_fn(self.registry)
            cost = time.thread_time() - cpu  # CPU, not wall: waiting for the GIL is not cost
            with self._state_lock:
                self._body, self._rendered_at = body, started
                self.ahead = cost >= self.ahead_above_s
                self.renders += 1
            return body

    def _schedule(self, now: float) -> None:
        with self._state_lock:
            last, self._last_scrape = self._last_scrape, now
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if last is None or self._closed or not self.ahead:
                return
            gap = now - last
            if not 0 < gap <= MAX_PREDICTED_GAP_S:
                return
            delay = max(0.0, gap - min(MAX_LEAD_S, gap / 2))
            timer = threading.Timer(delay, self._render_ahead)
            timer.daemon = True
            self._timer = timer
        timer.start()

    def _render_ahead(self) -> None:
        try:
            self._render(newer_than=self._clock())
        except Exception:  # the scrape will render in place and show the error
            with self._state_lock:
                self._body = None

    def close(self) -> None:
        with self._state_lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
