"""The sidecar: composes telemetry, sources and background loops for ``mlprof serve``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter import schema
from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.alerts import AlertPolicy, AlertPolicyConfig
from exporter.capture.client import ProfilerClient
from exporter.capture.events import capture_finished, capture_requested
from exporter.config import WILDCARD_LISTEN, Settings
from exporter.metrics.exposition import ExpositionCache
from exporter.metrics.otlp import otlp_reader
from exporter.metrics.runs import RunEvents
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.steplog import StepLogTailer
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.training import TrainingMetrics
from exporter.pipeline.memory_watcher import MemoryProfileWatcher
from exporter.pipeline.service import CaptureService
from exporter.pipeline.torch_watcher import TorchTraceWatcher
from exporter.pipeline.worker import ReportEvent, report_worker_from_settings
from exporter.profiles.pprof import InflateLimits
from exporter.regular_files import remove_file, replace_file
from exporter.sandbox import MemoryBudget, set_default_budget
from exporter.sinks.events import Emit, EventSink, events_from_settings, report_written
from exporter.sinks.pyroscope import sink_from_settings

if TYPE_CHECKING:
    from opentelemetry.metrics import Observation

__all__ = ["ComponentStatus", "PeriodicTask", "Sidecar"]

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # how long shutdown waits for background calls in flight
# A loop whose call has not returned for this many intervals (and at least
# STALLED_MIN_S: a slow disk or a long import is not a wedge) is reported "stalled".
STALLED_INTERVALS = 3
STALLED_MIN_S = 30.0
# States in which a component does not hold readiness back: "waiting" means it works
# and has no data yet (no workload has written a step log, JAX on CPU has no memory).
READY_STATES = frozenset({"ok", "off", "waiting"})
# The store's probe (one listing) at most this often: a bucket's requests cost.
STORE_PROBE_MIN_S = 10.0
STORE_REFUSAL_REASONS = ("too_large", "not_regular", "invalid", "id_mismatch")


def _refused_observations(refused: Mapping[str, int]) -> list[Observation]:
    """Every reason, from 0, so increase() sees the first refusal."""
    from opentelemetry.metrics import Observation

    return [Observation(refused.get(r, 0), {"reason": r}) for r in STORE_REFUSAL_REASONS]


def _report_written(emit: Emit, event: ReportEvent) -> None:
    """A finished (or failed) analysis report as a ``report_written`` run event."""
    report_written(
        emit,
        session_id=event.session_id,
        status=event.status,
        findings=event.findings,
        run_id=event.run_id,
        workload=event.workload,
        files=[] if event.status == "error" else ["analysis.json", "summary.html"],
    )


@dataclass
class ComponentStatus:
    """What ``/readyz`` says of one component."""

    state: str = "starting"  # starting | ok | waiting | error | off | stalled
    detail: str = ""
    last_run: float | None = None
    required: bool = True
    # Metrics a source cannot offer on this machine (e.g. an older libtpu), if it says.
    skipped: Callable[[], list[str]] | None = None
    running_since: float | None = None  # when the call in flight started (None: idle)
    stalled_after_s: float = float("inf")

    def current(self, now: float) -> ComponentStatus:
        """This status, or "stalled" if its call has been in flight for too long."""
        since = self.running_since
        if since is None or now - since <= self.stalled_after_s:
            return self
        detail = f"its loop has not completed for {now - since:.0f}s (blocked or wedged)"
        return ComponentStatus(
            "stalled", detail, self.last_run, self.required, skipped=self.skipped
        )

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "state": self.state,
            "detail": self.detail,
            "last_run": self.last_run,
        }
        if self.skipped is not None:
            body["skipped"] = self.skipped()
        return body


@dataclass
class PeriodicTask:
    """A blocking function run every ``interval_s`` in a worker thread."""

    name: str
    func: Callable[[], Any]
    interval_s: float
    status: ComponentStatus = field(default_factory=ComponentStatus)
    # Its own thread: a push stuck in retries must not starve the step-log tail (the
    # default pool has cpu+4 threads, fewer than the sidecar's tasks on small nodes).
    executor: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"mlprof-{self.name}")
        self.status.stalled_after_s = max(STALLED_INTERVALS * self.interval_s, STALLED_MIN_S)

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.status.running_since = time.time()
            try:
                outcome = await loop.run_in_executor(self.executor, self.func)
            except Exception as exc:  # keep the loop alive; the status tells what broke
                log.exception("%s failed", self.name)
                self.status.state, self.status.detail = "error", f"{type(exc).__name__}: {exc}"
            else:
                # A func may return (state, detail), e.g. ("off", "no TPU runtime").
                ok = isinstance(outcome, tuple) and len(outcome) == 2
                self.status.state, self.status.detail = outcome if ok else ("ok", "")
            self.status.last_run, self.status.running_since = time.time(), None
            await asyncio.sleep(self.interval_s)


class Sidecar:
    """Everything ``mlprof serve`` runs; the API reads from it.

    >>> sidecar = Sidecar(load_settings())  # doctest: +SKIP
    >>> await sidecar.start(); ...; await sidecar.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry | None = None,
        events: EventSink | None = None,
        profiler_client: ProfilerClient | None = None,
        alert_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry or build_telemetry(
            extra_readers=[r for r in [otlp_reader(settings)] if r is not None]
        )
        meter = self.telemetry.meter
        # One memory budget for every bounded child this process starts (exporter.sandbox).
        self.memory_budget = MemoryBudget.from_settings(settings, meter)
        set_default_budget(self.memory_budget)
        # Run events (MLPROF_EVENTS): every component below gets this sink's emit.
        self.events = events or events_from_settings(settings, meter)
        # /metrics bytes rendered ahead of the expected scrape (rendering 1k series ~16 ms).
        self.exposition = ExpositionCache(
            self.telemetry.registry, max_age_s=min(settings.collect_interval_s, 1.0)
        )
        self.training = TrainingMetrics(
            meter,
            settings.shared_dir,
            window_s=settings.duty_cycle_window_s,
            series_ttl_s=settings.series_ttl_s,
            max_runs=settings.max_runs,
        )
        step_log_errors = meter.create_counter(
            "mlprof.step_log.errors",
            unit="{line}",
            description="Step-log lines skipped because they were malformed.",
        )
        for reason in StepLogTailer.ERROR_REASONS:
            step_log_errors.add(0, {"reason": reason})  # so increase() sees the first error
        self.training.on_expire.append(self.telemetry.forget_series)
        self.tailer = StepLogTailer(
            settings.shared_dir,
            settings.shared_dir / schema.SIDECAR_DIR / "state.json",
            self.training,
            on_error=lambda reason: step_log_errors.add(1, {"reason": reason}),
        )
        self.tasks: list[PeriodicTask] = [
            PeriodicTask("step_log", self._tail_step_logs, min(settings.collect_interval_s, 1.0))
        ]
        # Profiles: Pyroscope push with spool (None when no URL is set), and the
        # device-memory profiles the SDK writes into the shared dir.
        self.pyroscope = sink_from_settings(settings, meter)
        self.memory_profiles = MemoryProfileWatcher(
            settings.shared_dir,
            self.pyroscope.push if self.pyroscope else None,
            limits=InflateLimits(settings.max_profile_bytes, settings.max_profile_ratio),
            # Converted in a child bounded like the analysis reports.
            timeout_s=settings.report_timeout_s,
            max_memory_mb=settings.report_max_memory_mb,
        )
        # State files found bad at start were moved aside (see exporter/state_files.py).
        discarded = meter.create_counter(
            "mlprof.state.discarded",
            unit="{file}",
            description="Sidecar state files found unusable at start, moved aside.",
        )
        for name, why in (
            ("step_log", self.tailer.state_discarded),
            ("memory_profiles", self.memory_profiles.state_discarded),
        ):
            discarded.add(1 if why else 0, {"file": name})
        self.tasks.append(
            PeriodicTask(
                "memory_profiles",
                self.memory_profiles.poll,
                settings.collect_interval_s,
                ComponentStatus(required=False),
            )
        )
        if self.pyroscope is not None:
            self.tasks.append(
                PeriodicTask(
                    "pyroscope_spool",
                    self.pyroscope.drain,
                    settings.collect_interval_s,
                    ComponentStatus(required=False),
                )
            )
        # Captures: targets (static, run.json, DNS, k8s), the engine, snapshots, and the
        # watcher that hands finished sessions to conversion and push.
        self.capture = CaptureService.from_settings(
            settings, meter, self.pyroscope.push if self.pyroscope else None, profiler_client
        )
        self.targets = self.capture.targets
        self.captures = self.capture.engine
        self.snapshots = self.capture.snapshots
        # Reports: analysis.json + summary.html per finished session, in child processes.
        self.reports = report_worker_from_settings(settings, self.captures.store, meter)
        self.capture.hooks.add(self.reports)
        # One child per session: the processor's converts its captures and makes its
        # report from one read of each (the worker's hook leaves such sessions to it).
        processor = self.capture.processor
        processor.session_job = self.reports.session_job
        processor.on_processed.append(self.reports)
        self.reports.deferred = processor.pending
        # torch.profiler traces the workload writes into the shared dir become sessions
        # like captures: the same hooks convert, push and report them.
        self.torch_traces = TorchTraceWatcher(
            settings.shared_dir, self.captures.store, [self.capture.hooks]
        )
        discarded.add(1 if self.torch_traces.state_discarded else 0, {"file": "torch_traces"})
        self.tasks.append(
            PeriodicTask(
                "torch_traces",
                self.torch_traces.poll,
                settings.collect_interval_s,
                ComponentStatus(required=False),
            )
        )
        # A marked baseline's session is never retention's to delete.
        self.captures.retention_keep = BaselineStore(self.captures.store).pinned
        # Alertmanager webhook policy: dedup, per-run cooldown, global limit, targets.
        # ``alert_clock`` times the dedup window and the cooldown (a test advances it
        # rather than sleeping through a real cooldown).
        self.alerts = AlertPolicy(
            self.targets,
            self.captures,
            AlertPolicyConfig.from_settings(settings),
            meter=meter,
            clock=alert_clock,
        )
        optional = ComponentStatus  # captures never hold readiness back
        self.tasks += [
            PeriodicTask("targets", self.targets.refresh, settings.discovery_interval_s,
                         optional(required=False)),
            PeriodicTask("sessions", self.capture.watcher.poll, settings.collect_interval_s,
                         optional(required=False)),
            PeriodicTask("snapshots", self.snapshots.tick, 1.0, optional(required=False)),
            # The store answering at all: the loops above treat a failing bucket as
            # "retry next poll", so without this /readyz said "ok" through an outage.
            PeriodicTask("store", self.captures.store.probe,
                         max(settings.collect_interval_s, STORE_PROBE_MIN_S),
                         optional(required=False)),
        ]  # fmt: skip
        store = self.captures.store
        meter.create_observable_counter(
            "mlprof.store.objects_refused",
            callbacks=[lambda _options: _refused_observations(store.refused)],
            unit="{object}",
            description="Store objects set aside unread: too_large, not_regular, invalid, "
            "id_mismatch (a record whose id is not its directory's).",
        )
        self.statuses: dict[str, ComponentStatus] = {}
        # Accelerator sources: each collects in a worker thread; scrapes read last values.
        self.accelerators = AcceleratorSources(settings, meter, registry=self.telemetry.registry)
        self.training.memory = self.accelerators.jax_memory
        for source in self.accelerators.runs:
            status = ComponentStatus(
                source.state, source.detail, required=False, skipped=source.skipped
            )
            if source.collect is None:
                self.statuses[f"source.{source.name}"] = status
            else:
                interval = settings.collect_interval_s
                self.tasks.append(
                    PeriodicTask(f"source.{source.name}", source.collect, interval, status)
                )
        self._running: list[asyncio.Task[None]] = []
        self._wire_events()

    def _wire_events(self) -> None:
        emit = self.events.emit
        self.reports.on_report.append(functools.partial(_report_written, emit))
        if self.pyroscope is not None:
            self.pyroscope.emit = emit
        self.captures.on_submit.append(functools.partial(capture_requested, emit))
        self.capture.hooks.add(functools.partial(capture_finished, emit))
        self.accelerators.emit = emit
        self.runs = RunEvents(self.settings.shared_dir, emit)
        self.training.on_end.append(self.runs.ended)
        interval = self.settings.collect_interval_s
        self.tasks.append(
            PeriodicTask("run_events", self.runs.poll, interval, ComponentStatus(required=False))
        )

    @property
    def ingest_file(self) -> Path:
        return self.settings.shared_dir / schema.SIDECAR_DIR / schema.INGEST_FILE

    def _advertise_ingest(self) -> None:
        """Tell the workload's host profiler where to push (only when Pyroscope is on)."""
        # sidecar/ is the workload's to write too: a link planted there (the file or the
        # directory) is replaced or refused, never written through.
        if self.pyroscope is None:
            try:
                remove_file(self.ingest_file)  # left by an earlier life with Pyroscope on
            except OSError as exc:
                log.warning("cannot remove %s (%s)", self.ingest_file, exc.strerror or exc)
            return
        host, port = self.settings.listen_host, self.settings.listen_port
        if host in WILDCARD_LISTEN:
            host = "127.0.0.1"  # the workload shares the pod's (or machine's) loopback
        shown = f"[{host}]" if ":" in host else host
        data = {"url": f"http://{shown}:{port}", "pid": os.getpid(), "time": time.time()}
        try:
            self.ingest_file.parent.mkdir(parents=True, exist_ok=True)
            replace_file(self.ingest_file, json.dumps(data).encode() + b"\n", sync=False)
        except OSError as exc:
            log.warning(
                "cannot advertise the ingest URL in %s (%s); the host profiler will not push",
                self.ingest_file,
                exc.strerror or exc,
            )

    def _tail_step_logs(self) -> tuple[str, str]:
        self.tailer.poll()
        self.training.refresh_runs()
        self.training.expire()
        if not self.training.has_runs():
            steps = self.settings.shared_dir / schema.STEPS_DIR
            return "waiting", f"no workload has written a step log in {steps} yet"
        return "ok", ""

    def add_task(self, task: PeriodicTask) -> None:
        """Register a background loop; call before ``start``."""
        self.tasks.append(task)

    def readiness(self) -> tuple[bool, dict[str, dict[str, Any]]]:
        """Whether every required component has run once and none is stalled; each state."""
        now = time.time()
        components = {t.name: t.status.current(now) for t in self.tasks} | self.statuses
        ready = all(s.state in READY_STATES for s in components.values() if s.required)
        return ready, {name: s.as_json() for name, s in components.items()}

    async def start(self) -> None:
        self.settings.shared_dir.mkdir(parents=True, exist_ok=True)
        # Before any capture: traces a killed sidecar left staged would stay for ever.
        await asyncio.to_thread(self.capture.remove_stale)
        self._advertise_ingest()
        self._running = [asyncio.create_task(t.run_forever(), name=t.name) for t in self.tasks]

    async def stop(self) -> None:
        for task in self._running:
            task.cancel()
        for task in self._running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._running = []
        with contextlib.suppress(OSError):
            remove_file(self.ingest_file)  # a stopped sidecar takes no pushes
        # Let calls in flight finish before their clients close under them (bounded).
        pending = [asyncio.to_thread(t.executor.shutdown, True) for t in self.tasks]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pending), STOP_TIMEOUT_S)
        self.capture.close()
        self.reports.close()
        self.accelerators.close()
        self.exposition.close()
        if self.pyroscope is not None:
            self.pyroscope.close()
        self.events.close()
        self.telemetry.shutdown()
