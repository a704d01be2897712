"""The sidecar: composes telemetry, sources and background loops for ``mlprof serve``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from exporter import schema
from exporter.analysis.worker import report_worker_from_settings
from exporter.capture.alerts import AlertPolicy, AlertPolicyConfig
from exporter.capture.service import CaptureService
from exporter.config import Settings
from exporter.metrics.exposition import ExpositionCache
from exporter.metrics.otlp import otlp_reader
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.steplog import StepLogTailer
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.training import TrainingMetrics
from exporter.profiles.memory_watcher import MemoryProfileWatcher
from exporter.profiles.pprof import InflateLimits
from exporter.sinks.pyroscope import sink_from_settings

__all__ = ["ComponentStatus", "PeriodicTask", "Sidecar"]

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # how long shutdown waits for background calls in flight


@dataclass
class ComponentStatus:
    """What ``/readyz`` says of one component."""

    state: str = "starting"  # starting | ok | error | off
    detail: str = ""
    last_run: float | None = None
    required: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail, "last_run": self.last_run}


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

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                outcome = await loop.run_in_executor(self.executor, self.func)
            except Exception as exc:  # keep the loop alive; the status tells what broke
                log.exception("%s failed", self.name)
                self.status.state, self.status.detail = "error", f"{type(exc).__name__}: {exc}"
            else:
                # A func may return (state, detail), e.g. ("off", "no TPU runtime").
                ok = isinstance(outcome, tuple) and len(outcome) == 2
                self.status.state, self.status.detail = outcome if ok else ("ok", "")
            self.status.last_run = time.time()
            await asyncio.sleep(self.interval_s)


class Sidecar:
    """Everything ``mlprof serve`` runs; the API reads from it.

    >>> sidecar = Sidecar(load_settings())  # doctest: +SKIP
    >>> await sidecar.start(); ...; await sidecar.stop()  # doctest: +SKIP
    """

    def __init__(self, settings: Settings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry or build_telemetry(
            extra_readers=[r for r in [otlp_reader(settings)] if r is not None]
        )
        meter = self.telemetry.meter
        # /metrics bytes rendered ahead of the expected scrape (rendering 1k series ~16 ms).
        self.exposition = ExpositionCache(
            self.telemetry.registry, max_age_s=min(settings.collect_interval_s, 1.0)
        )
        self.training = TrainingMetrics(
            meter,
            settings.shared_dir,
            window_s=settings.duty_cycle_window_s,
            series_ttl_s=settings.series_ttl_s,
        )
        step_log_errors = meter.create_counter(
            "mlprof.step_log.errors",
            unit="{line}",
            description="Step-log lines skipped because they were malformed.",
        )
        for reason in StepLogTailer.ERROR_REASONS:
            step_log_errors.add(0, {"reason": reason})  # so increase() sees the first error
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
        )
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
            settings, meter, self.pyroscope.push if self.pyroscope else None
        )
        self.targets = self.capture.targets
        self.captures = self.capture.engine
        self.snapshots = self.capture.snapshots
        # Reports: analysis.json + summary.html per finished session, in child processes.
        self.reports = report_worker_from_settings(settings, self.captures.store, meter)
        self.capture.hooks.add(self.reports)
        # Alertmanager webhook policy: dedup, per-run cooldown, global limit, targets.
        self.alerts = AlertPolicy(
            self.targets, self.captures, AlertPolicyConfig.from_settings(settings), meter=meter
        )
        optional = ComponentStatus  # captures never hold readiness back
        self.tasks += [
            PeriodicTask("targets", self.targets.refresh, settings.discovery_interval_s,
                         optional(required=False)),
            PeriodicTask("sessions", self.capture.watcher.poll, settings.collect_interval_s,
                         optional(required=False)),
            PeriodicTask("snapshots", self.snapshots.tick, 1.0, optional(required=False)),
        ]  # fmt: skip
        self.statuses: dict[str, ComponentStatus] = {}
        # Accelerator sources: each collects in a worker thread; scrapes read last values.
        self.accelerators = AcceleratorSources(settings, meter)
        self.training.memory = self.accelerators.jax_memory
        for source in self.accelerators.runs:
            status = ComponentStatus(source.state, source.detail, required=False)
            if source.collect is None:
                self.statuses[f"source.{source.name}"] = status
            else:
                interval = settings.collect_interval_s
                self.tasks.append(
                    PeriodicTask(f"source.{source.name}", source.collect, interval, status)
                )
        self._running: list[asyncio.Task[None]] = []

    def _tail_step_logs(self) -> None:
        self.tailer.poll()
        self.training.expire()

    def add_task(self, task: PeriodicTask) -> None:
        """Register a background loop; call before ``start``."""
        self.tasks.append(task)

    def readiness(self) -> tuple[bool, dict[str, dict[str, Any]]]:
        """Whether every required component has run once, and each one's state."""
        components = {t.name: t.status for t in self.tasks} | self.statuses
        ready = all(s.state in ("ok", "off") for s in components.values() if s.required)
        return ready, {name: s.as_json() for name, s in components.items()}

    async def start(self) -> None:
        self.settings.shared_dir.mkdir(parents=True, exist_ok=True)
        self._running = [asyncio.create_task(t.run_forever(), name=t.name) for t in self.tasks]

    async def stop(self) -> None:
        for task in self._running:
            task.cancel()
        for task in self._running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._running = []
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
        self.telemetry.shutdown()
