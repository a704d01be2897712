"""Cost of keeping histogram totals in the Prometheus reader (so expired runs can go).

The sidecar's reader asks the SDK for delta histograms and adds them up itself
(exporter/metrics/expiring_reader.py). This renders the same registry contents through
that reader and through the plain ``PrometheusMetricReader`` in one run, and prints the
render time of each and their ratio; then forgets half the runs and shows the series
that remain (the plain reader keeps them all for the provider's life).

    .venv/bin/python bench/histogram_expiry.py [--quick] [--runs 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.metrics.expiring_reader import ExpiringPrometheusReader  # noqa: E402
from exporter.metrics.telemetry import STEP_DURATION_BUCKETS_S, STEP_HISTOGRAMS  # noqa: E402


def build(reader_cls: type[MetricReader], runs: int) -> tuple[CollectorRegistry, MetricReader]:
    registry = CollectorRegistry(auto_describe=True)
    reader = reader_cls(scope_info_enabled=False, registry=registry)  # type: ignore[call-arg]
    views = [
        View(
            instrument_name=n,
            aggregation=ExplicitBucketHistogramAggregation(STEP_DURATION_BUCKETS_S),
        )
        for n in STEP_HISTOGRAMS
    ]
    meter = MeterProvider(metric_readers=[reader], views=views).get_meter("bench")
    meter.create_counter("mlprof.state.discarded").add(0)
    histograms = [meter.create_histogram(n, unit="s") for n in STEP_HISTOGRAMS]
    for run in range(runs):
        attrs = {"run_id": f"run-{run}", "workload": "w", "host": "h"}
        for i in range(50):
            for histogram in histograms:
                histogram.record(0.001 * (i + 1), attrs)
    return registry, reader


def render_ms(registry: CollectorRegistry, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        generate_latest(registry)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=64)
    args = parser.parse_args()
    repeat = 20 if args.quick else 200
    plain_registry, _ = build(PrometheusMetricReader, args.runs)
    ours_registry, ours = build(ExpiringPrometheusReader, args.runs)
    plain = render_ms(plain_registry, repeat)
    expiring = render_ms(ours_registry, repeat)
    print(f"{args.runs} runs x {len(STEP_HISTOGRAMS)} histograms, median render of {repeat}:")
    print(f"  PrometheusMetricReader (reference)  {plain:8.2f} ms")
    print(f"  ExpiringPrometheusReader            {expiring:8.2f} ms  ({expiring / plain:.2f}x)")
    assert isinstance(ours, ExpiringPrometheusReader)
    before = ours.series_count()
    for run in range(args.runs // 2):
        ours.forget({"run_id": f"run-{run}"})
    print(f"  series kept: {before} -> {ours.series_count()} after half the runs expired")
    return 0


if __name__ == "__main__":
    sys.exit(main())
