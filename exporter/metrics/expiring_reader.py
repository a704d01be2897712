"""A Prometheus reader whose histogram series can be forgotten when their run expires.

The OpenTelemetry SDK keeps a cumulative aggregation per attribute set for the life of
the MeterProvider: a run's ``train_step_duration_seconds`` series would stay in the
exposition (and in memory) long after the run ended, one set per run ever seen. Asked
for *delta* temporality, the SDK's own storage resets its aggregations at every
collection instead. This reader asks for delta histograms, adds the deltas up itself
(the exposition stays cumulative, as Prometheus expects) and can drop the series of an
attribute set: :meth:`ExpiringPrometheusReader.forget`, called when a run's gauges expire
after ``MLPROF_SERIES_TTL_S``.

Only the Prometheus exposition is affected; other readers (OTLP push) keep the SDK's
cumulative storage.

>>> reader = ExpiringPrometheusReader(registry=registry)  # doctest: +SKIP
>>> reader.forget({"run_id": "r1"})  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)

__all__ = ["ExpiringPrometheusReader"]

_Key = tuple[tuple[str, Any], ...]


@dataclass
class _Running:
    """A histogram series' totals since it was first seen (or last forgotten)."""

    attributes: dict[str, Any]
    start: int
    time: int
    count: int
    total: float
    buckets: list[int]
    bounds: tuple[float, ...]
    low: float
    high: float

    def add(self, point: HistogramDataPoint) -> None:
        if tuple(point.explicit_bounds) != self.bounds:  # a view changed: start over
            self.buckets = [0] * len(point.bucket_counts)
            self.bounds = tuple(point.explicit_bounds)
            self.count, self.total = 0, 0.0
            self.low, self.high = float("inf"), float("-inf")
        self.buckets = [a + b for a, b in zip(self.buckets, point.bucket_counts, strict=True)]
        self.count += point.count
        self.total += point.sum
        self.low, self.high = min(self.low, point.min), max(self.high, point.max)
        self.time = point.time_unix_nano

    def point(self) -> HistogramDataPoint:
        return HistogramDataPoint(
            attributes=self.attributes,
            start_time_unix_nano=self.start,
            time_unix_nano=self.time,
            count=self.count,
            sum=self.total,
            bucket_counts=list(self.buckets),
            explicit_bounds=list(self.bounds),
            min=self.low,
            max=self.high,
        )


@dataclass
class _Stream:
    """One histogram metric: where it was reported from, and its series."""

    metric: Metric
    resource: Any
    scope: Any
    series: dict[_Key, _Running]


class ExpiringPrometheusReader(PrometheusMetricReader):
    """``PrometheusMetricReader`` with histograms kept here, so series can be dropped."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # PrometheusMetricReader fixes its temporalities in __init__ and takes no
        # parameter for them; its base class reads this table (keyed by the SDK's
        # instrument classes) when the reader is registered with a MeterProvider, so
        # setting it here, before, is enough. test_expiring_reader checks it took.
        table = self._instrument_class_temporality
        for cls in table:
            if issubclass(cls, HistogramInstrument):
                table[cls] = AggregationTemporality.DELTA
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()

    def forget(self, attributes: Mapping[str, str]) -> int:
        """Drop every histogram series whose attributes include ``attributes``."""
        wanted = dict(attributes).items()
        dropped = 0
        with self._lock:
            for stream in self._streams.values():
                gone = [k for k, s in stream.series.items() if wanted <= s.attributes.items()]
                for key in gone:
                    del stream.series[key]
                dropped += len(gone)
        return dropped

    def series_count(self) -> int:
        """Histogram series kept now (for tests and benchmarks)."""
        with self._lock:
            return sum(len(s.series) for s in self._streams.values())

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        # None when no instrument had a point this time: kept histograms still count.
        data = metrics_data if metrics_data is not None else MetricsData(resource_metrics=[])
        super()._receive_metrics(self._accumulate(data), timeout_millis, **kwargs)

    def _accumulate(self, data: MetricsData) -> MetricsData:
        """``data`` with each delta histogram replaced by the running totals."""
        with self._lock:
            reported: set[str] = set()
            resources = []
            for rm in data.resource_metrics:
                scopes = []
                for sm in rm.scope_metrics:
                    metrics = []
                    for metric in sm.metrics:
                        if isinstance(metric.data, Histogram) and (
                            metric.data.aggregation_temporality is AggregationTemporality.DELTA
                        ):
                            self._add(metric, rm.resource, sm.scope)
                            reported.add(metric.name)
                            metrics.append(self._cumulative(self._streams[metric.name]))
                        else:
                            metrics.append(metric)
                    # Histograms with no new measurement are absent from a delta
                    # collection: their totals are still exposed.
                    for name, stream in self._streams.items():
                        if name not in reported and stream.scope == sm.scope:
                            reported.add(name)
                            metrics.append(self._cumulative(stream))
                    scopes.append(replace(sm, metrics=[m for m in metrics if _has_points(m)]))
                resources.append(replace(rm, scope_metrics=scopes))
            for name, stream in self._streams.items():
                if name not in reported and stream.series:
                    scope = ScopeMetrics(stream.scope, [self._cumulative(stream)], "")
                    resources.append(ResourceMetrics(stream.resource, [scope], ""))
            return MetricsData(resource_metrics=resources)

    def _add(self, metric: Metric, resource: Any, scope: Any) -> None:
        """Add one collection's delta points of a histogram to its running totals."""
        stream = self._streams.get(metric.name)
        if stream is None:
            stream = self._streams[metric.name] = _Stream(metric, resource, scope, {})
        for point in metric.data.data_points:
            if not isinstance(point, HistogramDataPoint):
                continue
            attributes = dict(point.attributes or {})
            key = tuple(sorted(attributes.items()))
            running = stream.series.get(key)
            if running is None:
                running = stream.series[key] = _Running(
                    attributes, point.start_time_unix_nano, point.time_unix_nano, 0, 0.0,
                    [0] * len(point.bucket_counts), tuple(point.explicit_bounds),
                    float("inf"), float("-inf"),
                )  # fmt: skip
            running.add(point)

    @staticmethod
    def _cumulative(stream: _Stream) -> Metric:
        points = [running.point() for running in stream.series.values()]
        return replace(
            stream.metric,
            data=Histogram(points, AggregationTemporality.CUMULATIVE),
        )


def _has_points(metric: Metric) -> bool:
    return bool(getattr(metric.data, "data_points", True))
