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


def _exact_sf(n1: int, n2: int) -> np.ndarray:
    """P(U >= u) for u = 0 .. n1 n2 under the null hypothesis (no ties)."""
    # counts[i][j][u]: orderings of i and j values whose U (pairs with the first side's
    # value above the second's) is u; the largest value comes from either side.
    size = n1 * n2 + 1
    table = [[np.zeros(size) for _ in range(n2 + 1)] for _ in range(n1 + 1)]
    for i in range(n1 + 1):
        for j in range(n2 + 1):
            if i == 0 or j == 0:
                table[i][j][0] = 1.0
                continue
            here = table[i][j]
            here += table[i][j - 1]  # the largest is the second side's: U unchanged
            here[j:] += table[i - 1][j][: size - j]  # the first side's: above all j
    counts = table[n1][n2]
    total = math.comb(n1 + n2, n1)
    return np.cumsum(counts[::-1])[::-1] / total


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
