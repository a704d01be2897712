"""OTLP/HTTP push of every metric, beside the Prometheus endpoint.

On when ``MLPROF_OTLP_ENDPOINT`` is set. The exporter is OpenTelemetry's own
OTLP/HTTP protobuf exporter, so the standard ``OTEL_EXPORTER_OTLP_*`` variables
(certificate, timeout, headers, compression) keep their documented meaning
(https://opentelemetry.io/docs/specs/otel/protocol/exporter/):

- ``MLPROF_OTLP_ENDPOINT`` is a base URL; ``/v1/metrics`` is appended as the spec
  asks of ``OTEL_EXPORTER_OTLP_ENDPOINT``, unless the URL already ends with it.
- headers: ``OTEL_EXPORTER_OTLP_METRICS_HEADERS`` or ``OTEL_EXPORTER_OTLP_HEADERS``,
  then ``MLPROF_OTLP_HEADERS`` over them.
- compression: gzip unless ``OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION`` says otherwise.
- interval: ``MLPROF_OTLP_INTERVAL_S``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.util.re import parse_env_headers

from exporter.config import Settings

if TYPE_CHECKING:
    # The OTLP exporter (and its HTTP/protobuf stack) is imported only when OTLP is on.
    from opentelemetry.exporter.otlp.proto.http import Compression

__all__ = ["METRICS_PATH", "otlp_endpoint", "otlp_headers", "otlp_reader"]

METRICS_PATH = "/v1/metrics"


def otlp_endpoint(base: str) -> str:
    """The metrics URL for a base endpoint (``http://collector:4318``)."""
    base = base.rstrip("/")
    return base if base.endswith(METRICS_PATH) else base + METRICS_PATH


def otlp_headers(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """Request headers: the standard variables, then the sidecar's setting over them."""
    raw = environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    headers = {k.lower(): v for k, v in parse_env_headers(raw, liberal=True).items()}
    headers.update(settings.otlp_headers)
    return headers


def _compression(environ: Mapping[str, str]) -> Compression:
    from opentelemetry.exporter.otlp.proto.http import Compression

    raw = (
        environ.get("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION")
        or environ.get("OTEL_EXPORTER_OTLP_COMPRESSION")
        or "gzip"
    )
    try:
        return Compression(raw.strip().lower())
    except ValueError:
        return Compression.Gzip


def otlp_reader(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> MetricReader | None:
    """A periodic OTLP/HTTP reader for ``settings.otlp_endpoint``, or None when unset."""
    if not settings.otlp_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    env = os.environ if environ is None else environ
    exporter = OTLPMetricExporter(
        endpoint=otlp_endpoint(settings.otlp_endpoint),
        headers=otlp_headers(settings, env),
        compression=_compression(env),
    )
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=settings.otlp_interval_s * 1000.0
    )
