"""The sidecar: composes telemetry, sources and background loops for ``mlprof serve``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter import schema
from exporter.config import Settings
from exporter.metrics.steplog import StepLogTailer
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.training import TrainingMetrics

__all__ = ["ComponentStatus", "PeriodicTask", "Sidecar"]

log = logging.getLogger(__name__)


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

    async def run_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.func)
            except Exception as exc:  # keep the loop alive; the status tells what broke
                log.exception("%s failed", self.name)
                self.status.state, self.status.detail = "error", f"{type(exc).__name__}: {exc}"
            else:
                self.status.state, self.status.detail = "ok", ""
            self.status.last_run = time.time()
            await asyncio.sleep(self.interval_s)


class Sidecar:
    """Everything ``mlprof serve`` runs; the API reads from it.

    >>> sidecar = Sidecar(load_settings())  # doctest: +SKIP
    >>> await sidecar.start(); ...; await sidecar.stop()  # doctest: +SKIP
    """

    def __init__(self, settings: Settings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry or build_telemetry()
        meter = self.telemetry.meter
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
        self.tailer = StepLogTailer(
            settings.shared_dir,
            settings.shared_dir / schema.SIDECAR_DIR / "state.json",
            self.training,
            on_error=lambda reason: step_log_errors.add(1, {"reason": reason}),
        )
        self.tasks: list[PeriodicTask] = [
            PeriodicTask("step_log", self._tail_step_logs, min(settings.collect_interval_s, 1.0))
        ]
        self.statuses: dict[str, ComponentStatus] = {}
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
        self.telemetry.shutdown()
