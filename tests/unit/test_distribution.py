"""Percentiles of libtpu's bucketed distributions, and the sliding window over them.

The numbers are checked against tpu-info's own computation in
tests/integration/test_tpu_source.py; these cases pin the edges.
"""

from __future__ import annotations

import pytest

from exporter.metrics.distribution import Buckets, DistributionWindow, MonotonicTotals, buckets_of
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
    b = buckets_of(exponential, divisor=1e6)  # microseconds in, seconds out
    assert b is not None
    assert b.bounds == (10e-6, 20e-6, 40e-6, 80e-6)
    assert b.total == pytest.approx(6e-6)  # mean x count
    linear = message(
        [0, 2, 0], linear_buckets=Options.Linear(num_finite_buckets=1, width=5, offset=1)
    )
    assert buckets_of(linear) == Buckets((1.0, 6.0), (0, 2, 0), 6.0)
    explicit = message([1, 0, 1], explicit_buckets=Options.Explicit(bounds=[1.0, 2.0]))
    assert buckets_of(explicit) == Buckets((1.0, 2.0), (1, 0, 1), 6.0)
    # Inconsistent input from a runtime is dropped, not guessed at.
    assert (
        buckets_of(message([1, 0, 1], explicit_buckets=Options.Explicit(bounds=[2.0, 1.0]))) is None
    )
    assert buckets_of(message([1, 2, 3])) is None  # no layout at all


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
