"""Interval arithmetic behind the step breakdown, against a naive reference."""

from __future__ import annotations

import random

import numpy as np

from exporter.analysis.facts import _covered, _subtract, _union


def naive_covered(starts: list[int], ends: list[int], lo: int, hi: int) -> int:
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in zip(starts, ends, strict=True))


def test_covered_and_subtract_match_a_naive_sweep() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randrange(0, 30)
        starts = np.array([rng.randrange(0, 1000) for _ in range(n)], np.int64)
        ends = starts + np.array([rng.randrange(1, 100) for _ in range(n)], np.int64)
        merged = _union(starts, ends)
        cut = _union(starts[::2] + 5, starts[::2] + 40)
        rest = _subtract(*merged, *cut)
        spans = [(lo, lo + rng.randrange(0, 300)) for lo in
                 (rng.randrange(-50, 1100) for _ in range(rng.randrange(1, 8)))]  # fmt: skip
        for (lo, hi), got in zip(spans, _covered(*merged, spans).tolist(), strict=True):
            assert got == naive_covered(merged[0].tolist(), merged[1].tolist(), lo, hi)
        for lo, hi in spans:
            whole = naive_covered(merged[0].tolist(), merged[1].tolist(), lo, hi)
            removed = sum(
                naive_covered([a], [b], lo, hi)
                for a, b in zip(*_union(*_intersect(merged, cut)), strict=True)
            )
            assert _covered(*rest, [(lo, hi)])[0] == whole - removed


def _intersect(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    pieces = [
        (max(s1, s2), min(e1, e2))
        for s1, e1 in zip(*(x.tolist() for x in a), strict=True)
        for s2, e2 in zip(*(x.tolist() for x in b), strict=True)
        if min(e1, e2) > max(s1, s2)
    ]
    return np.array([p[0] for p in pieces], np.int64), np.array([p[1] for p in pieces], np.int64)
