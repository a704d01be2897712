"""Choosing the accelerator sources (``MLPROF_SOURCES``) and wiring them to the gauges.

``auto`` runs every source whose hardware may be there: the TPU source keeps
probing the runtime address (the workload often starts after the sidecar) and says
"off" while nothing answers on a machine without TPU devices; NVML switches itself
off with one log line when there is no library or no GPU; JAX memory lines are
read whenever the SDK writes them. A source named explicitly reports "error"
instead of "off" when its hardware is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.metrics import Meter
from prometheus_client import CollectorRegistry

from exporter.config import Settings
from exporter.metrics.accelerator import DeviceSeries, RunIdentity, accelerator_gauges
from exporter.metrics.distribution import MAX_FINITE_BUCKETS
from exporter.metrics.histograms import DistributionHistograms
from exporter.metrics.jax_memory import JaxMemoryMetrics
from exporter.metrics.nvml import NvmlSource, load_nvml
from exporter.metrics.run_pids import RunPids
from exporter.metrics.tpu import TpuRuntimeClient, TpuSource
from exporter.sinks.events import Emit, Throttle, no_events

__all__ = ["AcceleratorSources", "SourceRun", "stale_after_s"]

log = logging.getLogger(__name__)

# A chip not seen in this many collections is gone (a failed read or two keeps it).
STALE_INTERVALS = 3
MIN_STALE_S = 5.0  # JAX lines arrive every ~1-2 s whatever the collect interval
MAX_RPC_TIMEOUT_S = 2.0
# A source that stays down fails every collection (every 5 s by default); one event per
# source and reason in this many seconds says so without flooding the log.
SOURCE_ERROR_EVENT_INTERVAL_S = 600.0


def stale_after_s(interval_s: float) -> float:
    """How long a chip's series outlives its last reading."""
    return max(STALE_INTERVALS * interval_s, MIN_STALE_S)


@dataclass
class SourceRun:
    """One source as ``/readyz`` sees it: a collect function to run, or why it is off."""

    name: str
    collect: Callable[[], tuple[str, str]] | None
    state: str = "starting"
    detail: str = ""
    close: Callable[[], None] = field(default=lambda: None)
    skipped: Callable[[], list[str]] | None = None  # metrics the hardware does not offer


class AcceleratorSources:
    """Builds the sources chosen by settings; the sidecar runs each ``collect`` periodically.

    >>> sources = AcceleratorSources(settings, telemetry.meter)  # doctest: +SKIP
    >>> [(s.name, s.state) for s in sources.runs]  # doctest: +SKIP
    [('tpu', 'starting'), ('nvml', 'off'), ('jax', 'ok')]
    """

    def __init__(
        self,
        settings: Settings,
        meter: Meter,
        nvml: Any = None,
        tpu_present: Callable[[], bool] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        # libtpu's distributions as Prometheus histograms go straight onto this registry
        # (OpenTelemetry has no asynchronous histogram); None: percentile gauges only.
        self.registry = registry
        names = settings.sources
        self.auto = names == ["auto"]
        wanted = {"tpu", "nvml", "jax"} if self.auto else set(names)
        self._gauges = accelerator_gauges(meter)
        self._errors = meter.create_counter(
            "mlprof.source.errors",
            unit="{error}",
            description="Failed collections of an accelerator metric source.",
        )
        self._distributions_skipped = meter.create_counter(
            "mlprof.source.distributions.skipped",
            unit="{distribution}",
            description="Distributions a runtime sent that were not read (reason: layout, "
            "overflow, bounds); the source's other metrics are kept.",
        )
        self._buckets_merged = meter.create_counter(
            "mlprof.source.buckets.merged",
            unit="{bucket}",
            description="Finite buckets merged into their neighbours to keep at most "
            f"{MAX_FINITE_BUCKETS} per distribution (counted each read).",
        )
        self.identity = RunIdentity(Path(settings.shared_dir))
        # ``source_error`` events (the sidecar sets its sink), one per source and reason
        # per SOURCE_ERROR_EVENT_INTERVAL_S: a dead runtime fails every collection.
        self.emit: Emit = no_events
        self._error_events = Throttle(SOURCE_ERROR_EVENT_INTERVAL_S)
        stale = stale_after_s(settings.collect_interval_s)
        self.runs: list[SourceRun] = []
        self.jax_memory: JaxMemoryMetrics | None = None
        if "tpu" in wanted:
            self.runs.append(self._tpu(stale, tpu_present))
        if "nvml" in wanted:
            self.runs.append(self._nvml(stale, nvml if nvml is not None else load_nvml()))
        if "jax" in wanted:
            series = DeviceSeries("jax", "unknown", stale)
            self._gauges.add_series(series)
            self.jax_memory = JaxMemoryMetrics(series)
            self.runs.append(SourceRun("jax", self.jax_memory.status, "waiting"))

    def _counter(self, name: str) -> Callable[[str], None]:
        attrs = {"source": name}
        self._errors.add(0, attrs)  # the series exists at 0, so rate() works from the start

        def count(reason: str) -> None:
            self._errors.add(1, attrs)
            held = self._error_events.allow(f"{name}:{reason}")
            if held is not None:
                self.emit("source_error", f"accelerator source {name} failed: {reason}",
                          source=name, reason=reason, suppressed=held)  # fmt: skip

        return count

    def _tpu(self, stale: float, present: Callable[[], bool] | None) -> SourceRun:
        series = DeviceSeries("libtpu", "tpu", stale)
        self._gauges.add_series(series)
        if self.registry is not None:
            self.registry.register(DistributionHistograms(series))
        source = TpuSource(
            TpuRuntimeClient(self.settings.tpu_metrics_addr),
            series,
            self.identity,
            timeout_s=min(MAX_RPC_TIMEOUT_S, self.settings.collect_interval_s * 0.8),
            optional=self.auto,
            on_error=self._counter("tpu"),
        )
        attrs = {"source": "tpu"}
        merged = self._buckets_merged.add
        merged(0, attrs)
        source.on_buckets_merged = lambda n: merged(n, attrs)
        for reason in ("layout", "overflow", "bounds"):  # each series from 0, for increase()
            self._distributions_skipped.add(0, {**attrs, "reason": reason})
        source.on_distribution_skipped = lambda reason: self._distributions_skipped.add(
            1, {**attrs, "reason": reason}
        )
        if present is not None:
            source.present = present
        return SourceRun("tpu", source.collect, close=source.close, skipped=source.skipped)

    def _nvml(self, stale: float, nvml: Any) -> SourceRun:
        series = DeviceSeries("nvml", "gpu", stale)
        runs = RunPids(Path(self.settings.shared_dir))
        source = NvmlSource(nvml, series, self.identity, runs=runs)
        why_off = source.start()
        if why_off is not None:
            state = "off" if self.auto else "error"
            log.log(
                logging.INFO if self.auto else logging.ERROR, "NVML source %s: %s", state, why_off
            )
            return SourceRun("nvml", None, state, why_off)
        source.on_error = self._counter("nvml")  # an error series only for a running source
        self._gauges.add_series(series)
        return SourceRun("nvml", source.collect, close=source.shutdown, skipped=source.skipped)

    def close(self) -> None:
        for run in self.runs:
            try:
                run.close()
            except Exception:  # closing is best effort at shutdown
                log.debug("closing source %s failed", run.name, exc_info=True)
