"""A fake libtpu runtime-metrics server: the real gRPC service with scripted values.

For demos and tests without a TPU. It speaks ``tpu.monitoring.runtime.RuntimeMetricService``
exactly as libtpu does (``tpu-info`` can read it), so the sidecar cannot tell it apart.

A script is a YAML or JSON file::

    chips: 4                      # default number of chips
    hbm_total_bytes: 17179869184  # per chip (16 GiB, a v5e)
    period_s: 5                   # each frame lasts this long; frames repeat
    frames:
      - duty_cycle_percent: [97, 95, 90, 12]      # one value per chip
        hbm_usage_bytes: [8.0e9, 8.1e9, 8.2e9, 1.0e9]
        tensorcore_util_percent: [60, 58, 55, 3]  # optional
      - duty_cycle_percent: [40, 41, 42, 43]

A frame may list fewer chips than ``chips``: the others are absent in that frame.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from exporter.config import parse_hostport
from exporter.errors import InputError
from exporter.metrics.tpu import (
    DUTY_CYCLE_METRIC,
    HBM_TOTAL_METRIC,
    HBM_USAGE_METRIC,
    TENSORCORE_UTIL_METRICS,
)
from exporter.proto import tpu_metrics_pb2 as pb
from exporter.proto import tpu_metrics_pb2_grpc as pb_grpc

__all__ = ["FakeFrame", "FakeTpuRuntime", "FakeTpuScript", "default_script", "load_script"]

log = logging.getLogger(__name__)

TENSORCORE_UTIL_METRIC = TENSORCORE_UTIL_METRICS[0]
GIB = 1 << 30
DEFAULT_HBM_TOTAL = 16 * GIB  # a v5e chip


@dataclass(frozen=True)
class FakeFrame:
    """Values of each chip during one frame; ``None`` where a chip has no value."""

    duty_cycle_percent: tuple[float | None, ...]
    hbm_usage_bytes: tuple[float | None, ...]
    tensorcore_util_percent: tuple[float | None, ...] = ()


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
            )
        )
    return FakeTpuScript(n, int(total), float(period), tuple(frames))


@dataclass
class _State:
    script: FakeTpuScript
    started: float = field(default_factory=time.monotonic)
    delay_s: float = 0.0
    absent: set[int] = field(default_factory=set)
    overrides: dict[tuple[str, int], float] = field(default_factory=dict)


def _metric(chip: int, value: float, as_int: bool) -> Any:
    gauge = pb.Gauge(as_int=int(value)) if as_int else pb.Gauge(as_double=value)
    return pb.Metric(
        attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=chip)), gauge=gauge
    )


class _Servicer(pb_grpc.RuntimeMetricServiceServicer):  # type: ignore[misc]
    def __init__(self, runtime: FakeTpuRuntime) -> None:
        self.runtime = runtime

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        self.runtime._wait()
        names = [DUTY_CYCLE_METRIC, HBM_USAGE_METRIC, HBM_TOTAL_METRIC]
        if self.runtime.tensorcore_util:
            names.append(TENSORCORE_UTIL_METRIC)
        names = [n for n in names if request.filter in n]
        return pb.ListSupportedMetricsResponse(
            supported_metric=[pb.SupportedMetric(metric_name=n) for n in names]
        )

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        self.runtime._wait()
        values = self.runtime.values(request.metric_name)
        if values is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
            return None  # abort raised; for the type checker
        as_int = request.metric_name in (HBM_USAGE_METRIC, HBM_TOTAL_METRIC)
        return pb.MetricResponse(
            metric=pb.TPUMetric(
                name=request.metric_name,
                description=f"fake {request.metric_name}",
                metrics=[_metric(chip, v, as_int) for chip, v in sorted(values.items())],
            )
        )


class FakeTpuRuntime:
    """The fake server; tests steer it with ``remove_chip``, ``set_value`` and ``delay_s``.

    >>> with FakeTpuRuntime(default_script(4), "127.0.0.1:0") as fake:  # doctest: +SKIP
    ...     TpuRuntimeClient(fake.addr).read([DUTY_CYCLE_METRIC], 2)
    """

    def __init__(
        self,
        script: FakeTpuScript,
        listen: str = "127.0.0.1:8431",
        tensorcore_util: bool = True,
    ) -> None:
        self.script = script
        self.listen = listen
        self.tensorcore_util = tensorcore_util
        self._state = _State(script)
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port = 0
        self.requests = 0  # calls answered or being answered
        self._stopping = threading.Event()
        self.in_flight = 0  # calls being answered now (tests: "a read is under way")

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
        """Pin one chip's value of one metric (over the script)."""
        with self._lock:
            self._state.overrides[(metric_name, chip)] = value

    # -- values --------------------------------------------------------------------
    def frame(self, now: float | None = None) -> FakeFrame:
        elapsed = (now if now is not None else time.monotonic()) - self._state.started
        frames = self.script.frames
        return frames[int(elapsed // self.script.period_s) % len(frames)]

    def values(self, metric_name: str) -> dict[int, float] | None:
        """What the fake answers now for ``metric_name``: chip -> value; None if unknown."""
        frame = self.frame()
        if metric_name == DUTY_CYCLE_METRIC:
            column: Sequence[float | None] = frame.duty_cycle_percent
        elif metric_name == HBM_USAGE_METRIC:
            column = frame.hbm_usage_bytes
        elif metric_name == HBM_TOTAL_METRIC:
            column = [float(self.script.hbm_total_bytes)] * self.script.chips
        elif metric_name == TENSORCORE_UTIL_METRIC and self.tensorcore_util:
            column = frame.tensorcore_util_percent
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
                }
                for f in script.frames
            ],
        },
        indent=2,
    )
