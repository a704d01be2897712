"""The capture subsystem as the sidecar runs it, built from settings in one call."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exporter import schema
from exporter.capture.engine import CaptureEngine, CaptureLimits
from exporter.capture.session import SessionRecord
from exporter.capture.snapshots import RingOptions, SnapshotService
from exporter.capture.store import SessionStore
from exporter.capture.targets import (
    Discovery,
    DnsDiscovery,
    K8sDiscovery,
    LocalRunDiscovery,
    ProfilerTarget,
    StaticDiscovery,
    TargetRegistry,
)
from exporter.capture.watcher import SessionWatcher
from exporter.pipeline.processing import Push, SessionProcessor, bounded_flamegraphs
from exporter.regular_files import read_regular

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from exporter.capture.client import ProfilerClient
    from exporter.config import Settings

__all__ = ["CaptureService", "SessionHooks", "capture_logdir", "discoveries_from_settings"]

log = logging.getLogger(__name__)

CAPTURES_SUBDIR = "captures"


def capture_logdir(settings: Settings) -> Path:
    """The logdir the profiler server writes into (``MLPROF_CAPTURE_LOGDIR``), absolute."""
    chosen = settings.capture_logdir or settings.shared_dir / CAPTURES_SUBDIR
    return chosen.resolve()


def discoveries_from_settings(settings: Settings) -> list[Discovery]:
    """Static targets, the local run, and DNS / k8s discovery when configured."""
    found: list[Discovery] = [
        StaticDiscovery(settings.targets, settings.profiler_port),
        LocalRunDiscovery(settings.shared_dir, settings.local_targets_host),
    ]
    if settings.discovery_dns:
        found.append(DnsDiscovery(settings.discovery_dns, settings.profiler_port))
    if settings.discovery_k8s_selector:
        found.append(_LazyK8s(settings))
    return found


class _LazyK8s:
    """k8s discovery built on first use, so a sidecar outside a cluster still starts."""

    name = "k8s"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._inner: K8sDiscovery | None = None

    def discover(self) -> list[ProfilerTarget]:
        if self._inner is None:
            self._inner = K8sDiscovery.in_cluster(
                self.settings.discovery_k8s_selector or "",
                self.settings.discovery_k8s_namespace,
                self.settings.profiler_port,
            )
        return self._inner.discover()


class SessionHooks:
    """Calls every hook once per finished session, whoever reports it first.

    The engine reports the sessions it ran; the watcher reports programmatic ones and
    any left unprocessed (e.g. by a restart), which may include the engine's.
    """

    def __init__(self, remember: int = 10_000) -> None:
        self.hooks: list[Callable[[SessionRecord], object]] = []
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self._lock = threading.Lock()

    def add(self, hook: Callable[[SessionRecord], object]) -> None:
        """Run ``hook(record)`` after each finished session (keep it quick: queue work)."""
        self.hooks.append(hook)

    def __call__(self, record: SessionRecord) -> None:
        if record.status == "running":
            return
        with self._lock:
            if record.id in self._seen:
                return
            self._seen[record.id] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        for hook in self.hooks:
            try:
                hook(record)
            except Exception:  # one hook's failure never stops the others
                log.exception("session hook %r failed for %s", hook, record.id)


@dataclass
class CaptureService:
    """Registry, engine, snapshots, watcher and processor, wired together."""

    targets: TargetRegistry
    engine: CaptureEngine
    snapshots: SnapshotService
    watcher: SessionWatcher
    processor: SessionProcessor
    hooks: SessionHooks

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        meter: Meter | None = None,
        push: Push | None = None,
        client: ProfilerClient | None = None,
    ) -> CaptureService:
        store = SessionStore(settings.store)
        logdir = capture_logdir(settings)
        registry = TargetRegistry(discoveries_from_settings(settings))
        engine = CaptureEngine(
            store, logdir, CaptureLimits.from_settings(settings), client, registry, meter
        )
        ring = RingOptions(
            settings.snapshot_interval_s,
            settings.snapshot_duration_ms,
            settings.snapshot_max_count,
            settings.snapshot_max_bytes,
        )
        snapshots = SnapshotService(engine, settings.snapshot_mode, ring)
        shared = settings.shared_dir

        def service_name(run_id: str | None) -> str:
            if run_id:
                try:
                    path = shared / schema.RUNS_DIR / f"{run_id}.json"
                    # The workload's file: bounded, regular, no link (nor "..") followed.
                    return str(json.loads(read_regular(path, below=shared))["name"])
                except (OSError, ValueError, KeyError, TypeError, RecursionError):
                    pass
            return "mlprof"

        # Captures are converted in a child bounded like the analysis reports.
        convert = bounded_flamegraphs(settings.report_timeout_s, settings.report_max_memory_mb)
        processor = SessionProcessor(store, convert, push=push, service_name=service_name)
        watcher = SessionWatcher(store, logdir, running=engine.get_live)
        hooks = SessionHooks()
        hooks.add(processor)  # conversion + push; other capabilities add theirs
        engine.on_complete.append(hooks)
        watcher.on_complete.append(hooks)
        return cls(registry, engine, snapshots, watcher, processor, hooks)

    def remove_stale(self) -> list[str]:
        """Remove what a killed sidecar's captures left in the logdir (call at start)."""
        removed = self.engine.remove_stale_staging()
        return removed + [str(p) for p in self.snapshots.remove_stale()]

    def close(self) -> None:
        self.snapshots.close()
        self.engine.close()
        self.processor.close()
