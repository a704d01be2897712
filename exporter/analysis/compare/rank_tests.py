"""Mann-Whitney U, Student's t and Benjamini-Hochberg over many frames at once, in numpy.

The comparison's significance test (:func:`exporter.analysis.compare.noise.rank_tests`): every
frame is a row of per-step times, and each row's base steps are tested against its
head steps. It computes what ``scipy.stats.mannwhitneyu(head, base, axis=1,
alternative="two-sided")`` and ``scipy.stats.false_discovery_control(p, method="bh")``
compute (scipy 1.11-1.17: ``scipy/stats/_mannwhitneyu.py``, ``_stats_py.py``), the
same choices included, and ``tests/unit/test_rank_tests.py`` holds it to scipy on
random, tied, small and large inputs. Why not scipy itself: importing ``scipy.stats``
takes about 1 s of CPU, and every analysis with a baseline runs in a fresh child
process (``exporter.pipeline.job``), so the import was a third of an alert's
capture-to-report time.

* Ranks: 1-based, ties get the average of their ranks; ``t`` the size of each tie group.
* ``U1`` of the head: its rank sum less ``n1 (n1 + 1) / 2``; the two-sided statistic
  ``U = max(U1, n1 n2 - U1)``.
* Method, as scipy's ``'auto'``, chosen once for all rows: the exact null distribution
  when either side has at most 8 steps and no row has a tie, else the normal
  approximation with the tie correction and a continuity correction of 1/2.
* ``p = 2 P(U' >= U)``, clipped to [0, 1].

Between replicates (several captures a side) the unit is a capture, not a step, and a
side holds 2 to 8 of them: too few for a rank test (4 + 4 reach p = 0.029 at best), so
the test there is Student's t on the captures' values (:func:`student_t_two_sided`,
:func:`student_t_critical`: the integer-degrees CDF of Abramowitz & Stegun 26.7.3-4,
exact, held to ``scipy.stats.t`` by the same test module).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["benjamini_hochberg", "mann_whitney_u", "student_t_critical", "student_t_two_sided"]

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


def student_t_two_sided(t: np.ndarray | float, df: int) -> np.ndarray:
    """P(|T| >= |t|) for Student's t with ``df`` (a positive integer) degrees of freedom.

    A&S 26.7.3 (odd ``df``) and 26.7.4 (even): with theta = atan(|t| / sqrt(df)),
    P(|T| < t) is a finite series in cos(theta)^2, so no special function is needed.
    """
    if df < 1:
        raise ValueError("student_t_two_sided: df must be at least 1")
    t = np.abs(np.asarray(t, float))
    theta = np.arctan(t / math.sqrt(df))
    c2, sin = np.cos(theta) ** 2, np.sin(theta)
    if df % 2:
        series, term = np.zeros_like(t), np.cos(theta)
        for j in range(1, (df - 1) // 2 + 1):
            series += term
            term = term * (2 * j) / (2 * j + 1) * c2
        inside = 2 / math.pi * (theta + sin * series)
    else:
        series, term = np.zeros_like(t), np.ones_like(t)
        for j in range(1, df // 2 + 1):
            series += term
            term = term * (2 * j - 1) / (2 * j) * c2
        inside = sin * series
    return np.asarray(np.clip(1.0 - inside, 0.0, 1.0), float)


@functools.lru_cache(maxsize=1024)
def student_t_critical(alpha: float, df: int) -> float:
    """The t with P(|T| >= t) = ``alpha`` (two-sided), by bisection on its CDF (cached:
    a comparison asks for a few (alpha, df) pairs many times)."""
    if not 0 < alpha < 1:
        raise ValueError("student_t_critical: alpha must be in (0, 1)")
    lo, hi = 0.0, 1.0
    while float(student_t_two_sided(hi, df)) > alpha:
        hi *= 2
    for _ in range(64):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(student_t_two_sided(mid, df)) > alpha else (lo, mid)
    return hi
