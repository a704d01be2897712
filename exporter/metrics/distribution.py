"""Percentiles of libtpu's bucketed distributions, over a sliding window.

libtpu's latency metrics are cumulative distributions (counts since the runtime
started) in the Monarch/Cloud Monitoring layout: bucket 0 is the underflow, buckets
1..N the finite ones, bucket N+1 the overflow. A percentile over everything since the
start barely moves after hours of training, so :class:`DistributionWindow` subtracts
an earlier snapshot and reports the samples of the last ``window_s`` seconds (until a
snapshot that old exists, the samples since the start: the numbers ``tpu-info`` prints).

The percentile of ``q`` is the sample of rank ``floor(q * count)`` with linear
interpolation inside its bucket — the rank ``tpu-info`` uses, so both show the same
number for the same distribution. A rank in the underflow bucket reports that bucket's
upper bound, one in the overflow bucket its lower bound (as Prometheus'
``histogram_quantile`` does for ``+Inf``).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_FINITE_BUCKETS",
    "BadDistributionError",
    "Buckets",
    "DistributionWindow",
    "MonotonicTotals",
    "buckets_of",
]

# Snapshots kept per window: the window covers between window_s and window_s * (1 +
# 1/SNAPSHOTS_PER_WINDOW) + one interval, whatever the collect interval, with bounded
# memory (a 256-chip host keeps 256 x 11 small tuples per distribution).
SNAPSHOTS_PER_WINDOW: Final = 10
# libtpu's own distributions have tens of buckets. A runtime claiming more (200,000
# linear buckets on 4 chips took 1 GB of sidecar memory and 30 s per scrape) has
# adjacent buckets merged until at most this many finite ones remain: the percentiles
# lose resolution, the memory and the exposition stay bounded.
MAX_FINITE_BUCKETS: Final = 256


@dataclass(frozen=True, slots=True)
class Buckets:
    """A bucketed distribution: ``counts[0]`` underflow, ``counts[-1]`` overflow.

    ``bounds`` are the finite bucket boundaries (len(counts) - 1 of them, increasing).
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float  # sum of the samples (count x mean)
    count: int = -1  # sum of counts; computed when not given

    def __post_init__(self) -> None:
        if self.count < 0:
            object.__setattr__(self, "count", sum(self.counts))

    def percentile(self, q: float) -> float | None:
        """The value below which ``q`` of the samples fall; None without samples."""
        return self.percentiles([q])[0]

    def percentiles(self, qs: Sequence[float]) -> list[float | None]:
        """:meth:`percentile` of each of ``qs`` (increasing), in one pass over the buckets."""
        count = self.count
        if count <= 0:
            return [None] * len(qs)
        ranks = [math.floor(q * count) for q in qs]
        out: list[float | None] = []
        last = len(self.counts) - 1
        below, i = 0, 0
        for rank in ranks:
            # The bucket holding the sample of this rank: the first whose counts pass it.
            while i < last and below + self.counts[i] <= rank:
                below += self.counts[i]
                i += 1
            n = self.counts[i]
            if i == 0:
                out.append(self.bounds[0])
            elif i == last or n == 0:
                out.append(self.bounds[-1])
            else:
                lower, upper = self.bounds[i - 1], self.bounds[i]
                out.append(lower + (rank - below) / n * (upper - lower))
        return out

    def plus(self, other: Buckets) -> Buckets:
        """Both distributions' samples together; ``other`` is ignored if its layout differs."""
        if other.bounds != self.bounds or len(other.counts) != len(self.counts):
            return self
        counts = tuple(map(operator.add, self.counts, other.counts))
        return Buckets(self.bounds, counts, self.total + other.total, self.count + other.count)

    def minus(self, older: Buckets) -> Buckets | None:
        """The samples added since ``older``; None if this is not a continuation of it."""
        if older.bounds != self.bounds or len(older.counts) != len(self.counts):
            return None
        counts = tuple(map(operator.sub, self.counts, older.counts))
        if min(counts) < 0:
            return None  # the runtime restarted: counts went back
        total = max(0.0, self.total - older.total)
        return Buckets(self.bounds, counts, total, self.count - older.count)


class BadDistributionError(ValueError):
    """A distribution no runtime should send; ``reason`` labels the skip counter.

    ``layout``: unknown bucket options, or counts that do not fit them; ``overflow``:
    boundaries past a float's range; ``bounds``: boundaries not finite and increasing.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _kept(finite: int) -> tuple[int, ...]:
    """Indices of the boundaries kept when ``finite`` buckets are capped (all if under it)."""
    step = -(-finite // MAX_FINITE_BUCKETS)  # ceil: the buckets merged into one
    return (*range(0, finite, step), finite)


def _bounds(options: Any, finite: int, scale: float, divisor: float) -> tuple[float, ...]:
    """Kept finite boundaries of a libtpu ``BucketOptions`` (see :func:`_kept`)."""
    which = options.WhichOneof("options")
    if which == "exponential_buckets":
        exp = options.exponential_buckets
        return _regular("exp", exp.scale, exp.growth_factor, finite, scale, divisor)
    if which == "linear_buckets":
        lin = options.linear_buckets
        return _regular("lin", lin.offset, lin.width, finite, scale, divisor)
    if which == "explicit_buckets":
        given = options.explicit_buckets.bounds
        if len(given) != finite + 1:
            raise BadDistributionError("layout", f"{len(given)} bounds for {finite} finite buckets")
        return _checked(tuple(given[i] * scale / divisor for i in _kept(finite)))
    raise BadDistributionError("layout", f"bucket options {which or 'missing'}")


@functools.lru_cache(maxsize=256)
def _regular(
    kind: str, start: float, step: float, finite: int, scale: float, divisor: float
) -> tuple[float, ...]:
    """Exponential or linear boundaries; cached, as every collection repeats a few layouts.

    Only the kept ones are computed, so a cached entry holds at most
    MAX_FINITE_BUCKETS + 1 floats whatever the runtime claims.
    """
    try:
        if kind == "exp":
            values = tuple(start * step**i * scale / divisor for i in _kept(finite))
        else:
            values = tuple((start + step * i) * scale / divisor for i in _kept(finite))
    except OverflowError:  # step**i past 1.8e308 raises; a product merely becomes inf
        raise BadDistributionError("overflow", f"{kind} buckets {start!r} x {step!r}") from None
    if any(math.isinf(v) for v in values) and all(map(math.isfinite, (start, step))):
        raise BadDistributionError("overflow", f"{kind} buckets {start!r} x {step!r}")
    return _checked(values)


def _checked(bounds: tuple[float, ...]) -> tuple[float, ...]:
    """``bounds`` if finite and strictly increasing (``b <= a`` lets a NaN through: not this)."""
    if not all(map(math.isfinite, bounds)) or not all(map(operator.lt, bounds, bounds[1:])):
        raise BadDistributionError("bounds", "boundaries not finite and increasing")
    return bounds


def _merged(counts: tuple[int, ...], finite: int) -> tuple[int, ...]:
    """``counts`` with the finite buckets between kept boundaries summed."""
    kept = _kept(finite)
    if len(kept) == finite + 1:
        return counts
    inner = (sum(counts[1 + a : 1 + b]) for a, b in itertools.pairwise(kept))
    return (counts[0], *inner, counts[-1])


def buckets_of(distribution: Any, scale: float = 1.0, divisor: float = 1.0) -> tuple[Buckets, int]:
    """A libtpu ``Distribution`` message as :class:`Buckets`, values x ``scale`` / ``divisor``.

    Returns the buckets and how many finite buckets were merged away to keep at most
    MAX_FINITE_BUCKETS; raises :class:`BadDistributionError` for a value libtpu should not send.
    """
    counts = tuple(distribution.bucket_counts)
    if len(counts) < 2 or min(counts) < 0:
        raise BadDistributionError(
            "layout", f"{len(counts)} bucket counts, smallest {min(counts, default=0)}"
        )
    finite = len(counts) - 2
    bounds = _bounds(distribution.bucket_options, finite, scale, divisor)
    total = float(distribution.mean) * int(distribution.count) * scale / divisor
    merged = _merged(counts, finite)
    return Buckets(bounds, merged, total if math.isfinite(total) else 0.0), len(counts) - len(
        merged
    )


def _restarted(older: Buckets, newer: Buckets) -> bool:
    """Whether ``newer`` cannot continue ``older`` (cheap: counts and layout only)."""
    return newer.count < older.count or newer.bounds != older.bounds


class DistributionWindow:
    """The samples of the last ``window_s`` seconds of cumulative distributions, per key.

    >>> window = DistributionWindow(300.0, clock=lambda: 0.0)
    >>> window.recent("dcn/8MB+", Buckets((1.0, 2.0), (0, 4, 0), 6.0)).count
    4
    """

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self.window_s = window_s
        self._clock = clock
        self._every = window_s / SNAPSHOTS_PER_WINDOW
        self._history: dict[Hashable, deque[tuple[float, Buckets]]] = {}
        self._seen: dict[Hashable, float] = {}

    def recent(self, key: Hashable, current: Buckets) -> Buckets:
        """The part of ``current`` (cumulative) that arrived within the window."""
        now = self._clock()
        self._seen[key] = now
        history = self._history.setdefault(key, deque())
        if history and _restarted(history[-1][1], current):
            history.clear()  # restarted runtime or a new layout: start over
        horizon = now - self.window_s
        while len(history) > 1 and history[1][0] <= horizon:
            history.popleft()
        baseline = history[0][1] if history and history[0][0] <= horizon else None
        if not history or now - history[-1][0] >= self._every:
            history.append((now, current))
        if baseline is None:
            return current
        return current.minus(baseline) or current

    def forget_unseen(self) -> None:
        """Drop keys not updated for two windows (a buffer size or chip that went away)."""
        cutoff = self._clock() - 2 * self.window_s
        for key in [k for k, seen in self._seen.items() if seen < cutoff]:
            del self._seen[key]
            self._history.pop(key, None)


class MonotonicTotals:
    """``count x mean`` as a counter value: float rounding must never make it go back.

    A total that dips by one ulp would read as a counter reset to Prometheus, and
    ``rate()`` would add the whole total at once. Only a smaller count (a restarted
    runtime) lets the total fall.

    >>> totals = MonotonicTotals()
    >>> totals.total("k", 10, 1.0000000000000002), totals.total("k", 10, 1.0)
    (1.0000000000000002, 1.0000000000000002)
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, float]] = {}

    def total(self, key: Hashable, count: int, total: float) -> float:
        last = self._last.get(key)
        if last is not None and count >= last[0]:
            total = max(total, last[1])
        self._last[key] = (count, total)
        return total
