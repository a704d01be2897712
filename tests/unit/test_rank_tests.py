"""exporter.analysis.compare.rank_tests against scipy, the reference it replaces in the product.

scipy's ``mannwhitneyu`` (two-sided, ``method='auto'``) and ``false_discovery_control``
(BH) on the same rows: random continuous steps (the normal approximation), integer
steps full of ties (the tie correction, and ties anywhere forcing the approximation
for every row), at most 8 steps on a side without ties (the exact distribution), one
small and one large side, constant rows, and steps in nanoseconds as the sides hold them.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import false_discovery_control, mannwhitneyu

from exporter.analysis.compare.noise import rank_tests
from exporter.analysis.compare.rank_tests import benjamini_hochberg, mann_whitney_u


def _shapes(rng: np.random.Generator, kind: str) -> tuple[np.ndarray, np.ndarray]:
    rows = int(rng.integers(1, 30))
    if kind == "continuous":
        n1, n2 = (int(x) for x in rng.integers(1, 40, 2))
        return rng.normal(size=(rows, n1)), rng.normal(size=(rows, n2)) + rng.normal()
    if kind == "ties":
        n1, n2 = (int(x) for x in rng.integers(1, 40, 2))
        return (rng.integers(0, 4, (rows, n1)).astype(float),
                rng.integers(0, 4, (rows, n2)).astype(float))  # fmt: skip
    if kind == "exact":
        n1, n2 = (int(x) for x in rng.integers(1, 9, 2))
        return rng.normal(size=(rows, n1)), rng.normal(size=(rows, n2)) + rng.normal()
    if kind == "one_small":
        n1, n2 = int(rng.integers(1, 9)), int(rng.integers(9, 60))
        return rng.exponential(size=(rows, n1)), rng.exponential(size=(rows, n2))
    # Per-step nanoseconds of frames, some identical on both sides.
    n1, n2 = (int(x) for x in rng.integers(5, 50, 2))
    head = rng.integers(1_000_000, 1_200_000, (rows, n1)).astype(float)
    base = rng.integers(1_000_000, 1_100_000, (rows, n2)).astype(float)
    head[0] = base[0, 0]
    return head, base


@pytest.mark.parametrize("kind", ["continuous", "ties", "exact", "one_small", "ns"])
def test_mann_whitney_u_is_scipys(kind: str) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    methods = set()
    for _ in range(300):
        head, base = _shapes(rng, kind)
        theirs = mannwhitneyu(head, base, axis=1, alternative="two-sided")
        u, p = mann_whitney_u(head, base)
        np.testing.assert_array_equal(u, theirs.statistic)
        np.testing.assert_allclose(
            np.nan_to_num(p, nan=1.0), np.nan_to_num(theirs.pvalue, nan=1.0), rtol=1e-9, atol=0
        )
        small = min(head.shape[1], base.shape[1]) <= 8
        tied = any(len(np.unique(r)) < len(r) for r in np.concatenate([head, base], axis=1))
        methods.add("exact" if small and not tied else "asymptotic")
    # Each kind reached the branch it is for (continuous: mostly the approximation).
    expected = {"exact": {"exact"}, "one_small": {"exact"}, "ties": {"asymptotic"},
                "ns": {"asymptotic"}}.get(kind)  # fmt: skip
    assert methods == expected if expected else "asymptotic" in methods, methods


def test_benjamini_hochberg_is_scipys() -> None:
    rng = np.random.default_rng(7)
    for size in (1, 2, 5, 50, 400):
        p = rng.uniform(size=size) ** 3
        p[: size // 3] = p[0]  # equal p-values
        np.testing.assert_allclose(
            benjamini_hochberg(p), false_discovery_control(p, method="bh"), rtol=1e-12
        )


def test_the_comparisons_rank_tests_are_scipys() -> None:
    # What compare reads: p, q and Cliff's delta per tested frame, constant rows at p = 1.
    rng = np.random.default_rng(3)
    base = rng.integers(900, 1100, (40, 24)).astype(float)
    head = rng.integers(950, 1200, (40, 30)).astype(float)
    base[4], head[4] = 7.0, 7.0  # a frame the same in every step: no information
    rows = np.arange(0, 40, 2)
    tests = rank_tests(base, head, rows)
    live = rows[rows != 4]
    theirs = mannwhitneyu(head[live], base[live], axis=1, alternative="two-sided")
    expected_p = np.ones(len(rows))
    expected_p[rows != 4] = theirs.pvalue
    np.testing.assert_allclose(tests.p_values, expected_p, rtol=1e-9)
    np.testing.assert_allclose(
        tests.q_values, false_discovery_control(expected_p, method="bh"), rtol=1e-9
    )
    u = np.full(len(rows), 24 * 30 / 2)
    u[rows != 4] = theirs.statistic
    np.testing.assert_allclose(tests.effects, 2 * u / (24 * 30) - 1)


def test_a_short_side_against_a_long_one_is_exact_in_little_memory() -> None:
    # 8 steps against 1,500 without ties takes the exact distribution (as scipy's
    # 'auto' does): its table stays a few arrays of at most 8 x 1,500 + 1 counts (a
    # whole (i, j) table would be 9 x 1,501 of them, about 1.3 GB).
    import tracemalloc

    rng = np.random.default_rng(11)
    head, base = rng.normal(size=(2, 8)), rng.normal(size=(2, 1500)) + 0.4
    tracemalloc.start()
    try:
        u, p = mann_whitney_u(head, base)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    theirs = mannwhitneyu(head, base, axis=1, alternative="two-sided", method="exact")
    np.testing.assert_array_equal(u, theirs.statistic)
    np.testing.assert_allclose(p, theirs.pvalue, rtol=1e-9)
    assert peak < 16 << 20, peak


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 6, 7, 14, 15, 30, 63])
def test_student_t_is_scipys(df: int) -> None:
    from scipy.stats import t as student

    from exporter.analysis.compare.rank_tests import student_t_critical, student_t_two_sided

    values = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 3.5, 7.0, 20.0, -2.0])
    np.testing.assert_allclose(
        student_t_two_sided(values, df), 2 * student.sf(np.abs(values), df), rtol=1e-9, atol=1e-15
    )
    for alpha in (0.05, 0.01, 0.001):
        assert student_t_critical(alpha, df) == pytest.approx(student.isf(alpha / 2, df), rel=1e-9)
