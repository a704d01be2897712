"""TPU source: libtpu's runtime-metrics gRPC service, read the way ``tpu-info`` reads it.

The workload's libtpu serves ``tpu.monitoring.runtime.RuntimeMetricService`` on
``localhost:8431`` (``TPU_RUNTIME_METRICS_PORTS``). Each collection asks for duty
cycle, HBM usage and HBM total (and tensor-core utilisation when
``ListSupportedMetrics`` offers it) with one shared deadline, so a slow runtime
costs one deadline per interval and never a scrape.

The ``chip`` attribute is the device id the runtime puts on each sample. On chips
with two devices (v2, v3, 7x) memory is reported per device and duty cycle per chip,
so their ids are published as the runtime gives them, not merged.

``libtpu.sdk.tpumonitoring.get_metric`` is deliberately not used: off GCE it can
block for minutes looking for the metadata server, and it needs libtpu in the
sidecar's image.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from exporter.config import is_loopback, parse_hostport
from exporter.metrics.accelerator import DeviceSample, DeviceSeries, RunIdentity
from exporter.proto import tpu_metrics_pb2 as pb

if TYPE_CHECKING:
    # grpc is imported on first use: machines without a TPU never need it.
    import grpc

__all__ = [
    "DUTY_CYCLE_METRIC",
    "HBM_TOTAL_METRIC",
    "HBM_USAGE_METRIC",
    "TENSORCORE_UTIL_METRICS",
    "TpuRuntimeClient",
    "TpuRuntimeError",
    "TpuSource",
    "tpu_present",
]

log = logging.getLogger(__name__)

DUTY_CYCLE_METRIC: Final = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_USAGE_METRIC: Final = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL_METRIC: Final = "tpu.runtime.hbm.memory.total.bytes"
# Tensor-core utilisation is not offered by every libtpu; it is read only when
# ListSupportedMetrics lists one of these names.
TENSORCORE_UTIL_METRICS: Final = (
    "tpu.runtime.tensorcore.utilization.percent",
    "tpu.runtime.tensorcore.util.percent",
)
BASE_METRICS: Final = (DUTY_CYCLE_METRIC, HBM_USAGE_METRIC, HBM_TOTAL_METRIC)
# Device attribute keys seen in libtpu responses: a plain ``device-id`` int or
# string on per-chip gauges, ``device_ordinal`` inside a key/value list on others.
DEVICE_KEYS: Final = frozenset({"device-id", "device_id", "device_ordinal", "chip", "device"})
# HBM capacity does not change while a runtime lives: re-read it this often (and after
# any error or a new chip), saving one of the 3-4 calls, each ~1 ms of CPU, per interval.
TOTAL_REFRESH_S: Final = 60.0


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


def _device_of(attribute: Any) -> str | None:
    value = attribute.value
    which = value.WhichOneof("attr")
    if which == "kvlist_attr":
        for inner in value.kvlist_attr.attributes:
            if inner.key in DEVICE_KEYS:
                return _device_of(inner)
        return None
    if which == "int_attr":
        return str(value.int_attr)
    if which == "string_attr" and value.string_attr.strip():
        return str(value.string_attr).strip()
    return None


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


class TpuRuntimeClient:
    """Client of the runtime-metrics service with a deadline on every call.

    Loopback addresses use gRPC local credentials, as ``tpu-info`` does; others
    (a node agent reading another pod) use a plaintext channel.

    >>> client = TpuRuntimeClient("localhost:8431")  # doctest: +SKIP
    >>> client.read([DUTY_CYCLE_METRIC], timeout_s=2)  # doctest: +SKIP
    {'tpu.runtime.tensorcore.dutycycle.percent': {'0': 97.5}}
    """

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self._host, _ = parse_hostport(addr)
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self.partial_error: TpuRuntimeError | None = None  # of the last read that got data
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

    def read(self, names: Iterable[str], timeout_s: float) -> dict[str, dict[str, float]]:
        """Per metric name, the value of each device; all calls share one deadline.

        Raises TpuRuntimeError when no metric could be read; a metric the runtime does
        not know (NOT_FOUND) is left out. ``partial_error`` tells of other failures.
        """
        import grpc

        stub = self._connect()
        futures = {
            name: stub.GetRuntimeMetric.future(
                pb.MetricRequest(metric_name=name), timeout=timeout_s
            )
            for name in names
        }
        out: dict[str, dict[str, float]] = {}
        first_error: TpuRuntimeError | None = None
        for name, future in futures.items():
            try:
                response = future.result()
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    continue  # this runtime does not export the metric
                first_error = first_error or self._error(exc)
                continue
            values: dict[str, float] = {}
            for metric in response.metric.metrics:
                chip = _device_of(metric.attribute)
                value = _number(metric)
                if chip is not None and value is not None:
                    values[chip] = value
            out[name] = values
        self.partial_error = first_error if out else None
        if first_error is not None and not out:
            raise first_error
        return out

    def _error(self, exc: grpc.RpcError) -> TpuRuntimeError:
        import grpc

        code = exc.code()
        detail = f"{self.addr}: {code.name} {exc.details() or ''}".strip()
        if code == grpc.StatusCode.UNAVAILABLE:
            self.reset()
        return TpuRuntimeError(code.name.lower(), detail)

    def close(self) -> None:
        self.reset()


@dataclass
class TpuSource:
    """Collects libtpu runtime metrics into a :class:`DeviceSeries` (``source="libtpu"``).

    ``collect`` blocks for at most ``timeout_s`` and returns ``(state, detail)`` for
    ``/readyz``. With ``optional`` (``MLPROF_SOURCES=auto``) and no TPU on the machine,
    a runtime that does not answer means "off", not an error.
    """

    client: TpuRuntimeClient
    series: DeviceSeries
    identity: RunIdentity
    timeout_s: float = 2.0
    optional: bool = False
    present: Callable[[], bool] = tpu_present
    on_error: Callable[[str], None] | None = None
    name: str = "tpu"

    def __post_init__(self) -> None:
        self._supported: set[str] | None = None
        self._checked = False
        self._seen = False
        self._last_state = ""
        self._totals: dict[str, float] = {}
        self._totals_at = float("-inf")

    def _metric_names(self) -> list[str]:
        if not self._checked:
            self._supported = self.client.supported(self.timeout_s)
            self._checked = True
        supported = self._supported
        if supported is None:  # ListSupportedMetrics unimplemented: ask for the basics
            return list(BASE_METRICS)
        names: list[str] = [n for n in BASE_METRICS if n in supported]
        return names + [n for n in TENSORCORE_UTIL_METRICS if n in supported][:1]

    def collect(self) -> tuple[str, str]:
        """Read the runtime once and store its values; never raises."""
        now = time.monotonic()
        try:
            names = self._metric_names()
            if now - self._totals_at < TOTAL_REFRESH_S:
                names = [n for n in names if n != HBM_TOTAL_METRIC]
            values = self.client.read(names, self.timeout_s)
        except TpuRuntimeError as exc:
            self._checked = False  # the runtime may come back as another libtpu
            self._totals_at = float("-inf")
            absent = exc.reason == "unavailable" and self.optional and not self._seen
            if absent and not self.present():
                return self._report("off", f"no TPU runtime answers at {self.client.addr}")
            if self.on_error:
                self.on_error(exc.reason)
            return self._report("error", str(exc))
        self._seen = True
        duty = values.get(DUTY_CYCLE_METRIC, {})
        usage = values.get(HBM_USAGE_METRIC, {})
        util = next((values[n] for n in TENSORCORE_UTIL_METRICS if n in values), {})
        if HBM_TOTAL_METRIC in values:
            self._totals, self._totals_at = values[HBM_TOTAL_METRIC], now
        total = self._totals
        chips = set(duty) | set(usage) | set(util)
        if HBM_TOTAL_METRIC in values:
            chips |= set(total)
        elif not chips <= set(total):
            self._totals_at = float("-inf")  # a chip without capacity yet: re-read next time
        samples = [
            DeviceSample(
                chip,
                duty_cycle=_ratio(duty.get(chip)),
                tensorcore_utilization=_ratio(util.get(chip)),
                memory_usage=usage.get(chip),
                memory_limit=total.get(chip),
            )
            for chip in sorted(chips, key=lambda c: (len(c), c))
        ]
        self.series.update(samples, self.identity.current())
        partial = self.client.partial_error
        if partial is not None:
            if self.on_error:
                self.on_error(partial.reason)
            return self._report("error", f"{len(chips)} chips, but {partial}")
        return self._report("ok", f"{len(chips)} chips at {self.client.addr}")

    def _report(self, state: str, detail: str) -> tuple[str, str]:
        if state != self._last_state:
            # One line per change of state, not one per interval.
            level = logging.WARNING if state == "error" else logging.INFO
            log.log(level, "TPU source %s: %s", state, detail)
            self._last_state = state
        return state, detail

    def close(self) -> None:
        self.client.close()


def _ratio(percent: float | None) -> float | None:
    """libtpu reports percent; the gauge is a 0..1 ratio (clamped against rounding)."""
    if percent is None:
        return None
    return min(1.0, max(0.0, percent / 100.0))
