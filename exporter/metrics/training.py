"""Training metrics from the SDK's step log: steps, tokens, step time, user gauges, duty cycle.

Counters are observable and restored from persisted totals, so ``train_steps_total``
survives a sidecar restart without a reset. The step-time histogram is an ordinary
OpenTelemetry histogram and starts again from zero after a restart.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from exporter import schema
from exporter.metrics.accelerator import accelerator_gauges
from exporter.metrics.steplog import MalformedRecord

__all__ = ["TrainingMetrics"]

log = logging.getLogger(__name__)

SeriesKey = tuple[str, str, str]  # run_id, workload, host


class MemoryRecordHandler(Protocol):
    def handle(self, record: dict[str, Any], identity: Mapping[str, str]) -> None: ...
    def end(self, identity: Mapping[str, str]) -> None: ...


MAX_RECORD_NAMES = 32  # user gauges become metric names: keep the set bounded
# The SDK flushes every second; a workload silent for this long is not "up".
HEARTBEAT_TIMEOUT_S = 10.0
# Data younger than this may still sit in the SDK's buffer: the duty-cycle window
# never extends past it unless a step ended later.
SDK_FLUSH_LAG_S = 1.5
# A scrape must not read files: an unknown run's backend is looked up at most this often.
RUN_INFO_RETRY_S = 30.0
_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")


@dataclass
class _Series:
    steps: int = 0
    tokens: int = 0
    last_step: int = 0
    records: dict[str, float] = field(default_factory=dict)
    intervals: deque[tuple[float, float]] = field(default_factory=deque)
    first_start: float = 0.0
    last_end: float = 0.0
    last_heartbeat: float = 0.0
    ended: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "last_step": self.last_step,
            "records": self.records,
            "last_end": self.last_end,
            "last_heartbeat": self.last_heartbeat,
            "ended": self.ended,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Series:
        return cls(
            steps=int(data.get("steps", 0)),
            tokens=int(data.get("tokens", 0)),
            last_step=int(data.get("last_step", 0)),
            records={str(k): float(v) for k, v in data.get("records", {}).items()},
            last_end=float(data.get("last_end", 0.0)),
            last_heartbeat=float(data.get("last_heartbeat", 0.0)),
            ended=bool(data.get("ended", False)),
        )


def _number(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedRecord(f"field {key!r}: expected a finite number, got {value!r}")
    return float(value)


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise MalformedRecord(f"field {key!r}: expected a non-empty string, got {value!r}")
    return value


class TrainingMetrics:
    """Step-log consumer publishing ``train.*`` and ``accelerator.duty_cycle{source="sdk"}``.

    >>> metrics = TrainingMetrics(telemetry.meter, shared_dir)  # doctest: +SKIP
    >>> StepLogTailer(shared_dir, state_file, metrics).poll()  # doctest: +SKIP
    """

    def __init__(
        self,
        meter: Meter,
        shared_dir: Path,
        window_s: float = 60.0,
        series_ttl_s: float = 900.0,
        clock: Any = time.time,
    ) -> None:
        self._meter = meter
        self._shared_dir = shared_dir
        self.window_s = window_s
        self.series_ttl_s = series_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._series: dict[SeriesKey, _Series] = {}
        self._files: dict[str, SeriesKey] = {}
        self._accelerators: dict[str, tuple[str, float]] = {}  # run -> (backend, retry at)
        self._record_names: set[str] = set()
        self._last_poll = 0.0
        self._step_duration = meter.create_histogram(
            "train.step.duration", unit="s", description="Wall time of one training step."
        )
        meter.create_observable_counter(
            "train.steps", [self._observe_steps], unit="{step}", description="Steps completed."
        )
        meter.create_observable_counter(
            "train.tokens",
            [self._observe_tokens],
            unit="{token}",
            description="Tokens (or samples) processed.",
        )
        meter.create_observable_gauge(
            "train.step", [self._observe_last_step], unit="{step}", description="Last step number."
        )
        # Shared with the hardware sources: one instrument, one callback per source.
        accelerator_gauges(meter).add("duty_cycle", self._observe_duty_cycle)
        # Handler of ``memory`` lines (JAX device memory), set by the sidecar when on.
        self.memory: MemoryRecordHandler | None = None
        # Called with (identity, end line, steps, tokens) at a run's ``end`` line.
        self.on_end: list[Callable[[Mapping[str, str], dict[str, Any], int, int], None]] = []
        meter.create_observable_gauge(
            "mlprof.workload.up",
            [self._observe_up],
            unit="1",
            description="1 while the workload's step log shows a live, unfinished run.",
        )

    # -- StepLogConsumer ---------------------------------------------------------
    def handle(self, record: dict[str, Any], source: str) -> None:
        kind = record.get("kind")
        key = (_text(record, "run_id"), _text(record, "workload"), _text(record, "host"))
        attrs = {"run_id": key[0], "workload": key[1], "host": key[2]}
        duration: float | None = None
        new_name: str | None = None
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(last_heartbeat=self._clock())
            self._files[source] = key
            if kind == schema.KIND_STEP:
                duration = self._handle_step(record, series)
            elif kind == schema.KIND_RECORD:
                new_name = self._handle_record(record, series)
            elif kind == schema.KIND_END:
                series.ended = True
            elif kind != schema.KIND_MEMORY:
                raise MalformedRecord(f"field 'kind': unknown kind {kind!r}")
        # A scrape holds OpenTelemetry's locks while our callbacks take self._lock, so
        # calls into OpenTelemetry (and the memory handler) happen after releasing it.
        if duration is not None:
            self._step_duration.record(duration, attrs)
        if new_name is not None:
            self._register_gauge(new_name)
        if kind == schema.KIND_END:
            for hook in self.on_end:
                hook(attrs, record, series.steps, series.tokens)
        if self.memory is not None and kind == schema.KIND_END:
            self.memory.end(attrs)
        elif self.memory is not None and kind == schema.KIND_MEMORY:
            self.memory.handle(record, attrs)

    def _handle_step(self, record: dict[str, Any], series: _Series) -> float:
        start = _number(record, "start")
        duration = _number(record, "duration")
        step = int(_number(record, "step"))
        tokens = int(_number(record, "tokens")) if "tokens" in record else 0
        if duration < 0 or tokens < 0:
            raise MalformedRecord("fields 'duration' and 'tokens' must not be negative")
        series.steps += 1
        series.tokens += tokens
        series.last_step = max(series.last_step, step)
        end = start + duration
        series.last_end = max(series.last_end, end)
        series.ended = False
        if not series.first_start:
            series.first_start = start
        series.intervals.append((start, end))
        horizon = end - self.window_s * 2
        while series.intervals and series.intervals[0][1] < horizon:
            series.intervals.popleft()
        return duration

    def _handle_record(self, record: dict[str, Any], series: _Series) -> str | None:
        """Store a user value; return its name if it is new (its gauge is not made yet)."""
        name = _text(record, "name")
        value = _number(record, "value")
        if not _NAME_RE.match(name):
            raise MalformedRecord(f"field 'name': {name!r} is not a metric name")
        new = name not in self._record_names
        if new:
            if len(self._record_names) >= MAX_RECORD_NAMES:
                raise MalformedRecord(f"record {name!r}: more than {MAX_RECORD_NAMES} names")
            self._record_names.add(name)
        series.records[name] = value
        return name if new else None

    def _register_gauge(self, name: str) -> None:
        self._meter.create_observable_gauge(
            f"train.{name}",
            [self._record_callback(name)],
            unit="1",
            description=f"User-recorded value {name!r}.",
        )

    def heartbeat(self, source: str, mtime: float) -> None:
        with self._lock:
            key = self._files.get(source)
            if key is not None and key in self._series:
                series = self._series[key]
                series.last_heartbeat = max(series.last_heartbeat, mtime)
            self._last_poll = self._clock()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "series": [[*key, s.to_json()] for key, s in self._series.items()],
                "files": {name: list(key) for name, key in self._files.items()},
            }

    def restore(self, state: dict[str, Any]) -> None:
        with self._lock:
            for run_id, workload, host, data in state.get("series", []):
                self._series[(run_id, workload, host)] = _Series.from_json(data)
            for name, key in state.get("files", {}).items():
                self._files[name] = (key[0], key[1], key[2])
        names = {name for series in self._series.values() for name in series.records}
        for name in sorted(names - self._record_names):
            self._record_names.add(name)
            self._register_gauge(name)

    # -- housekeeping ----------------------------------------------------------------
    def expire(self) -> int:
        """Forget runs silent for longer than the series TTL; return how many."""
        now = self._clock()
        with self._lock:
            dead = [
                key
                for key, s in self._series.items()
                if now - max(s.last_heartbeat, s.last_end) > self.series_ttl_s
            ]
            for key in dead:
                del self._series[key]
            self._files = {n: k for n, k in self._files.items() if k in self._series}
        return len(dead)

    def duty_cycle(self, key: SeriesKey) -> float | None:
        """Time inside steps over wall time in the window ending at the data horizon."""
        with self._lock:
            series = self._series.get(key)
            if series is None or not series.intervals:
                return None
            return self._duty_cycle(series)

    def _duty_cycle(self, series: _Series) -> float | None:
        horizon = max(series.last_end, self._last_poll - SDK_FLUSH_LAG_S)
        start = max(horizon - self.window_s, series.first_start)
        if horizon - start <= 0:
            return None
        busy = 0.0
        for s, e in series.intervals:
            lo, hi = max(s, start), min(e, horizon)
            if hi > lo:
                busy += hi - lo
        return min(1.0, busy / (horizon - start))

    def _accelerator(self, run_id: str) -> str:
        """The run's backend from ``runs/<run_id>.json``; "unknown" is retried now and then."""
        now = self._clock()
        cached = self._accelerators.get(run_id)
        if cached is not None and (cached[0] != "unknown" or now < cached[1]):
            return cached[0]
        path = self._shared_dir / schema.RUNS_DIR / f"{run_id}.json"
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            found = str(info.get("system", {}).get("backend") or "unknown")
        except (OSError, ValueError, AttributeError):
            found = "unknown"  # the run file may appear later: look again after a while
        self._accelerators[run_id] = (found, now + RUN_INFO_RETRY_S)
        return found

    # -- OpenTelemetry callbacks ------------------------------------------------------
    def _observe(self, value_of: Any) -> Iterable[Observation]:
        with self._lock:
            items = list(self._series.items())
        for (run_id, workload, host), series in items:
            value = value_of(series)
            if value is not None:
                yield Observation(value, {"run_id": run_id, "workload": workload, "host": host})

    def _observe_steps(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: s.steps)

    def _observe_tokens(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: s.tokens)

    def _observe_last_step(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: s.last_step)

    def _record_callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return self._observe(lambda s: s.records.get(name))

        return observe

    def _observe_up(self, options: CallbackOptions) -> Iterable[Observation]:
        now = self._clock()
        return self._observe(
            lambda s: 0 if s.ended or now - s.last_heartbeat > HEARTBEAT_TIMEOUT_S else 1
        )

    def _observe_duty_cycle(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            values = [(key, self._duty_cycle(s)) for key, s in self._series.items()]
        for (run_id, workload, host), value in values:
            if value is not None:
                yield Observation(
                    value,
                    {
                        "run_id": run_id,
                        "workload": workload,
                        "host": host,
                        "accelerator": self._accelerator(run_id),
                        "source": "sdk",
                    },
                )
