"""Mann-Whitney U and Benjamini-Hochberg over many frames at once, in numpy.

The comparison's significance test (:func:`exporter.analysis.noise.rank_tests`): every
frame is a row of per-step times, and each row's base steps are tested against its
head steps. It computes what ``scipy.stats.mannwhitneyu(head, base, axis=1,
alternative="two-sided")`` and ``scipy.stats.false_discovery_control(p, method="bh")``
compute (scipy 1.11-1.17: ``scipy/stats/_mannwhitneyu.py``, ``_stats_py.py``), the
same choices included, and ``tests/unit/test_rank_tests.py`` holds it to scipy on
random, tied, small and large inputs. Why not scipy itself: importing ``scipy.stats``
takes about 1 s of CPU, and every analysis with a baseline runs in a fresh child
process (``exporter.analysis.job``), so the import was a third of an alert's
capture-to-report time.

* Ranks: 1-based, ties get the average of their ranks; ``t`` the size of each tie group.
* ``U1`` of the head: its rank sum less ``n1 (n1 + 1) / 2``; the two-sided statistic
  ``U = max(U1, n1 n2 - U1)``.
* Method, as scipy's ``'auto'``, chosen once for all rows: the exact null distribution
  when either side has at most 8 steps and no row has a tie, else the normal
  approximation with the tie correction and a continuity correction of 1/2.
* ``p = 2 P(U' >= U)``, clipped to [0, 1].
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["benjamini_hochberg", "mann_whitney_u"]

EXACT_MAX_STEPS = 8  # scipy's 'auto': exact when a side has at most this many, and no ties


def _ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks per row (1-based), and per row the sum of t^3 - t over tie groups."""
    rows, n = values.shape
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    starts = np.ones((rows, n), bool)  # where a group of equal values starts
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = np.cumsum(starts, axis=1) - 1 + np.arange(rows)[:, None] * n  # unique per row
    size = np.bincount(group.ravel(), minlength=rows * n)
    position = np.broadcast_to(np.arange(n), (rows, n))
    first = np.maximum.accumulate(np.where(starts, position, 0), axis=1)
    # A group from position f of size t holds ranks f + 1 .. f + t: their mean.
    ranks = np.empty((rows, n))
    np.put_along_axis(ranks, order, first + (size[group] + 1) / 2.0, axis=1)
    t = size.reshape(rows, n).astype(float)
    return ranks, (t**3 - t).sum(axis=1)


def _exact_sf(m: int, n: int) -> np.ndarray:
    """P(U >= u) for u = 0 .. m n under the null hypothesis (no ties), m <= n.

    ``rows[i]`` counts the orderings of i values of the first side and j of the second by
    their U (pairs with the first side's value above the second's), for the j reached:
    the largest value is the second side's (U unchanged, from j - 1) or the first's
    (above all j, from i - 1). Each array holds i j + 1 counts, so memory is (m + 1)
    arrays of at most m n + 1 (m is at most 8 here) and the work about (m n)^2 / 4.
    """
    rows = [np.ones(1) for _ in range(m + 1)]  # j = 0: U = 0, one ordering
    for j in range(1, n + 1):
        for i in range(1, m + 1):
            counts = np.zeros(i * j + 1)
            counts[: len(rows[i])] += rows[i]  # (i, j - 1)
            counts[j : j + len(rows[i - 1])] += rows[i - 1]  # (i - 1, j), shifted by j
            rows[i] = counts
    return np.cumsum(rows[m][::-1])[::-1] / math.comb(m + n, m)


def mann_whitney_u(head: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(U1 of ``head``, two-sided p) per row; rows are frames, columns steps."""
    head = np.asarray(head, float)
    base = np.asarray(base, float)
    n1, n2 = head.shape[1], base.shape[1]
    ranks, tie_term = _ranks(np.concatenate([head, base], axis=1))
    u1 = ranks[:, :n1].sum(axis=1) - n1 * (n1 + 1) / 2
    u = np.maximum(u1, n1 * n2 - u1)
    ties = bool((tie_term > 0).any())
    if (n1 > EXACT_MAX_STEPS and n2 > EXACT_MAX_STEPS) or ties:
        n = n1 + n2
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
            z = (u - n1 * n2 / 2 - 0.5) / s
        # scipy.special.ndtr(-z) = erfc(z / sqrt(2)) / 2; numpy has no erfc.
        p = np.array([math.erfc(x / math.sqrt(2)) if not math.isnan(x) else math.nan for x in z])
    else:
        sf = _exact_sf(min(n1, n2), max(n1, n2))
        p = 2 * sf[u.astype(np.int64)]
    return u1, np.clip(p, 0.0, 1.0)


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values), in the input's order."""
    p = np.asarray(p, float)
    m = len(p)
    if not m:
        return p.copy()
    order = np.argsort(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.clip(q, 0.0, 1.0)
    return out
