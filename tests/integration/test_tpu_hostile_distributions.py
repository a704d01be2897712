"""A libtpu runtime sending hostile distributions, over real gRPC (issue 31, items 1-3).

Each bad distribution is skipped and counted; the source stays ``ok`` and every other
metric is still exported. A runtime claiming 200,000 buckets has them merged down.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.config import Settings
from exporter.faketpu import HLO_EXEC_METRIC, FakeTpuRuntime, default_script
from exporter.metrics.distribution import MAX_FINITE_BUCKETS
from exporter.metrics.histograms import histogram_name
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.tpu import RUNTIME_METRICS
from exporter.proto import tpu_metrics_pb2 as pb

pytestmark = pytest.mark.integration

HLO = next(m for m in RUNTIME_METRICS if HLO_EXEC_METRIC in m.names)
HISTOGRAM = histogram_name(HLO.metric)


def corrupt(fake: FakeTpuRuntime, change: Callable[[Any], None], chips: set[int]) -> None:
    """Make the fake send ``change``d hlo-execution distributions for ``chips``."""
    honest = fake.metrics

    def metrics(name: str) -> list[Any] | None:
        out = honest(name)
        if name == HLO_EXEC_METRIC and out is not None:
            for i, metric in enumerate(out):
                if i in chips:
                    change(metric.distribution)
        return out

    fake.metrics = metrics  # type: ignore[method-assign]


def collect(fake: FakeTpuRuntime, tmp_path: Path) -> tuple[str, Telemetry]:
    settings = Settings(sources=["tpu"], tpu_metrics_addr=fake.addr, shared_dir=tmp_path)
    t = build_telemetry(CollectorRegistry())
    sources = AcceleratorSources(settings, t.meter, registry=t.registry)
    run = sources.runs[0].collect
    assert run is not None
    state, _ = run()
    sources.close()
    return state, t


def skipped(t: Telemetry, reason: str) -> float | None:
    return t.registry.get_sample_value(
        "mlprof_source_distributions_skipped_total", {"source": "tpu", "reason": reason}
    )


def growth(factor: float) -> Callable[[Any], None]:
    def change(distribution: Any) -> None:
        distribution.bucket_options.exponential_buckets.growth_factor = factor

    return change


def nan_bound(distribution: Any) -> None:
    finite = len(distribution.bucket_counts) - 2
    bounds = [float(i + 1) for i in range(finite + 1)]
    bounds[2] = math.nan
    distribution.bucket_options.CopyFrom(
        pb.Distribution.BucketOptions(explicit_buckets=pb.Distribution.BucketOptions.Explicit(
            bounds=bounds))
    )  # fmt: skip


@pytest.mark.parametrize(("change", "reason"), [(growth(1e200), "overflow"), (nan_bound, "bounds")])
def test_a_bad_distribution_is_skipped_and_counted_and_the_rest_stays(
    tmp_path: Path, change: Callable[[Any], None], reason: str
) -> None:
    with FakeTpuRuntime(default_script(4), "127.0.0.1:0", clock=lambda: 1000.0) as fake:
        corrupt(fake, change, {0})
        state, t = collect(fake, tmp_path)
    assert state == "ok"  # was "error" with no TPU series at all (OverflowError)
    assert skipped(t, reason) == 1
    text = generate_latest(t.registry).decode()
    assert text.count("accelerator_duty_cycle{") == 4  # every chip's other metrics
    assert 'le="NaN"' not in text
    # The three honest chips' executions are still exported (summed per host).
    counts = [
        s.value
        for family in t.registry.collect()
        for s in family.samples
        if s.name == f"{HISTOGRAM}_count"
    ]
    assert counts and counts[0] > 0


def test_200000_buckets_per_chip_are_merged_down_to_the_cap(tmp_path: Path) -> None:
    finite = 200_000

    def huge(distribution: Any) -> None:
        counts = [0] * (finite + 2)
        counts[finite // 2] = int(distribution.count)
        distribution.bucket_options.CopyFrom(
            pb.Distribution.BucketOptions(linear_buckets=pb.Distribution.BucketOptions.Linear(
                num_finite_buckets=finite, width=1.0, offset=0.0))
        )  # fmt: skip
        del distribution.bucket_counts[:]
        distribution.bucket_counts.extend(counts)

    with FakeTpuRuntime(default_script(4), "127.0.0.1:0", clock=lambda: 1000.0) as fake:
        corrupt(fake, huge, {0, 1, 2, 3})
        state, t = collect(fake, tmp_path)
    assert state == "ok"
    text = generate_latest(t.registry).decode()
    buckets = text.count(f"{HISTOGRAM}_bucket{{")
    assert 0 < buckets <= MAX_FINITE_BUCKETS + 2  # kept bounds and +Inf, one host series
    merged = t.registry.get_sample_value("mlprof_source_buckets_merged_total", {"source": "tpu"})
    assert merged is not None and merged >= 4 * (finite - MAX_FINITE_BUCKETS)
