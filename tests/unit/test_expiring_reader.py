"""The expiring Prometheus reader against the SDK's own cumulative reader (the reference):
the same exposition, scrape after scrape, until a run is forgotten."""

from __future__ import annotations

import random

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest

from exporter.metrics.expiring_reader import ExpiringPrometheusReader
from exporter.metrics.telemetry import STEP_DURATION_BUCKETS_S


def _meter(reader_cls: type[MetricReader]) -> tuple[CollectorRegistry, MetricReader, Meter]:
    registry = CollectorRegistry(auto_describe=True)
    reader = reader_cls(scope_info_enabled=False, registry=registry)  # type: ignore[call-arg]
    view = View(
        instrument_name="train.step.duration",
        aggregation=ExplicitBucketHistogramAggregation(STEP_DURATION_BUCKETS_S),
    )
    meter = MeterProvider(metric_readers=[reader], views=[view]).get_meter("test")
    meter.create_counter("always.there").add(0)
    return registry, reader, meter


def _lines(registry: CollectorRegistry) -> list[str]:
    return sorted(generate_latest(registry).decode().splitlines())


def test_same_exposition_as_the_cumulative_reader_across_scrapes() -> None:
    reference, _, ref_meter = _meter(PrometheusMetricReader)
    ours, reader, our_meter = _meter(ExpiringPrometheusReader)
    histograms = [
        m.create_histogram("train.step.duration", unit="s") for m in (ref_meter, our_meter)
    ]
    rng = random.Random(11)
    for scrape in range(12):
        for _ in range(rng.randrange(0, 40)):  # some scrapes see no new measurement
            value, run = rng.expovariate(5.0), f"r{rng.randrange(4)}"
            for histogram in histograms:
                histogram.record(value, {"run_id": run, "host": "h"})
        assert _lines(ours) == _lines(reference), f"scrape {scrape}"
    assert isinstance(reader, ExpiringPrometheusReader)
    assert reader.series_count() == 4


def test_forgetting_a_run_drops_only_its_series() -> None:
    ours, reader, meter = _meter(ExpiringPrometheusReader)
    assert isinstance(reader, ExpiringPrometheusReader)
    histogram = meter.create_histogram("train.step.duration", unit="s")
    for run in ("r1", "r2"):
        histogram.record(0.5, {"run_id": run, "host": "h"})
    generate_latest(ours)
    assert reader.forget({"run_id": "r1"}) == 1
    text = generate_latest(ours).decode()
    assert 'run_id="r1"' not in text
    assert 'train_step_duration_seconds_count{host="h",run_id="r2"} 1.0' in text
    histogram.record(0.25, {"run_id": "r1", "host": "h"})  # the run comes back: from zero
    assert (
        'train_step_duration_seconds_count{host="h",run_id="r1"} 1.0'
        in generate_latest(ours).decode()
    )
