"""/metrics cache: rendered ahead of the expected scrape, in place when there is none."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporter.metrics.exposition import ExpositionCache
from tests.harness import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_renders_ahead_of_a_regular_scraper() -> None:
    clock = Clock()
    renders: list[float] = []

    def render(registry: CollectorRegistry) -> bytes:
        renders.append(clock.now)
        return f"render {len(renders)} at {clock.now}".encode()

    cache = ExpositionCache(
        CollectorRegistry(), max_age_s=1.0, render=render, clock=clock, ahead_above_s=0.0
    )
    try:
        assert cache.get() == b"render 1 at 0.0"  # first scrape: nothing cached, render now
        clock.now = 0.2
        assert cache.get() == b"render 1 at 0.0"  # young enough: served as is
        # The gap was 0.2 s: the next rendering comes before the next expected scrape.
        wait_until(lambda: cache.renders == 2, timeout=10, what="the rendering ahead")
        clock.now = 0.4
        assert cache.get() == b"render 2 at 0.2"
        assert cache.inline_renders == 1
        clock.now = 5.0  # a long pause: what is cached is too old to serve
        assert cache.get().startswith(b"render 3 at 5.0")
        assert cache.inline_renders == 2
    finally:
        cache.close()


def test_a_failing_rendering_ahead_is_not_served() -> None:
    clock = Clock()
    calls = {"n": 0}

    def render(registry: CollectorRegistry) -> bytes:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("collector broke")
        return b"ok %d" % calls["n"]

    cache = ExpositionCache(
        CollectorRegistry(), max_age_s=1.0, render=render, clock=clock, ahead_above_s=0.0
    )
    try:
        cache.get()
        clock.now = 0.1
        cache.get()
        wait_until(lambda: calls["n"] == 2, timeout=10, what="the failing rendering")
        clock.now = 0.2
        assert cache.get() == b"ok 3"  # rendered in place, not the stale first one
    finally:
        cache.close()


def test_get_cached_never_renders() -> None:
    clock = Clock()
    cache = ExpositionCache(
        CollectorRegistry(), max_age_s=1.0, render=lambda r: b"x", clock=clock, ahead_above_s=0.0
    )
    try:
        assert cache.get_cached() is None  # nothing yet: the caller renders in a thread
        assert cache.renders == 0
        assert cache.get() == b"x"
        assert cache.get_cached() == b"x"
        clock.now = 2.0
        assert cache.get_cached() is None
    finally:
        cache.close()


def test_cheap_renderings_are_never_cached() -> None:
    """A small sidecar shows a change on the very next scrape (read after write)."""
    from prometheus_client import Counter

    registry = CollectorRegistry()
    counter = Counter("alerts", "Alerts.", registry=registry)
    cache = ExpositionCache(registry, max_age_s=60.0)
    try:
        assert b"alerts_total 0.0" in cache.get()
        counter.inc()
        assert cache.get_cached() is None
        assert b"alerts_total 1.0" in cache.get()
        assert not cache.ahead
        assert cache.inline_renders == 2
    finally:
        cache.close()
