"""libtpu's distributions as Prometheus histograms: ``_bucket{le}``, ``_sum``, ``_count``.

The OpenTelemetry Python SDK has no asynchronous histogram, and libtpu hands over
pre-aggregated cumulative buckets, so these bypass OpenTelemetry: a prometheus-client
collector on the sidecar's registry builds a ``HistogramMetricFamily`` per distribution
on each scrape from the last values the TPU source stored (they go stale with the chip).
OTLP therefore receives the percentile gauges and count/time counters, not these.

Bounds are libtpu's own, converted to base units (microseconds to seconds, Mbit/s to
bytes/s). libtpu's bucket ``i`` holds [bound[i-1], bound[i]); Prometheus' ``le`` is
inclusive: a sample exactly on a bound is counted one bucket lower here, a difference
``histogram_quantile``'s interpolation cannot see. The underflow bucket becomes the
first ``le`` (libtpu's lowest bound), the overflow only ``+Inf``. Counts are since the
runtime started; a restarted runtime is a counter reset, which ``rate()`` handles.
Per-chip distributions arrive summed per host (``tpu._host_histograms``): no ``chip``.

>>> registry.register(DistributionHistograms(series))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporter.metrics.accelerator import DeviceSeries
from exporter.metrics.catalog import METRICS, MetricSpec, prometheus_name
from exporter.metrics.distribution import Buckets

__all__ = ["DistributionHistograms", "histogram_name"]


def histogram_name(metric: str) -> str:
    """The histogram's Prometheus base name for a distribution's catalogue instrument.

    ``accelerator.collective.latency`` (gauge ``accelerator_collective_latency_seconds``)
    becomes ``accelerator_collective_latency_distribution_seconds``: the percentile gauge
    keeps its name, so the two families never collide.
    """
    spec = METRICS[metric]
    return prometheus_name(MetricSpec(f"{metric}.distribution", spec.unit, spec.description))


def cumulative(buckets: Buckets) -> list[tuple[str, float]]:
    """``(le, cumulative count)`` pairs, ending with ``+Inf`` = the count."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip(buckets.bounds, buckets.counts, strict=False):
        running += n
        out.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
    out.append(("+Inf", float(buckets.count)))
    return out


class DistributionHistograms(Collector):
    """Every distribution a :class:`DeviceSeries` holds, as histogram families."""

    def __init__(self, series: DeviceSeries) -> None:
        self.series = series

    def describe(self) -> Iterator[Metric]:
        """Nothing up front: the families depend on what the runtime offers."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        by_metric: dict[str, list[tuple[dict[str, str], Buckets, float]]] = {}
        for metric, attrs, buckets, total in self.series.histograms():
            by_metric.setdefault(metric, []).append((attrs, buckets, total))
        for metric in sorted(by_metric):
            found = by_metric[metric]
            labels = sorted({key for attrs, _, _ in found for key in attrs})
            family = HistogramMetricFamily(
                histogram_name(metric),
                METRICS[metric].description.split(":")[0] + ": libtpu's cumulative buckets.",
                labels=labels,
            )
            for attrs, buckets, total in sorted(found, key=lambda f: sorted(f[0].items())):
                family.add_metric(
                    [attrs.get(key, "") for key in labels], cumulative(buckets), total
                )
            yield family
