"""TPU source: libtpu's runtime-metrics gRPC service, read the way ``tpu-info`` reads it.

The workload's libtpu serves ``tpu.monitoring.runtime.RuntimeMetricService`` on
``localhost:8431`` (``TPU_RUNTIME_METRICS_PORTS``). Each collection asks for every
metric of :data:`RUNTIME_METRICS` the runtime offers (``ListSupportedMetrics``) with
one shared deadline, so a slow runtime costs one deadline per interval and never a
scrape. A metric this libtpu does not offer (not listed, or NOT_FOUND) is skipped
from then on, logged once and listed in ``/readyz`` (``skipped``).

The ``chip`` attribute is the device id the runtime puts on each sample. On chips
with two devices (v2, v3, 7x) memory is reported per device and duty cycle per chip,
so their ids are published as the runtime gives them, not merged. The megascale (DCN)
metrics belong to the host: they carry no ``chip``, and ``buffer_size`` when libtpu
groups them by transfer size.

``libtpu.sdk.tpumonitoring.get_metric`` is deliberately not used: off GCE it can
block for minutes looking for the metadata server, and it needs libtpu in the
sidecar's image.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from exporter.config import is_loopback, parse_hostport
from exporter.metrics.accelerator import (
    NO_ATTRIBUTES,
    DeviceSample,
    DeviceSeries,
    HistogramReading,
    Reading,
    RunIdentity,
)
from exporter.metrics.catalog import PERCENTILES
from exporter.metrics.distribution import (
    BadDistributionError,
    Buckets,
    DistributionWindow,
    MonotonicTotals,
    buckets_of,
)
from exporter.proto import tpu_metrics_pb2 as pb

if TYPE_CHECKING:
    # grpc is imported on first use: machines without a TPU never need it.
    import grpc

__all__ = [
    "DUTY_CYCLE_METRIC",
    "HBM_TOTAL_METRIC",
    "HBM_USAGE_METRIC",
    "PERCENTILE_WINDOW_S",
    "RUNTIME_METRICS",
    "TENSORCORE_UTIL_METRICS",
    "RuntimeMetric",
    "RuntimeReadout",
    "TpuRuntimeClient",
    "TpuRuntimeError",
    "TpuSource",
    "tpu_present",
]

log = logging.getLogger(__name__)

DUTY_CYCLE_METRIC: Final = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_USAGE_METRIC: Final = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL_METRIC: Final = "tpu.runtime.hbm.memory.total.bytes"
# Tensor-core utilisation is not offered by every libtpu, and not under one name: the
# first of these the runtime lists is read.
TENSORCORE_UTIL_METRICS: Final = (
    "tpu.runtime.tensorcore.utilization.percent",
    "tpu.runtime.tensorcore.util.percent",
)
# Device attribute keys seen in libtpu responses: a plain ``device-id`` int or
# string on per-chip gauges, ``device_ordinal`` inside a key/value list on others.
DEVICE_KEYS: Final = frozenset({"device-id", "device_id", "device_ordinal", "chip", "device"})
BUFFER_SIZE_KEY: Final = "buffer-size"  # megascale distributions, grouped by it as tpu-info does
CORE_TYPE_KEY: Final = "core_type"
MAX_LABEL_CHARS: Final = 64  # a runtime-given label value longer than this is cut
# HBM capacity does not change while a runtime lives: re-read it this often (and after
# any error or a new chip), saving one call, ~1 ms of CPU, per interval.
TOTAL_REFRESH_S: Final = 60.0
# Percentiles describe the samples of the last 5 minutes (a typical rate() window), so
# a latency regression shows within minutes instead of drowning in hours of history.
PERCENTILE_WINDOW_S: Final = 300.0
# Percentiles over 5 minutes move little from one second to the next, and parsing a
# distribution per chip costs ~0.2 ms: distributions are read this often (one Prometheus
# scrape interval), gauges every collection. A 256-chip host at a 1 s interval spends
# 15x less on them; at the default 5 s, 3x.
DISTRIBUTION_REFRESH_S: Final = 15.0
US: Final = 1e6  # microseconds in a second
MBPS: Final = 125_000  # bytes per second in one megabit per second


@dataclass(frozen=True)
class RuntimeMetric:
    """How one libtpu metric becomes catalogue instruments: value x scale / divisor."""

    names: tuple[str, ...]  # libtpu names; the first the runtime offers is read
    metric: str  # catalogue instrument (the percentile gauge of a distribution)
    scale: float = 1.0
    divisor: float = 1.0  # a division keeps 95 % = 0.95 and 1500 us = 0.0015 s exact
    attrs: Mapping[str, str] = field(default_factory=dict)  # fixed attributes
    per_chip: bool = True  # False: the host's (megascale), no chip attribute
    ratio: bool = False  # clamp to 0..1 (a percent divided by 100)
    counters: bool = False  # distribution: also <base>.count and <base>.time
    distribution: bool = False  # read every DISTRIBUTION_REFRESH_S, not every interval

    @property
    def name(self) -> str:
        return self.names[0]


def _dist(
    name: str, metric: str, counters: bool = True, scale: float = 1.0, **attrs: str
) -> RuntimeMetric:
    """A megascale (host-level) distribution, in microseconds unless ``scale`` is given."""
    divisor = US if scale == 1.0 else 1.0
    return RuntimeMetric(
        (name,), metric, scale, divisor, attrs, per_chip=False, counters=counters, distribution=True
    )


def _percent(names: tuple[str, ...], metric: str) -> RuntimeMetric:
    return RuntimeMetric(names, metric, divisor=100, ratio=True)


_MEGASCALE = "megascale.{}.microsecond.cumulative.distribution"
# Every libtpu runtime metric the sidecar reads, by catalogue instrument. Names are
# libtpu's, as tpu-info (cloud-accelerator-diagnostics, metrics.py) requests them.
RUNTIME_METRICS: Final[tuple[RuntimeMetric, ...]] = (
    _percent((DUTY_CYCLE_METRIC,), "accelerator.duty_cycle"),
    _percent(TENSORCORE_UTIL_METRICS, "accelerator.tensorcore.utilization"),
    RuntimeMetric((HBM_USAGE_METRIC,), "accelerator.memory.usage"),
    RuntimeMetric((HBM_TOTAL_METRIC,), "accelerator.memory.limit"),
    _percent(("tpu.runtime.hbm.utilization.percent",), "accelerator.memory.bandwidth.utilization"),
    RuntimeMetric(
        ("tpu.runtime.tensorcore.idle_duration.seconds",), "accelerator.tensorcore.idle.duration"
    ),
    RuntimeMetric(("hlo.queue.size.gauge",), "accelerator.hlo.queue.size"),
    RuntimeMetric(
        ("hlo.execution.timing.distribution.microseconds",),
        "accelerator.hlo.execution.latency",
        divisor=US,
        counters=True,
        distribution=True,
    ),
    _dist(_MEGASCALE.format("dcn_transfer_latencies"), "tpu.dcn.transfer.latency",
          direction="outbound"),
    _dist(_MEGASCALE.format("dcn_inbound_transfer_latencies"), "tpu.dcn.transfer.latency",
          direction="inbound"),
    _dist(_MEGASCALE.format("host_to_device_transfer_latencies"),
          "accelerator.host_transfer.latency", direction="host_to_device"),
    _dist(_MEGASCALE.format("device_to_host_transfer_latencies"),
          "accelerator.host_transfer.latency", direction="device_to_host"),
    _dist(_MEGASCALE.format("collective_end_to_end_latencies"), "accelerator.collective.latency"),
    _dist(_MEGASCALE.format("mxla_compute_latencies"), "tpu.host_compute.latency"),
    _dist(_MEGASCALE.format("grpc_tcp_min_rtt"), "tpu.dcn.tcp.min_rtt", counters=False),
    _dist("megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution",
          "tpu.dcn.tcp.delivery_rate", counters=False, scale=MBPS),
)  # fmt: skip
BASE_METRICS: Final = (DUTY_CYCLE_METRIC, HBM_USAGE_METRIC, HBM_TOTAL_METRIC)


class TpuRuntimeError(RuntimeError):
    """The runtime could not be read; ``reason`` is a bounded label value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def tpu_present() -> bool:
    """Whether this machine looks like a TPU VM / node (device files or TPU env vars)."""
    return bool(
        any(Path("/dev").glob("accel[0-9]*"))
        or any(Path("/dev/vfio").glob("[0-9]*"))
        or os.environ.get("TPU_ACCELERATOR_TYPE")
        or os.environ.get("TPU_WORKER_ID")
    )


def _device_of(attribute: Any) -> tuple[str | None, str | None]:
    """(device id, core type) of a sample; one pass over a key/value list."""
    value = attribute.value
    which = value.WhichOneof("attr")
    if which == "kvlist_attr":
        device = core_type = None
        for inner in value.kvlist_attr.attributes:
            if inner.key in DEVICE_KEYS and device is None:
                device = _device_of(inner)[0]
            elif inner.key == CORE_TYPE_KEY:
                core_type = _scalar(inner)
        return device, core_type
    return _scalar(attribute), None


def _scalar(attribute: Any) -> str | None:
    value = attribute.value
    which = value.WhichOneof("attr")
    if which == "int_attr":
        return str(value.int_attr)
    if which == "string_attr" and value.string_attr.strip():
        return _label(value.string_attr)
    return None


def _inner_string(attribute: Any, key: str) -> str | None:
    """The string value of ``key`` inside a key/value-list attribute."""
    value = attribute.value
    if value.WhichOneof("attr") != "kvlist_attr":
        return None
    for inner in value.kvlist_attr.attributes:
        if inner.key == key:
            return _scalar(inner)
    return None


def _label(text: str) -> str:
    """A runtime-given label value, bounded and printable."""
    text = text.strip()
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:MAX_LABEL_CHARS]


def _number(metric: Any) -> float | None:
    measure = metric.WhichOneof("measure")
    if measure == "gauge":
        which = metric.gauge.WhichOneof("value")
        if which in ("as_double", "as_int"):
            return float(getattr(metric.gauge, which))
        return None
    if measure == "counter":
        which = metric.counter.WhichOneof("value")
        return float(getattr(metric.counter, which)) if which else None
    return None


class RuntimeReadout(NamedTuple):
    """What one read of the runtime returned."""

    metrics: dict[str, list[Any]]  # libtpu name -> its ``Metric`` samples
    missing: frozenset[str]  # names the runtime answered NOT_FOUND
    error: TpuRuntimeError | None  # the first other failure, when some names were read


class TpuRuntimeClient:
    """Client of the runtime-metrics service with a deadline on every call.

    Loopback addresses use gRPC local credentials, as ``tpu-info`` does; others
    (a node agent reading another pod) use a plaintext channel.

    >>> client = TpuRuntimeClient("localhost:8431")  # doctest: +SKIP
    >>> client.read([DUTY_CYCLE_METRIC], timeout_s=2).metrics  # doctest: +SKIP
    {'tpu.runtime.tensorcore.dutycycle.percent': [attribute {...} gauge {as_double: 97.5}, ...]}
    """

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self._host, _ = parse_hostport(addr)
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        import grpc

        from exporter.proto import tpu_metrics_pb2_grpc as pb_grpc

        with self._lock:
            if self._stub is None:
                if is_loopback(self._host):
                    creds = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
                    self._channel = grpc.secure_channel(self.addr, creds)
                else:
                    self._channel = grpc.insecure_channel(self.addr)
                self._stub = pb_grpc.RuntimeMetricServiceStub(self._channel)
            return self._stub

    def reset(self) -> None:
        """Drop the channel; the next call dials again (no waiting out gRPC's backoff)."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel, self._stub = None, None

    def supported(self, timeout_s: float) -> set[str] | None:
        """Metric names the runtime lists, or None when it does not implement the call."""
        import grpc

        stub = self._connect()
        try:
            response = stub.ListSupportedMetrics(
                pb.ListSupportedMetricsRequest(), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise self._error(exc) from None
        return {m.metric_name for m in response.supported_metric}

    def read(self, names: Iterable[str], timeout_s: float) -> RuntimeReadout:
        """Every metric of ``names``, asked for at once; all calls share one deadline.

        Raises TpuRuntimeError when nothing could be read because of a failure; a
        metric the runtime does not know (NOT_FOUND) is listed in ``missing``.
        """
        import grpc

        stub = self._connect()
        futures = {
            name: stub.GetRuntimeMetric.future(
                pb.MetricRequest(metric_name=name), timeout=timeout_s
            )
            for name in names
        }
        out: dict[str, list[Any]] = {}
        missing: set[str] = set()
        first_error: TpuRuntimeError | None = None
        for name, future in futures.items():
            try:
                response = future.result()
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    missing.add(name)
                    continue
                first_error = first_error or self._error(exc)
                continue
            out[name] = list(response.metric.metrics)
        if first_error is not None and not out:
            raise first_error
        return RuntimeReadout(out, frozenset(missing), first_error)

    def _error(self, exc: grpc.RpcError) -> TpuRuntimeError:
        import grpc

        code = exc.code()
        detail = f"{self.addr}: {code.name} {exc.details() or ''}".strip()
        if code == grpc.StatusCode.UNAVAILABLE:
            self.reset()
        return TpuRuntimeError(code.name.lower(), detail)

    def close(self) -> None:
        self.reset()


def _host_histograms(
    distributions: dict[str, list[Reading | HistogramReading]],
) -> dict[str, list[Reading | HistogramReading]]:
    """Per-chip histograms summed into one per host: the chip label goes.

    Histograms are there to aggregate (a slice's quantiles); per chip, 42 buckets x 256
    chips would quadruple a large host's /metrics, while the per-chip percentile gauges
    already show the chip that stands out.
    """
    out: dict[str, list[Reading | HistogramReading]] = {}
    summed: dict[tuple[str, tuple[tuple[str, str | None], ...]], HistogramReading] = {}
    for chip, readings in distributions.items():
        kept = out.setdefault(chip, [])
        for reading in readings:
            if chip == "" or not isinstance(reading, HistogramReading):
                kept.append(reading)
                continue
            key = (reading.metric, tuple(sorted(reading.attrs.items())))
            found = summed.get(key)
            if found is None:
                summed[key] = reading
                continue
            buckets = found.buckets.plus(reading.buckets)
            if buckets is not found.buckets:  # else another layout: not addable, left out
                summed[key] = found._replace(buckets=buckets, total=found.total + reading.total)
    if summed:
        out.setdefault("", []).extend(summed.values())
    return out


class _Chip:
    """One chip's values while a collection assembles them."""

    __slots__ = ("fields", "readings")

    def __init__(self) -> None:
        self.fields: dict[str, float] = {}
        self.readings: list[Reading | HistogramReading] = []


_FIELD_OF: Final = {
    "accelerator.duty_cycle": "duty_cycle",
    "accelerator.tensorcore.utilization": "tensorcore_utilization",
    "accelerator.memory.usage": "memory_usage",
    "accelerator.memory.limit": "memory_limit",
}


@dataclass
class TpuSource:
    """Collects libtpu runtime metrics into a :class:`DeviceSeries` (``source="libtpu"``).

    ``collect`` blocks for at most ``timeout_s`` and returns ``(state, detail)`` for
    ``/readyz``; ``skipped()`` lists the metrics this runtime does not offer. With
    ``optional`` (``MLPROF_SOURCES=auto``) and no TPU on the machine, a runtime that
    does not answer means "off", not an error.
    """

    client: TpuRuntimeClient
    series: DeviceSeries
    identity: RunIdentity
    timeout_s: float = 2.0
    optional: bool = False
    present: Callable[[], bool] = tpu_present
    on_error: Callable[[str], None] | None = None
    # A distribution skipped (reason), finite buckets merged away (how many): counted so a
    # runtime sending nonsense shows on the health dashboard while the other metrics stay.
    on_distribution_skipped: Callable[[str], None] | None = None
    on_buckets_merged: Callable[[int], None] | None = None
    name: str = "tpu"
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._supported: set[str] | None = None
        self._checked = False
        self._seen = False
        self._last_state = ""
        self._totals: dict[str, float] = {}
        self._totals_at = float("-inf")
        # chip ("" host) -> last readings
        self._distributions: dict[str, list[Reading | HistogramReading]] = {}
        self._distributions_at = float("-inf")
        self._absent: set[str] = set()  # libtpu names this runtime does not offer
        self._window = DistributionWindow(PERCENTILE_WINDOW_S, self.clock)
        self._totals_of = MonotonicTotals()
        self._skipped_logged: set[tuple[Any, str]] = set()

    def skipped(self) -> list[str]:
        """libtpu metrics this runtime does not offer (for ``/readyz``)."""
        return sorted(m.name for m in RUNTIME_METRICS if set(m.names) <= self._absent)

    def _set_absent(self, absent: set[str]) -> None:
        before = set(self.skipped())
        self._absent = absent
        for name in sorted(set(self.skipped()) - before):
            log.info("libtpu at %s does not offer %s: skipped", self.client.addr, name)

    def _to_read(self) -> dict[str, RuntimeMetric]:
        """libtpu name -> its entry, for the metrics to ask for now."""
        if not self._checked:
            supported = self.client.supported(self.timeout_s)
            self._checked = True
            if supported is not None:  # else: learn from NOT_FOUND answers
                self._set_absent({n for m in RUNTIME_METRICS for n in m.names} - supported)
        out: dict[str, RuntimeMetric] = {}
        for metric in RUNTIME_METRICS:
            # The first alternative not known to be absent (tried one at a time).
            name = next((n for n in metric.names if n not in self._absent), None)
            if name is not None:
                out[name] = metric
        return out

    def collect(self) -> tuple[str, str]:
        """Read the runtime once and store its values; never raises."""
        now = self.clock()
        try:
            wanted = self._to_read()
            if now - self._totals_at < TOTAL_REFRESH_S:
                wanted.pop(HBM_TOTAL_METRIC, None)
            if now - self._distributions_at < DISTRIBUTION_REFRESH_S:
                wanted = {n: m for n, m in wanted.items() if not m.distribution}
            readout = self.client.read(wanted, self.timeout_s)
        except TpuRuntimeError as exc:
            self._checked = False  # the runtime may come back as another libtpu
            self._totals_at = self._distributions_at = float("-inf")
            absent = exc.reason == "unavailable" and self.optional and not self._seen
            if absent and not self.present():
                return self._report("off", f"no TPU runtime answers at {self.client.addr}")
            if self.on_error:
                self.on_error(exc.reason)
            return self._report("error", str(exc))
        self._seen = True
        if readout.missing:  # not offered; an alternative name is tried next time
            self._set_absent(self._absent | readout.missing)
        chips, host = self._assemble(readout.metrics, wanted, now)
        samples = [
            DeviceSample(
                chip,
                duty_cycle=c.fields.get("duty_cycle"),
                tensorcore_utilization=c.fields.get("tensorcore_utilization"),
                memory_usage=c.fields.get("memory_usage"),
                memory_limit=c.fields.get("memory_limit"),
                readings=tuple(c.readings),
            )
            for chip, c in sorted(chips.items(), key=lambda kv: (len(kv[0]), kv[0]))
        ]
        if host:
            samples.append(DeviceSample("", readings=tuple(host)))
        self.series.update(samples, self.identity.current())
        self._window.forget_unseen()
        detail = f"{len(chips)} chips at {self.client.addr}"
        if skipped := self.skipped():
            detail += f"; {len(skipped)} metrics not offered (see skipped)"
        if readout.error is not None:
            if self.on_error:
                self.on_error(readout.error.reason)
            return self._report("error", f"{len(chips)} chips, but {readout.error}")
        return self._report("ok", detail)

    def _assemble(
        self, metrics: Mapping[str, list[Any]], wanted: Mapping[str, RuntimeMetric], now: float
    ) -> tuple[dict[str, _Chip], list[Reading | HistogramReading]]:
        chips: dict[str, _Chip] = {}
        host: list[Reading | HistogramReading] = []
        distributions: dict[str, list[Reading | HistogramReading]] = {}
        for name, samples in metrics.items():
            entry = wanted[name]
            if entry.per_chip:
                self._per_chip(name, entry, samples, chips, distributions)
            else:
                distributions.setdefault("", []).extend(
                    self._host_distribution(name, entry, samples)
                )
        if any(m.distribution for m in wanted.values()):
            self._distributions, self._distributions_at = _host_histograms(distributions), now
        for chip, readings in self._distributions.items():  # fresh, or the last ones
            if chip == "":
                host.extend(readings)
            elif chip in chips:
                chips[chip].readings.extend(readings)
        if HBM_TOTAL_METRIC in metrics:
            self._totals, self._totals_at = self._column(chips, "memory_limit"), now
        else:
            for chip, total in self._totals.items():
                if chip in chips:
                    chips[chip].fields["memory_limit"] = total
            if not set(chips) <= set(self._totals):
                self._totals_at = float("-inf")  # a chip without capacity yet: re-read next time
        return chips, host

    @staticmethod
    def _column(chips: Mapping[str, _Chip], field_name: str) -> dict[str, float]:
        return {c: v.fields[field_name] for c, v in chips.items() if field_name in v.fields}

    def _per_chip(
        self,
        name: str,
        entry: RuntimeMetric,
        samples: list[Any],
        chips: dict[str, _Chip],
        distributions: dict[str, list[Reading | HistogramReading]],
    ) -> None:
        for metric in samples:
            chip, core_type = _device_of(metric.attribute)
            if chip is None:
                continue
            attrs = {"core_type": core_type} if core_type else NO_ATTRIBUTES
            target = chips.setdefault(chip, _Chip())
            if metric.WhichOneof("measure") == "distribution":
                key = (name, chip, core_type)
                readings = self._distribution(key, entry, [metric.distribution], attrs)
                distributions.setdefault(chip, []).extend(readings)
                continue
            value = _number(metric)
            if value is None:
                continue
            value = value * entry.scale / entry.divisor
            if entry.ratio:
                value = min(1.0, max(0.0, value))
            field_name = _FIELD_OF.get(entry.metric)
            if field_name is not None:
                target.fields[field_name] = value
            else:
                target.readings.append(Reading(entry.metric, value, attrs))

    def _host_distribution(
        self, name: str, entry: RuntimeMetric, samples: list[Any]
    ) -> list[Reading | HistogramReading]:
        """Readings of a megascale distribution: samples of one buffer size are summed."""
        groups: dict[str | None, list[Any]] = {}
        for metric in samples:
            if metric.WhichOneof("measure") == "distribution":
                size = _inner_string(metric.attribute, BUFFER_SIZE_KEY)
                groups.setdefault(size, []).append(metric.distribution)
        out: list[Reading | HistogramReading] = []
        for size, dists in groups.items():
            attrs = dict(entry.attrs)
            if size is not None:
                attrs["buffer_size"] = size
            out.extend(self._distribution((name, size), entry, dists, attrs))
        return out

    def _distribution(
        self,
        key: tuple[Any, ...],
        entry: RuntimeMetric,
        distributions: list[Any],
        attrs: Mapping[str, str | None],
    ) -> list[Reading | HistogramReading]:
        """Histogram, percentile gauges (and counters) of one distribution, or several summed."""
        total: Buckets | None = None
        for distribution in distributions:
            try:
                part, merged = buckets_of(distribution, entry.scale, entry.divisor)
            except BadDistributionError as exc:
                self._skip(key, exc)
                continue
            if merged and self.on_buckets_merged:
                self.on_buckets_merged(merged)
            total = part if total is None else total.plus(part)
        if total is None:
            return []
        time_s = self._totals_of.total(key, total.count, total.total)
        histogram = HistogramReading(entry.metric, total, time_s, attrs)
        out: list[Reading | HistogramReading] = [histogram]
        recent = self._window.recent(key, total)
        values = recent.percentiles([q for _, q in PERCENTILES])
        for (label, _q), value in zip(PERCENTILES, values, strict=True):
            if value is not None:
                out.append(Reading(entry.metric, value, {**attrs, "percentile": label}))
        if entry.counters:
            base = entry.metric.rsplit(".", 1)[0]
            out.append(Reading(f"{base}.count", float(total.count), attrs))
            out.append(Reading(f"{base}.time", time_s, attrs))
        return out

    def _skip(self, key: tuple[Any, ...], exc: BadDistributionError) -> None:
        """Count a distribution not read; log it once per metric and reason, not per interval."""
        if self.on_distribution_skipped:
            self.on_distribution_skipped(exc.reason)
        if (key[0], exc.reason) not in self._skipped_logged:
            self._skipped_logged.add((key[0], exc.reason))
            log.warning("libtpu at %s sent a bad %s distribution, skipped: %s",
                        self.client.addr, key[0], exc)  # fmt: skip

    def _report(self, state: str, detail: str) -> tuple[str, str]:
        if state != self._last_state:
            # One line per change of state, not one per interval.
            level = logging.WARNING if state == "error" else logging.INFO
            log.log(level, "TPU source %s: %s", state, detail)
            self._last_state = state
        return state, detail

    def close(self) -> None:
        self.client.close()
