"""The OpenTelemetry MeterProvider with a Prometheus reader on the sidecar's own registry."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from exporter import __version__
from exporter.metrics.expiring_reader import ExpiringPrometheusReader

__all__ = [
    "STEP_DURATION_BUCKETS_S",
    "Telemetry",
    "build_resource",
    "build_telemetry",
    "k8s_attributes",
]

# Steps range from ~1 ms (tiny models, CPU tests) to 10 min (huge pipeline stages). The
# 1-1.5-2-3-5-7 series keeps adjacent bounds <= 1.5x apart, so a 25% step-time
# regression moves the interpolated median instead of hiding inside one bucket.
STEP_DURATION_BUCKETS_S = tuple(
    round(mantissa * 10.0**exponent, 6)
    for exponent in range(-3, 3)
    for mantissa in (1, 1.5, 2, 3, 5, 7)
)

METER_NAME = "mlprof-exporter"
# Histograms bucketed like a step: the step time, and the input wait before each step.
STEP_HISTOGRAMS = ("train.step.duration", "train.step.wait")


@dataclass
class Telemetry:
    """Everything a component needs to publish metrics; built once per sidecar."""

    registry: CollectorRegistry
    provider: MeterProvider
    meter: Meter
    readers: list[MetricReader] = field(default_factory=list)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def forget_series(self, attributes: Mapping[str, str]) -> None:
        """Drop histogram series with these attributes from the exposition (run expired)."""
        for reader in self.readers:
            if isinstance(reader, ExpiringPrometheusReader):
                reader.forget(attributes)


# Downward-API variables a pod spec sets (OpenTelemetry Operator names first).
K8S_RESOURCE_ENV = {
    "k8s.pod.name": ("K8S_POD_NAME", "POD_NAME"),
    "k8s.namespace.name": ("K8S_NAMESPACE_NAME", "POD_NAMESPACE"),
    "k8s.node.name": ("K8S_NODE_NAME", "NODE_NAME"),
}


def k8s_attributes(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``k8s.pod.name`` / ``k8s.namespace.name`` / ``k8s.node.name`` from the environment."""
    env = os.environ if environ is None else environ
    found = {}
    for attr, names in K8S_RESOURCE_ENV.items():
        value = next((env[n] for n in names if env.get(n)), None)
        if value:
            found[attr] = value
    return found


def build_resource(
    extra: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> Resource:
    """Resource attributes: service name, host, k8s pod/namespace when set, and ``extra``."""
    attrs = {
        "service.name": "mlprof-exporter",
        "service.version": __version__,
        "host.name": socket.gethostname(),
        **k8s_attributes(environ),
        **(extra or {}),
    }
    return Resource.create(attrs)


def build_telemetry(
    registry: CollectorRegistry | None = None,
    extra_readers: list[MetricReader] | None = None,
    resource: Resource | None = None,
) -> Telemetry:
    """A MeterProvider whose Prometheus reader serves ``registry`` (a fresh one by default)."""
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    prometheus = ExpiringPrometheusReader(scope_info_enabled=False, registry=registry)
    readers: list[MetricReader] = [prometheus, *(extra_readers or [])]
    provider = MeterProvider(
        metric_readers=readers,
        resource=resource or build_resource(),
        views=[
            View(
                instrument_name=name,
                aggregation=ExplicitBucketHistogramAggregation(STEP_DURATION_BUCKETS_S),
            )
            for name in STEP_HISTOGRAMS
        ],
    )
    return Telemetry(registry, provider, provider.get_meter(METER_NAME, __version__), readers)
