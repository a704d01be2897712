"""Training metrics from the SDK's step log: steps, tokens, step time, user gauges, duty cycle.

Counters are observable and restored from persisted totals, so ``train_steps_total``
survives a sidecar restart without a reset. The step-time and input-wait histograms are
ordinary OpenTelemetry histograms and start again from zero after a restart.

Nothing here reads a file while a scrape runs: a run's backend (from ``runs/<id>.json``)
is looked up by :meth:`TrainingMetrics.refresh_runs` on the tailing thread.
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from exporter import schema
from exporter.metrics.accelerator import accelerator_gauges
from exporter.metrics.steplog import MalformedRecord
from exporter.regular_files import read_regular

__all__ = ["TrainingMetrics"]

log = logging.getLogger(__name__)

SeriesKey = tuple[str, str, str]  # run_id, workload, host


class MemoryRecordHandler(Protocol):
    def handle(self, record: dict[str, Any], identity: Mapping[str, str]) -> None: ...
    def end(self, identity: Mapping[str, str]) -> None: ...


MAX_RECORD_NAMES = 32  # user gauges become metric names: keep the set bounded
# Runs with series at once (MLPROF_MAX_RUNS): each costs about 1 KB of /metrics per scrape.
MAX_RUNS = 1000
# The SDK flushes every second; a workload silent for this long is not "up".
HEARTBEAT_TIMEOUT_S = 10.0
# Data younger than this may still sit in the SDK's buffer: the duty-cycle window
# never extends past it unless a step ended later.
SDK_FLUSH_LAG_S = 1.5
# An unknown run's backend is looked up again at most this often.
RUN_INFO_RETRY_S = 30.0
# Bounds of a believable step. Anything outside is a corrupt or hostile line: a start of
# 1e308 would keep the run alive forever and pin its duty cycle at 1.0.
MAX_CLOCK_SKEW_S = 3600.0  # the SDK stamps with this host's clock; allow an hour ahead
MAX_STEP_DURATION_S = 86_400.0  # a day; the histogram's buckets end at 10 minutes
MAX_STEP_WAIT_S = 7 * 86_400.0  # a week between steps (a long pause, then a resume)
_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")


@dataclass
class _Series:
    steps: int = 0
    tokens: int = 0
    last_step: int = 0
    records: dict[str, float] = field(default_factory=dict)
    intervals: deque[tuple[float, float, float]] = field(default_factory=deque)  # start, end, wait
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


class _SavedSeries(BaseModel):
    """One run's persisted totals; a state file of another shape is refused whole."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    steps: int = Field(0, ge=0)
    tokens: int = Field(0, ge=0)
    last_step: int = 0
    records: dict[str, float] = Field(default_factory=dict)
    last_end: float = 0.0
    last_heartbeat: float = 0.0
    ended: bool = False

    def series(self) -> _Series:
        return _Series(**self.model_dump())


class _SavedState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    series: list[tuple[str, str, str, _SavedSeries]] = Field(default_factory=list)
    files: dict[str, tuple[str, str, str]] = Field(default_factory=dict)


@dataclass(frozen=True)
class _Step:
    start: float
    duration: float
    wait: float
    step: int
    tokens: int


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
        max_runs: int = MAX_RUNS,
    ) -> None:
        self._meter = meter
        self._shared_dir = shared_dir
        self.window_s = window_s
        self.series_ttl_s = series_ttl_s
        self.max_runs = max_runs
        self._over_cap = False  # a warning per episode of lines dropped at the cap
        self._dropped = meter.create_counter(
            "mlprof.runs.dropped",
            unit="{line}",
            description="Step-log lines of runs beyond MLPROF_MAX_RUNS, dropped (the series "
            "of those runs would grow /metrics without bound).",
        )
        self._dropped.add(0)  # so increase() sees the first drop
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
        self._step_wait = meter.create_histogram(
            "train.step.wait",
            unit="s",
            description="Time before a step waiting for its input: from the previous "
            "step's end to this step's start.",
        )
        meter.create_observable_gauge(
            "train.input_wait_share",
            [self._observe_wait_share],
            unit="1",
            description="Input wait / (input wait + step time) over the duty-cycle window.",
        )
        # Called with a run's attributes when it expires (its histogram series go too).
        self.on_expire: list[Callable[[Mapping[str, str]], object]] = []
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
        # up == 0 alone cannot tell a run that finished from one whose process died; the
        # end line (Run.close) can, so dashboards and rules ask "down and not ended".
        meter.create_observable_gauge(
            "mlprof.run.ended",
            [self._observe_ended],
            unit="1",
            description="1 once the run's step log has its end line (the run finished), "
            "else 0: a run that is down and not ended died.",
        )

    # -- StepLogConsumer ---------------------------------------------------------
    def handle(self, record: dict[str, Any], source: str) -> None:
        kind = record.get("kind")
        key = (_text(record, "run_id"), _text(record, "workload"), _text(record, "host"))
        attrs = {"run_id": key[0], "workload": key[1], "host": key[2]}
        # Every field is checked before anything changes: a malformed line must not
        # leave a (phantom) run behind.
        step = self._parse_step(record) if kind == schema.KIND_STEP else None
        if kind == schema.KIND_MFU_BASIS:
            # What the SDK's mfu records are computed from: said once in the log, no series.
            note = record.get("note")
            if not isinstance(note, str):
                raise MalformedRecord("field 'note': expected a string")
            log.info("run %r (%s, %s): %s", key[0], key[2], source, note[:300])
            return
        if kind not in (schema.KIND_STEP, schema.KIND_RECORD, schema.KIND_END, schema.KIND_MEMORY):
            raise MalformedRecord(f"field 'kind': unknown kind {kind!r}")
        if self._beyond_cap(key, source):
            return
        if self.memory is not None and kind == schema.KIND_MEMORY:
            # Before the run is noted: the handler raises MalformedRecord on a bad line.
            # It calls into OpenTelemetry, so never under self._lock (see below).
            self.memory.handle(record, attrs)
        with self._lock:
            new_name = self._check_record(record) if kind == schema.KIND_RECORD else None
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(last_heartbeat=self._clock())
            self._files[source] = key
            if step is not None:
                self._handle_step(step, series)
            elif kind == schema.KIND_RECORD:
                series.records[_text(record, "name")] = _number(record, "value")
            elif kind == schema.KIND_END:
                series.ended = True
        # A scrape holds OpenTelemetry's locks while our callbacks take self._lock, so
        # calls into OpenTelemetry (and the memory handler) happen after releasing it.
        if step is not None:
            self._step_duration.record(step.duration, attrs)
            self._step_wait.record(step.wait, attrs)
        if new_name is not None:
            self._register_gauge(new_name)
        if kind == schema.KIND_END:
            for hook in self.on_end:
                hook(attrs, record, series.steps, series.tokens)
        if self.memory is not None and kind == schema.KIND_END:
            self.memory.end(attrs)

    def _beyond_cap(self, key: SeriesKey, source: str) -> bool:
        """Whether a line of a new run arrives with ``max_runs`` runs tracked (counted)."""
        with self._lock:
            over = key not in self._series and len(self._series) >= self.max_runs
            first = over and not self._over_cap
            self._over_cap = self._over_cap or over  # until expire() makes room
        if over:
            self._dropped.add(1)
            if first:
                log.warning(
                    "step log %s: run %r not tracked: %d runs have series already "
                    "(MLPROF_MAX_RUNS); its lines are dropped and counted in "
                    "mlprof_runs_dropped_total until a run expires",
                    source, key[0], self.max_runs,
                )  # fmt: skip
        return over

    def _parse_step(self, record: dict[str, Any]) -> _Step:
        start = _number(record, "start")
        duration = _number(record, "duration")
        step = _number(record, "step")
        tokens = _number(record, "tokens") if "tokens" in record else 0.0
        wait = _number(record, "wait") if "wait" in record else 0.0
        if not 0 <= duration <= MAX_STEP_DURATION_S:
            raise MalformedRecord(
                f"field 'duration': expected 0..{MAX_STEP_DURATION_S:g} seconds, got {duration!r}"
            )
        if not 0 <= wait <= MAX_STEP_WAIT_S:
            raise MalformedRecord(
                f"field 'wait': expected 0..{MAX_STEP_WAIT_S:g} seconds, got {wait!r}"
            )
        latest = time.time() + MAX_CLOCK_SKEW_S  # the real clock: the SDK stamps with it
        if start > latest:
            raise MalformedRecord(
                f"field 'start': expected Unix time up to now + {MAX_CLOCK_SKEW_S:g}s, "
                f"got {start!r}"
            )
        if not 0 <= tokens < 2**63 or abs(step) >= 2**63:
            raise MalformedRecord("fields 'tokens' and 'step' must be 64-bit, tokens >= 0")
        return _Step(start, duration, wait, int(step), int(tokens))

    def _handle_step(self, step: _Step, series: _Series) -> None:
        series.steps += 1
        series.tokens += step.tokens
        series.last_step = max(series.last_step, step.step)
        end = step.start + step.duration
        series.last_end = max(series.last_end, end)
        series.ended = False
        if not series.first_start:
            series.first_start = step.start
        series.intervals.append((step.start, end, step.wait))
        horizon = end - self.window_s * 2
        while series.intervals and series.intervals[0][1] < horizon:
            series.intervals.popleft()

    def _check_record(self, record: dict[str, Any]) -> str | None:
        """Check a user value; return its name if it is new (its gauge is not made yet)."""
        name = _text(record, "name")
        _number(record, "value")
        if not _NAME_RE.fullmatch(name):
            raise MalformedRecord(f"field 'name': {name!r} is not a metric name")
        new = name not in self._record_names
        if new:
            if len(self._record_names) >= MAX_RECORD_NAMES:
                raise MalformedRecord(f"record {name!r}: more than {MAX_RECORD_NAMES} names")
            self._record_names.add(name)
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
        """Load persisted totals; ValueError (nothing applied) when they are malformed."""
        try:
            saved = _SavedState.model_validate(state)
        except (ValidationError, RecursionError) as exc:
            raise ValueError(f"step-log totals: {str(exc).splitlines()[0]}") from None
        with self._lock:
            for run_id, workload, host, data in saved.series:
                self._series[(run_id, workload, host)] = data.series()
            self._files.update(saved.files)
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
            self._over_cap = self._over_cap and len(self._series) >= self.max_runs
            self._files = {n: k for n, k in self._files.items() if k in self._series}
            live_runs = {key[0] for key in self._series}
            self._accelerators = {r: v for r, v in self._accelerators.items() if r in live_runs}
        for run_id, workload, host in dead:
            for forget in self.on_expire:
                forget({"run_id": run_id, "workload": workload, "host": host})
        return len(dead)

    def has_runs(self) -> bool:
        """Whether any run's step log has been read (and not expired)."""
        with self._lock:
            return bool(self._series)

    def duty_cycle(self, key: SeriesKey) -> float | None:
        """Time inside steps over wall time in the window ending at the data horizon."""
        with self._lock:
            series = self._series.get(key)
            if series is None or not series.intervals:
                return None
            return self._duty_cycle(series)

    def input_wait_share(self, key: SeriesKey) -> float | None:
        """Input wait / (input wait + step time) of the steps in the window."""
        with self._lock:
            series = self._series.get(key)
            return None if series is None else self._wait_share(series)

    def _window(self, series: _Series) -> tuple[float, float]:
        horizon = max(series.last_end, self._last_poll - SDK_FLUSH_LAG_S)
        return max(horizon - self.window_s, series.first_start), horizon

    def _duty_cycle(self, series: _Series) -> float | None:
        start, horizon = self._window(series)
        if horizon - start <= 0:
            return None
        busy = 0.0
        for s, e, _ in series.intervals:
            lo, hi = max(s, start), min(e, horizon)
            if hi > lo:
                busy += hi - lo
        return min(1.0, busy / (horizon - start))

    def _wait_share(self, series: _Series) -> float | None:
        # The steps that ended in the duty-cycle window, each with the wait before it:
        # the SDK measures that wait between the previous step's end and this start,
        # where a real input pipeline (and the demo's delay knob) spends its time.
        start, _ = self._window(series)
        waited = stepped = 0.0
        for s, e, wait in series.intervals:
            if e >= start:
                waited += wait
                stepped += e - s
        total = waited + stepped
        return waited / total if total > 0 else None

    def refresh_runs(self) -> None:
        """Look up the backend of runs not known yet (``runs/<run_id>.json``).

        Runs on the tailing thread, never in a scrape: a FIFO or a slow disk in the
        shared dir must not hold the exposition's lock.
        """
        now = self._clock()
        with self._lock:
            due = [
                run_id
                for run_id in {key[0] for key in self._series}
                if (cached := self._accelerators.get(run_id)) is None
                or (cached[0] == "unknown" and now >= cached[1])
            ]
        for run_id in due:
            found = _backend(
                self._shared_dir / schema.RUNS_DIR / f"{run_id}.json", self._shared_dir
            )
            with self._lock:
                self._accelerators[run_id] = (found, now + RUN_INFO_RETRY_S)

    def _accelerator(self, run_id: str) -> str:
        """The run's backend as last looked up; "unknown" until then."""
        cached = self._accelerators.get(run_id)
        return cached[0] if cached is not None else "unknown"

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

    def _observe_ended(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: 1 if s.ended else 0)

    def _observe_wait_share(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self._wait_share)

    def _observe_duty_cycle(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            values = [
                (key, self._duty_cycle(s), self._accelerator(key[0]))
                for key, s in self._series.items()
            ]
        for (run_id, workload, host), value, accelerator in values:
            if value is not None:
                yield Observation(
                    value,
                    {
                        "run_id": run_id,
                        "workload": workload,
                        "host": host,
                        "accelerator": accelerator,
                        "source": "sdk",
                    },
                )


def _backend(path: Path, shared_dir: Path) -> str:
    """``system.backend`` of a run file; "unknown" while it is missing or unreadable.

    The run id is the step log's (the workload's): no link and no ``..`` under the
    shared dir is followed.
    """
    try:
        info = json.loads(read_regular(path, below=shared_dir))
        return str(info.get("system", {}).get("backend") or "unknown")
    except (OSError, ValueError, AttributeError, RecursionError):
        return "unknown"  # the run file may appear later: looked up again after a while
