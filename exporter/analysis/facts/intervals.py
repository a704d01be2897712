"""Sets of time intervals: union, the time each span of a set covers, difference.

The facts of a capture are mostly "how much of this step was that busy": every event
line becomes disjoint sorted intervals (:func:`union`), and the questions are lengths
covered (:func:`covered`) and what is left when one set is taken from another
(:func:`subtract`). Vectorised in numpy; times are int64 nanoseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["covered", "subtract", "union"]


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint intervals covering the given ones."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    fresh = np.ones(len(starts), bool)
    fresh[1:] = starts[1:] > reach[:-1]
    group = np.cumsum(fresh) - 1
    merged_end = np.zeros(int(group[-1]) + 1, np.int64)
    np.maximum.at(merged_end, group, ends)
    return starts[fresh], merged_end


def covered(starts: np.ndarray, ends: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per span, ns covered by the disjoint sorted intervals ``starts``/``ends``.

    Vectorised over the spans: F(t), the covered length before t, is the lengths of the
    intervals that start before t (a prefix sum) minus what of the last one lies past t.
    """
    if not len(starts) or not len(spans):
        return np.zeros(len(spans), np.int64)
    lengths = ends - starts
    before = np.concatenate([[0], np.cumsum(lengths)])  # covered by intervals [0, i)

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
        last = np.maximum(i - 1, 0)
        overshoot = np.where(i > 0, np.clip(ends[last] - t, 0, None), 0)
        return before[i] - overshoot

    bounds = np.asarray(spans, np.int64).reshape(-1, 2)
    return covered_until(bounds[:, 1]) - covered_until(bounds[:, 0])  # type: ignore[no-any-return]


def subtract(
    starts: np.ndarray, ends: np.ndarray, cut_starts: np.ndarray, cut_ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint intervals minus disjoint intervals (both sorted)."""
    out_s: list[int] = []
    out_e: list[int] = []
    j = 0
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        while j < len(cut_ends) and cut_ends[j] <= lo:
            j += 1
        k, cursor = j, lo
        while k < len(cut_starts) and cut_starts[k] < hi:
            if cut_starts[k] > cursor:
                out_s.append(cursor)
                out_e.append(int(cut_starts[k]))
            cursor = max(cursor, int(cut_ends[k]))
            k += 1
        if cursor < hi:
            out_s.append(cursor)
            out_e.append(hi)
    return np.asarray(out_s, np.int64), np.asarray(out_e, np.int64)
