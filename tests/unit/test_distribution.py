"""Percentiles of libtpu's bucketed distributions, and the sliding window over them.

The numbers are checked against tpu-info's own computation in
tests/integration/test_tpu_source.py; these cases pin the edges.
"""

from __future__ import annotations

import math
import operator

import pytest

from exporter.metrics.distribution import (
    MAX_FINITE_BUCKETS,
    BadDistributionError,
    Buckets,
    DistributionWindow,
    MonotonicTotals,
    buckets_of,
)
from exporter.proto import tpu_metrics_pb2 as pb

# Finite buckets [1, 2) [2, 4) [4, 8) [8, 16); underflow < 1, overflow >= 16.
BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0)


def dist(*counts: int, total: float = 0.0) -> Buckets:
    return Buckets(BOUNDS, counts, total)


def test_percentile_interpolates_inside_the_bucket_of_its_rank() -> None:
    b = dist(0, 10, 20, 30, 0, 0)  # 60 samples
    # p50: rank 30 is the first sample of [4, 8); p90: rank 54 is 24 samples into it.
    assert b.percentiles([0.5, 0.9]) == [4.0, 4.0 + 24 / 30 * 4.0]
    assert b.percentile(0.0) == 1.0  # rank 0: the bottom of the first non-empty bucket


def test_underflow_and_overflow_report_their_finite_bound() -> None:
    assert dist(5, 0, 0, 0, 0, 0).percentile(0.5) == 1.0
    assert dist(0, 0, 0, 0, 0, 7).percentile(0.5) == 16.0


def test_no_samples_no_percentile() -> None:
    assert dist(0, 0, 0, 0, 0, 0).percentiles([0.5, 0.99]) == [None, None]


def test_minus_refuses_a_restart_and_another_layout() -> None:
    newer, older = dist(0, 5, 5, 0, 0, 0, total=20.0), dist(0, 2, 5, 0, 0, 0, total=5.0)
    assert newer.minus(older) == dist(0, 3, 0, 0, 0, 0, total=15.0)
    assert older.minus(newer) is None  # counts went back: the runtime restarted
    assert newer.minus(Buckets((1.0, 3.0), (0, 1, 0), 0.0)) is None


def message(counts: list[int], **options: pb.Distribution.BucketOptions) -> pb.Distribution:
    return pb.Distribution(
        count=sum(counts), mean=3.0, bucket_counts=counts,
        bucket_options=pb.Distribution.BucketOptions(**options),
    )  # fmt: skip


def test_libtpu_layouts_are_read_and_scaled() -> None:
    Options = pb.Distribution.BucketOptions  # noqa: N806 - a proto class
    exponential = message(
        [0, 1, 1, 0, 0], exponential_buckets=Options.Exponential(num_finite_buckets=3,
                                                                growth_factor=2.0, scale=10.0)
    )  # fmt: skip
    b, merged = buckets_of(exponential, divisor=1e6)  # microseconds in, seconds out
    assert merged == 0
    assert b.bounds == (10e-6, 20e-6, 40e-6, 80e-6)
    assert b.total == pytest.approx(6e-6)  # mean x count
    linear = message(
        [0, 2, 0], linear_buckets=Options.Linear(num_finite_buckets=1, width=5, offset=1)
    )
    assert buckets_of(linear) == (Buckets((1.0, 6.0), (0, 2, 0), 6.0), 0)
    explicit = message([1, 0, 1], explicit_buckets=Options.Explicit(bounds=[1.0, 2.0]))
    assert buckets_of(explicit) == (Buckets((1.0, 2.0), (1, 0, 1), 6.0), 0)
    # Inconsistent input from a runtime is refused, not guessed at.
    with pytest.raises(BadDistributionError, match="bounds"):
        buckets_of(message([1, 0, 1], explicit_buckets=Options.Explicit(bounds=[2.0, 1.0])))
    with pytest.raises(BadDistributionError, match="layout"):
        buckets_of(message([1, 2, 3]))  # no layout at all


Options = pb.Distribution.BucketOptions


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        # The attack's growth factor: 1e200**2 raises OverflowError inside the power.
        ({"exponential_buckets": Options.Exponential(num_finite_buckets=3, growth_factor=1e200,
                                                     scale=1.0)}, "overflow"),
        # A product that becomes inf without raising.
        ({"linear_buckets": Options.Linear(num_finite_buckets=3, width=1e308, offset=1e308)},
         "overflow"),
        # NaN passes `b <= a`; inf is not a boundary; equal bounds are not increasing.
        ({"explicit_buckets": Options.Explicit(bounds=[1.0, math.nan, 3.0, 4.0])}, "bounds"),
        ({"explicit_buckets": Options.Explicit(bounds=[1.0, 2.0, 3.0, math.inf])}, "bounds"),
        ({"explicit_buckets": Options.Explicit(bounds=[1.0, 2.0, 2.0, 4.0])}, "bounds"),
        ({"linear_buckets": Options.Linear(num_finite_buckets=3, width=math.nan, offset=1)},
         "bounds"),
        ({"exponential_buckets": Options.Exponential(num_finite_buckets=3, growth_factor=1.0,
                                                     scale=1.0)}, "bounds"),
        ({"explicit_buckets": Options.Explicit(bounds=[1.0, 2.0])}, "layout"),
    ],
)  # fmt: skip
def test_hostile_bucket_layouts_are_refused_with_a_reason(
    options: dict[str, pb.Distribution.BucketOptions], reason: str
) -> None:
    with pytest.raises(BadDistributionError) as caught:
        buckets_of(message([0, 1, 1, 1, 0], **options))
    assert caught.value.reason == reason


def test_a_huge_bucket_count_is_merged_down_to_the_cap_keeping_every_sample() -> None:
    finite = 200_000
    counts = [3] + [1] * finite + [5]
    linear = message(counts, linear_buckets=Options.Linear(num_finite_buckets=finite, width=1,
                                                           offset=0))  # fmt: skip
    b, merged = buckets_of(linear)
    assert len(b.counts) - 2 <= MAX_FINITE_BUCKETS
    assert merged == finite - (len(b.counts) - 2)
    assert (b.count, b.counts[0], b.counts[-1]) == (finite + 8, 3, 5)
    assert b.bounds[0] == 0.0 and b.bounds[-1] == float(finite)  # the range is kept
    assert all(map(operator.lt, b.bounds, b.bounds[1:]))
    # Each kept bucket holds exactly the samples between its kept bounds.
    assert b.counts[1] == b.bounds[1] - b.bounds[0]
    assert b.percentile(0.5) == pytest.approx(finite / 2, rel=0.01)
    explicit = message(counts, explicit_buckets=Options.Explicit(bounds=range(finite + 1)))
    assert buckets_of(explicit) == (b, merged)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_window_is_cumulative_until_a_snapshot_is_old_enough_then_recent() -> None:
    clock = Clock()
    window = DistributionWindow(300.0, clock)
    assert window.recent("k", dist(0, 100, 0, 0, 0, 0)).count == 100  # since the start
    clock.now = 200.0
    assert window.recent("k", dist(0, 100, 50, 0, 0, 0)).count == 150  # nothing 300 s old yet
    clock.now = 310.0
    recent = window.recent("k", dist(0, 100, 50, 40, 0, 0))
    assert recent.counts == (0, 0, 50, 40, 0, 0)  # since the snapshot of t=0
    clock.now = 520.0
    assert window.recent("k", dist(0, 100, 50, 40, 10, 0)).counts == (0, 0, 0, 40, 10, 0)


def test_window_starts_over_when_the_runtime_restarts() -> None:
    clock = Clock()
    window = DistributionWindow(300.0, clock)
    window.recent("k", dist(0, 100, 0, 0, 0, 0))
    clock.now = 400.0
    assert window.recent("k", dist(0, 3, 0, 0, 0, 0)).count == 3


def test_window_keeps_a_bounded_number_of_snapshots() -> None:
    clock = Clock()
    window = DistributionWindow(300.0, clock)
    for step in range(2000):  # a 1 s collect interval for over half an hour
        clock.now = float(step)
        window.recent("k", dist(0, step, 0, 0, 0, 0))
    assert len(window._history["k"]) <= 12


def test_totals_never_go_back_unless_the_count_does() -> None:
    totals = MonotonicTotals()
    assert totals.total("k", 10, 5.000000000000001) == 5.000000000000001
    assert totals.total("k", 10, 5.0) == 5.000000000000001  # float noise, not a reset
    assert totals.total("k", 11, 5.5) == 5.5
    assert totals.total("k", 2, 1.0) == 1.0  # a restarted runtime
