"""Latency distributions for the fake TPU runtime: libtpu's layout, realistic values.

libtpu reports latencies as cumulative distributions with exponential buckets (count,
mean, bucket counts since the runtime started). The fake keeps one per metric and
group (buffer size, or chip and core type) and adds samples as time passes: each
group draws from a log-normal around a median taken from tpu-info's documented output
(a v6e slice: 8 MB DCN transfers ~110 ms at p50, TCP min RTT ~36 us, delivery rate
~12 Gbit/s). A frame's ``latency_scale`` multiplies every latency (and divides the
delivery rate): a script can stage a DCN regression.

Counts are a deterministic function of elapsed time and the frames crossed, so a
test with a fixed clock sees fixed numbers.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

__all__ = [
    "BUCKET_GROWTH",
    "BUCKET_SCALE",
    "FINITE_BUCKETS",
    "HISTORY_S",
    "LatencyProfile",
    "RuntimeHistory",
]

# Exponential buckets: [1, 1.4) us, [1.4, 1.96) us, ... up to 1.4**40 us (0.7 s).
BUCKET_SCALE: Final = 1.0
BUCKET_GROWTH: Final = 1.4
FINITE_BUCKETS: Final = 40
# The runtime already ran this long when the fake starts, so the first read has samples.
HISTORY_S: Final = 600.0


@dataclass(frozen=True)
class LatencyProfile:
    """One group's samples: log-normal with ``median`` and ``sigma``, ``rate`` per second."""

    median: float  # in the metric's unit (us, or Mbit/s)
    sigma: float
    rate: float
    inverse: bool = False  # a rate, not a latency: latency_scale divides it


@lru_cache(maxsize=4096)
def _probabilities(median: float, sigma: float) -> tuple[float, ...]:
    """Share of samples in each bucket (underflow, finite..., overflow)."""
    bounds = [BUCKET_SCALE * BUCKET_GROWTH**i for i in range(FINITE_BUCKETS + 1)]
    cdf = [0.5 * (1 + math.erf(math.log(b / median) / (sigma * math.sqrt(2)))) for b in bounds]
    return (cdf[0], *(b - a for a, b in itertools.pairwise(cdf)), 1 - cdf[-1])


class _Accumulated:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0.0] * (FINITE_BUCKETS + 2)
        self.total = 0.0  # sum of the samples


class RuntimeHistory:
    """Cumulative distributions of every (metric, group), advanced to the clock on read.

    ``scale_at(t)`` gives the latency scale in force at monotonic time ``t``; frames
    change it every ``period_s``, so a read walks the frame boundaries it crossed.
    """

    def __init__(self, started: float, period_s: float, scale_at: Callable[[float], float]) -> None:
        self.started = started
        self.period_s = period_s
        self._scale_at = scale_at
        self._lock = threading.Lock()
        self._series: dict[tuple[object, ...], tuple[LatencyProfile, _Accumulated, float]] = {}

    def read(
        self, key: tuple[object, ...], profile: LatencyProfile, now: float
    ) -> tuple[list[int], int, float]:
        """(bucket counts, count, mean) of ``key``'s distribution at ``now``."""
        with self._lock:
            entry = self._series.get(key)
            if entry is None:
                acc = _Accumulated()
                self._add(acc, profile, HISTORY_S, self._scale_at(self.started))
                entry = (profile, acc, self.started)
            _, acc, upto = entry
            upto = self._advance(acc, profile, upto, now)
            self._series[key] = (profile, acc, upto)
            counts = [math.floor(c) for c in acc.counts]
            count = sum(counts)
            raw = sum(acc.counts)
            mean = acc.total / raw if raw else 0.0
            return counts, count, mean

    def _advance(
        self, acc: _Accumulated, profile: LatencyProfile, upto: float, now: float
    ) -> float:
        while upto < now:
            # Up to the next frame boundary: one latency scale per stretch.
            boundary = self.started + (math.floor((upto - self.started) / self.period_s) + 1) * (
                self.period_s
            )
            end = min(now, boundary)
            self._add(acc, profile, end - upto, self._scale_at(upto))
            upto = end
        return upto

    @staticmethod
    def _add(acc: _Accumulated, profile: LatencyProfile, seconds: float, scale: float) -> None:
        median = profile.median / scale if profile.inverse else profile.median * scale
        n = profile.rate * seconds
        for i, p in enumerate(_probabilities(median, profile.sigma)):
            acc.counts[i] += n * p
        acc.total += n * median * math.exp(profile.sigma**2 / 2)  # the log-normal's mean
