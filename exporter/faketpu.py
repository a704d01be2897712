"""A fake libtpu runtime-metrics server: the real gRPC service with scripted values.

For demos and tests without a TPU. It speaks ``tpu.monitoring.runtime.RuntimeMetricService``
exactly as libtpu does (``tpu-info`` can read it), so the sidecar cannot tell it apart.
It serves every metric of :data:`exporter.metrics.tpu.RUNTIME_METRICS`: per-chip
gauges from the script, and latency distributions (DCN, host transfers, collectives,
HLO execution, TCP RTT and delivery rate) that grow as time passes
(:mod:`exporter.faketpu_latencies`). ``offered`` limits what it serves, like an older
libtpu; ``list_supported=False`` answers ``ListSupportedMetrics`` UNIMPLEMENTED.

A script is a YAML or JSON file::

    chips: 4                      # default number of chips
    hbm_total_bytes: 17179869184  # per chip (16 GiB, a v5e)
    period_s: 5                   # each frame lasts this long; frames repeat
    frames:
      - duty_cycle_percent: [97, 95, 90, 12]      # one value per chip
        hbm_usage_bytes: [8.0e9, 8.1e9, 8.2e9, 1.0e9]
        tensorcore_util_percent: [60, 58, 55, 3]  # optional
        hbm_bandwidth_util_percent: [45, 44, 40, 2]  # optional (default: from duty cycle)
        latency_scale: 1.0        # optional: multiplies every latency in this frame
      - duty_cycle_percent: [40, 41, 42, 43]
        latency_scale: 3          # e.g. a DCN regression

A frame may list fewer chips than ``chips``: the others are absent in that frame.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import yaml

from exporter.config import parse_hostport
from exporter.errors import InputError
from exporter.faketpu_latencies import (
    BUCKET_GROWTH,
    BUCKET_SCALE,
    FINITE_BUCKETS,
    LatencyProfile,
    RuntimeHistory,
)
from exporter.metrics.tpu import (
    BUFFER_SIZE_KEY,
    CORE_TYPE_KEY,
    DUTY_CYCLE_METRIC,
    HBM_TOTAL_METRIC,
    HBM_USAGE_METRIC,
    RUNTIME_METRICS,
    TENSORCORE_UTIL_METRICS,
)
from exporter.proto import tpu_metrics_pb2 as pb
from exporter.proto import tpu_metrics_pb2_grpc as pb_grpc

__all__ = [
    "ALL_METRICS",
    "BASIC_METRICS",
    "FakeFrame",
    "FakeTpuRuntime",
    "FakeTpuScript",
    "default_script",
    "load_script",
]

log = logging.getLogger(__name__)

TENSORCORE_UTIL_METRIC = TENSORCORE_UTIL_METRICS[0]
HBM_BW_UTIL_METRIC: Final = "tpu.runtime.hbm.utilization.percent"
IDLE_DURATION_METRIC: Final = "tpu.runtime.tensorcore.idle_duration.seconds"
HLO_QUEUE_METRIC: Final = "hlo.queue.size.gauge"
HLO_EXEC_METRIC: Final = "hlo.execution.timing.distribution.microseconds"
GIB = 1 << 30
DEFAULT_HBM_TOTAL = 16 * GIB  # a v5e chip
CORE_TYPE = "tensor_core"

# Every name the fake can serve (the first name of each entry), and what an older
# libtpu served (the sidecar's metric set before the full TPU Monitoring Library).
ALL_METRICS: Final = tuple(m.name for m in RUNTIME_METRICS)
BASIC_METRICS: Final = (
    DUTY_CYCLE_METRIC,
    HBM_USAGE_METRIC,
    HBM_TOTAL_METRIC,
    TENSORCORE_UTIL_METRIC,
)

_M = "megascale.{}.microsecond.cumulative.distribution"
_SIZES = ("1MB+", "4MB+", "8MB+")


def _sized(
    medians: Sequence[float], sigma: float, rates: Sequence[float]
) -> dict[str | None, LatencyProfile]:
    return {s: LatencyProfile(m, sigma, r) for s, m, r in zip(_SIZES, medians, rates, strict=True)}


# Host-level (megascale) distributions by buffer size; medians in us (Mbit/s for the rate),
# after tpu-info's documented output on a v6e slice.
HOST_DISTRIBUTIONS: Final[dict[str, dict[str | None, LatencyProfile]]] = {
    _M.format("dcn_transfer_latencies"): _sized((2400, 21700, 109000), 0.4, (40, 12, 6)),
    _M.format("dcn_inbound_transfer_latencies"): _sized((900, 4800, 19000), 0.45, (40, 12, 6)),
    _M.format("host_to_device_transfer_latencies"): _sized((160, 560, 1100), 0.3, (30, 10, 5)),
    _M.format("device_to_host_transfer_latencies"): _sized((190, 640, 1250), 0.3, (30, 10, 5)),
    _M.format("collective_end_to_end_latencies"): _sized((420, 1500, 2900), 0.35, (80, 30, 10)),
    _M.format("mxla_compute_latencies"): _sized((300, 680, 1000), 0.9, (40, 12, 6)),
    _M.format("grpc_tcp_min_rtt"): {None: LatencyProfile(36.0, 0.2, 20)},
    "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution": {
        None: LatencyProfile(12300.0, 0.5, 20, inverse=True)
    },
}
HLO_EXEC_MEDIAN_US = 8500.0  # per program on a chip; chip i adds 2% so chips differ
HLO_EXEC_RATE = 50.0


@dataclass(frozen=True)
class FakeFrame:
    """Values of each chip during one frame; ``None`` where a chip has no value."""

    duty_cycle_percent: tuple[float | None, ...]
    hbm_usage_bytes: tuple[float | None, ...]
    tensorcore_util_percent: tuple[float | None, ...] = ()
    hbm_bandwidth_util_percent: tuple[float | None, ...] = ()  # () : derived from duty cycle
    latency_scale: float = 1.0


@dataclass(frozen=True)
class FakeTpuScript:
    chips: int
    hbm_total_bytes: int
    period_s: float
    frames: tuple[FakeFrame, ...]


def default_script(chips: int) -> FakeTpuScript:
    """Constant, distinct values per chip, so a reader can match every series to a chip."""
    return FakeTpuScript(
        chips=chips,
        hbm_total_bytes=DEFAULT_HBM_TOTAL,
        period_s=5.0,
        frames=(
            FakeFrame(
                duty_cycle_percent=tuple(95.0 - 10.0 * (i % 9) for i in range(chips)),
                hbm_usage_bytes=tuple(float((4 + i % 12) * GIB) for i in range(chips)),
                tensorcore_util_percent=tuple(60.0 - 5.0 * (i % 12) for i in range(chips)),
            ),
        ),
    )


def _values(where: str, raw: Any, chips: int) -> tuple[float | None, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > chips:
        raise InputError(f"{where}: expected a list of at most {chips} numbers (one per chip)")
    out: list[float | None] = []
    for raw_item in raw:
        # YAML 1.1 reads 1.0e9 (no exponent sign) as text.
        item = _yaml_number(raw_item) if isinstance(raw_item, str) else raw_item
        if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)):
            raise InputError(f"{where}: expected numbers or null, got {item!r}")
        out.append(None if item is None else float(item))
    return tuple(out)


def _scale(where: str, raw: Any) -> float:
    value = _yaml_number(raw) if isinstance(raw, str) else raw
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InputError(f"{where}: expected a positive number, got {raw!r}")
    return float(value)


def _yaml_number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def load_script(path: Path, chips: int | None = None) -> FakeTpuScript:
    """Read a script file; raise InputError naming the file and what was expected."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--script {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"--script {path}: not YAML or JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("frames"), list) or not data["frames"]:
        raise InputError(f"--script {path}: expected a mapping with a non-empty 'frames' list")
    n = chips if chips is not None else data.get("chips", 4)
    total = data.get("hbm_total_bytes", DEFAULT_HBM_TOTAL)
    period = data.get("period_s", 5.0)
    if not isinstance(n, int) or not 1 <= n <= 4096:
        raise InputError(f"--script {path}: 'chips' must be an integer 1..4096, got {n!r}")
    if not isinstance(total, int | float) or total <= 0:
        raise InputError(f"--script {path}: 'hbm_total_bytes' must be a positive number")
    if not isinstance(period, int | float) or period <= 0:
        raise InputError(f"--script {path}: 'period_s' must be a positive number")
    frames = []
    for i, raw in enumerate(data["frames"]):
        where = f"--script {path}: frames[{i}]"
        if not isinstance(raw, dict):
            raise InputError(f"{where}: expected a mapping")
        frames.append(
            FakeFrame(
                duty_cycle_percent=_values(
                    f"{where}.duty_cycle_percent", raw.get("duty_cycle_percent"), n
                ),
                hbm_usage_bytes=_values(f"{where}.hbm_usage_bytes", raw.get("hbm_usage_bytes"), n),
                tensorcore_util_percent=_values(
                    f"{where}.tensorcore_util_percent", raw.get("tensorcore_util_percent"), n
                ),
                hbm_bandwidth_util_percent=_values(
                    f"{where}.hbm_bandwidth_util_percent",
                    raw.get("hbm_bandwidth_util_percent"),
                    n,
                ),
                latency_scale=_scale(f"{where}.latency_scale", raw.get("latency_scale", 1.0)),
            )
        )
    return FakeTpuScript(n, int(total), float(period), tuple(frames))


@dataclass
class _State:
    script: FakeTpuScript
    started: float
    delay_s: float = 0.0
    absent: set[int] = field(default_factory=set)
    overrides: dict[tuple[str, int], float] = field(default_factory=dict)


def _device(chip: int) -> Any:
    return pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=chip))


def _kv(values: dict[str, str]) -> Any:
    """A key/value-list attribute, as libtpu puts on HLO and megascale metrics."""
    inner = [pb.Attribute(key=k, value=pb.AttrValue(string_attr=v)) for k, v in values.items()]
    return pb.Attribute(value=pb.AttrValue(kvlist_attr=pb.KeyValueList(attributes=inner)))


def _chip_kv(chip: int) -> Any:
    # libtpu's newer string form of device_ordinal (tpu-info reads both).
    return _kv({"device_ordinal": str(chip), CORE_TYPE_KEY: CORE_TYPE})


def _gauge(attribute: Any, value: float, as_int: bool) -> Any:
    gauge = pb.Gauge(as_int=int(value)) if as_int else pb.Gauge(as_double=value)
    return pb.Metric(attribute=attribute, gauge=gauge)


def _distribution(attribute: Any, counts: list[int], count: int, mean: float) -> Any:
    options = pb.Distribution.BucketOptions(
        exponential_buckets=pb.Distribution.BucketOptions.Exponential(
            num_finite_buckets=FINITE_BUCKETS, growth_factor=BUCKET_GROWTH, scale=BUCKET_SCALE
        )
    )
    return pb.Metric(
        attribute=attribute,
        distribution=pb.Distribution(
            count=count, mean=mean, bucket_options=options, bucket_counts=counts
        ),
    )


class _Servicer(pb_grpc.RuntimeMetricServiceServicer):  # type: ignore[misc]
    def __init__(self, runtime: FakeTpuRuntime) -> None:
        self.runtime = runtime

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        self.runtime._wait()
        if not self.runtime.list_supported:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListSupportedMetrics not implemented")
            return None
        names = [n for n in self.runtime.offered if request.filter in n]
        return pb.ListSupportedMetricsResponse(
            supported_metric=[pb.SupportedMetric(metric_name=n) for n in names]
        )

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        self.runtime._wait()
        metrics = self.runtime.metrics(request.metric_name)
        if metrics is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
            return None  # abort raised; for the type checker
        return pb.MetricResponse(
            metric=pb.TPUMetric(
                name=request.metric_name,
                description=f"fake {request.metric_name}",
                metrics=metrics,
            )
        )


class FakeTpuRuntime:
    """The fake server; tests steer it with ``remove_chip``, ``set_value`` and ``delay_s``.

    ``offered``: the libtpu names it serves (default: all); ``clock``: monotonic time
    the distributions advance with (a fixed clock gives fixed numbers).

    >>> with FakeTpuRuntime(default_script(4), "127.0.0.1:0") as fake:  # doctest: +SKIP
    ...     TpuRuntimeClient(fake.addr).read([DUTY_CYCLE_METRIC], 2)
    """

    def __init__(
        self,
        script: FakeTpuScript,
        listen: str = "127.0.0.1:8431",
        tensorcore_util: bool = True,
        offered: Collection[str] | None = None,
        list_supported: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.script = script
        self.listen = listen
        names = ALL_METRICS if offered is None else tuple(offered)
        unknown = sorted(set(names) - set(ALL_METRICS))
        if unknown:
            raise InputError(f"unknown libtpu metrics {unknown}; expected some of {ALL_METRICS}")
        if not tensorcore_util:
            names = tuple(n for n in names if n != TENSORCORE_UTIL_METRIC)
        self.offered = names
        self.list_supported = list_supported
        self._clock = clock
        self._state = _State(script, started=clock())
        self._history = RuntimeHistory(
            self._state.started, script.period_s, lambda t: self.frame(t).latency_scale
        )
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port = 0
        self.requests = 0  # calls answered or being answered
        self._stopping = threading.Event()
        self.in_flight = 0  # calls being answered now (tests: "a read is under way")

    @property
    def tensorcore_util(self) -> bool:
        return TENSORCORE_UTIL_METRIC in self.offered

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> FakeTpuRuntime:
        host, port = _split_listen(self.listen)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(_Servicer(self), server)
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise InputError(f"--listen {self.listen}: cannot listen there ({exc})") from None
        if not self.port:
            raise InputError(f"--listen {self.listen}: cannot listen there (port in use?)")
        self._stopping.clear()
        server.start()
        self._server = server
        return self

    def stop(self, grace_s: float | None = None) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None

    def __enter__(self) -> FakeTpuRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def addr(self) -> str:
        host, _ = _split_listen(self.listen)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    # -- steering ----------------------------------------------------------------
    @property
    def delay_s(self) -> float:
        return self._state.delay_s

    @delay_s.setter
    def delay_s(self, value: float) -> None:
        self._state.delay_s = value

    def remove_chip(self, chip: int) -> None:
        with self._lock:
            self._state.absent.add(chip)

    def restore_chip(self, chip: int) -> None:
        with self._lock:
            self._state.absent.discard(chip)

    def set_value(self, metric_name: str, chip: int, value: float) -> None:
        """Pin one chip's value of one gauge metric (over the script)."""
        with self._lock:
            self._state.overrides[(metric_name, chip)] = value

    # -- values --------------------------------------------------------------------
    def frame(self, now: float | None = None) -> FakeFrame:
        elapsed = (now if now is not None else self._clock()) - self._state.started
        frames = self.script.frames
        return frames[int(elapsed // self.script.period_s) % len(frames)]

    def values(self, metric_name: str) -> dict[int, float] | None:
        """What the fake answers now for a per-chip gauge: chip -> value; None if unknown."""
        if metric_name not in self.offered:
            return None
        frame = self.frame()
        column: Sequence[float | None]
        if metric_name == DUTY_CYCLE_METRIC:
            column = frame.duty_cycle_percent
        elif metric_name == HBM_USAGE_METRIC:
            column = frame.hbm_usage_bytes
        elif metric_name == HBM_TOTAL_METRIC:
            column = [float(self.script.hbm_total_bytes)] * self.script.chips
        elif metric_name == TENSORCORE_UTIL_METRIC:
            column = frame.tensorcore_util_percent
        elif metric_name == HBM_BW_UTIL_METRIC:
            # Bandwidth follows work where the script does not say: 60% of the duty cycle.
            column = frame.hbm_bandwidth_util_percent or [
                None if d is None else round(0.6 * d, 2) for d in frame.duty_cycle_percent
            ]
        elif metric_name == IDLE_DURATION_METRIC:
            # A busy chip was idle a few ms ago; an idle one for longer.
            column = [
                None if d is None else round(0.002 + (100.0 - d) * 0.01, 4)
                for d in frame.duty_cycle_percent
            ]
        elif metric_name == HLO_QUEUE_METRIC:
            column = [
                None if d is None else float(1 + i % 3)
                for i, d in enumerate(frame.duty_cycle_percent)
            ]
        else:
            return None
        with self._lock:
            out = {chip: v for chip, v in enumerate(column) if v is not None}
            for (name, chip), value in self._state.overrides.items():
                if name == metric_name:
                    out[chip] = value
            for chip in self._state.absent:
                out.pop(chip, None)
        return out

    def metrics(self, metric_name: str) -> list[Any] | None:
        """The ``Metric`` samples the fake answers now for ``metric_name``; None if unknown."""
        if metric_name not in self.offered:
            return None
        now = self._clock()
        if metric_name in HOST_DISTRIBUTIONS:
            out = []
            for size, profile in HOST_DISTRIBUTIONS[metric_name].items():
                counts, count, mean = self._history.read((metric_name, size), profile, now)
                attribute = _kv({BUFFER_SIZE_KEY: size} if size is not None else {})
                out.append(_distribution(attribute, counts, count, mean))
            return out
        if metric_name == HLO_EXEC_METRIC:
            return self._hlo_exec(now)
        values = self.values(metric_name)
        if values is None:
            return None
        as_int = metric_name in (HBM_USAGE_METRIC, HBM_TOTAL_METRIC, HLO_QUEUE_METRIC)
        return [
            _gauge(_chip_kv(chip) if metric_name == HLO_QUEUE_METRIC else _device(chip), v, as_int)
            for chip, v in sorted(values.items())
        ]

    def _hlo_exec(self, now: float) -> list[Any]:
        duty = self.values(DUTY_CYCLE_METRIC) if DUTY_CYCLE_METRIC in self.offered else None
        chips = sorted(duty) if duty is not None else range(self.script.chips)
        out = []
        for chip in chips:
            if chip in self._state.absent:
                continue
            profile = LatencyProfile(
                HLO_EXEC_MEDIAN_US * (1 + 0.02 * (chip % 8)), 0.15, HLO_EXEC_RATE
            )
            counts, count, mean = self._history.read((HLO_EXEC_METRIC, chip), profile, now)
            attribute = _chip_kv(chip)
            out.append(_distribution(attribute, counts, count, mean))
        return out

    def table(self) -> str:
        """The current values as text, for the CLI banner."""
        duty = self.values(DUTY_CYCLE_METRIC) or {}
        usage = self.values(HBM_USAGE_METRIC) or {}
        total = self.values(HBM_TOTAL_METRIC) or {}
        util = self.values(TENSORCORE_UTIL_METRIC) or {}
        lines = ["chip  duty_cycle  tensorcore  hbm_usage_bytes  hbm_total_bytes"]
        for chip in sorted(set(duty) | set(usage)):
            lines.append(
                f"{chip:>4}  {_pct(duty.get(chip)):>10}  {_pct(util.get(chip)):>10}"
                f"  {_int(usage.get(chip)):>15}  {_int(total.get(chip)):>15}"
            )
        served = len(self.offered)
        lines.append(f"serving {served} of {len(ALL_METRICS)} libtpu runtime metrics")
        return "\n".join(lines)

    def _wait(self) -> None:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
        try:
            delay = self._state.delay_s
            if delay > 0:
                self._stopping.wait(delay)  # a stopping server does not keep sleepers
        finally:
            with self._lock:
                self.in_flight -= 1


def _split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` where port 0 means "any free port" (tests)."""
    if listen.endswith(":0"):
        return parse_hostport(listen[:-2], default_port=0)[0], 0
    try:
        return parse_hostport(listen)
    except ValueError as exc:
        raise InputError(f"--listen {listen}: {exc}") from None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:g}%"


def _int(value: float | None) -> str:
    return "-" if value is None else str(int(value))


def script_json(script: FakeTpuScript) -> str:
    """The script as JSON (what ``--script`` accepts), for docs and tests."""
    return json.dumps(
        {
            "chips": script.chips,
            "hbm_total_bytes": script.hbm_total_bytes,
            "period_s": script.period_s,
            "frames": [
                {
                    "duty_cycle_percent": list(f.duty_cycle_percent),
                    "hbm_usage_bytes": list(f.hbm_usage_bytes),
                    "tensorcore_util_percent": list(f.tensorcore_util_percent),
                    "hbm_bandwidth_util_percent": list(f.hbm_bandwidth_util_percent),
                    "latency_scale": f.latency_scale,
                }
                for f in script.frames
            ],
        },
        indent=2,
    )
