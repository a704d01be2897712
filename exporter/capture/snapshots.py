"""Snapshots: what a target did just now, kept ready to be taken at any moment.

Two modes per target:

``continuous``  XProf continuous profiling on the profiler server (TPU):
                ``start_continuous_profiling`` once, ``get_snapshot`` per snapshot,
                ``stop_continuous_profiling`` at the end. ``get_snapshot`` returns success
                and writes nothing when there is no device trace, so success is judged by
                the files written.
``ring``        elsewhere: a short capture every ``interval_s``, the newest ``max_count``
                per target (and ``max_bytes`` over all) kept in ``<capture logdir>/.ring``;
                a snapshot copies the newest complete window into the session.

``auto`` picks continuous for targets known to be TPU, ring for the others.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from exporter.capture.engine import RING_HOLDER, CaptureEngine, TargetOutcome, remove_staging
from exporter.capture.session import new_session_id
from exporter.capture.store import PROFILE_DIR
from exporter.capture.targets import ProfilerTarget
from exporter.regular_files import open_regular, replace_file

__all__ = ["RING_HOLDER", "RingOptions", "SnapshotService"]

log = logging.getLogger(__name__)

RING_DIR: Final = ".ring"
SNAPSHOT_DIR: Final = ".snapshot"


@dataclass(frozen=True)
class RingOptions:
    """Ring mode sizes (``MLPROF_SNAPSHOT_*``)."""

    interval_s: float = 30.0
    duration_ms: int = 2000
    max_count: int = 4
    max_bytes: int = 1 << 30


@dataclass
class _Kept:
    target: ProfilerTarget
    mode: str  # continuous | ring
    started: float = field(default_factory=time.time)
    next_due: float = 0.0
    windows: list[Path] = field(default_factory=list)  # ring: oldest first
    capturing: bool = False
    last_error: str = ""
    last_window: float | None = None


class SnapshotService:
    """Start, stop, take and report snapshots of targets; ``tick`` drives the ring."""

    def __init__(
        self, engine: CaptureEngine, mode: str = "auto", ring: RingOptions | None = None
    ) -> None:
        if mode not in ("auto", "continuous", "ring"):
            raise ValueError(f"snapshot mode {mode!r}: expected auto, continuous or ring")
        self.engine = engine
        self.mode = mode
        self.ring = ring or RingOptions()
        self.ring_logdir = engine.logdir / RING_DIR
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            engine.limits.concurrency, thread_name_prefix="snapshot-ring"
        )
        engine.snapshots = self

    def remove_stale(self) -> list[Path]:
        """Remove the ring windows and snapshot scratch a previous sidecar left behind.

        What is kept lives in this process only (a restart keeps no snapshots), so at
        start everything under ``.ring`` and ``.snapshot`` is stale: a ``kill -9`` during
        a ring capture left its trace there for ever. Call before any snapshot starts.
        """
        with self._lock:
            if self._kept:
                return []
        removed = []
        for directory in (self.ring_logdir, self.engine.logdir / SNAPSHOT_DIR):
            if directory.is_dir() and not directory.is_symlink():
                remove_staging(directory, self.engine.logdir)
                removed.append(directory)
        return removed

    def _mode_for(self, target: ProfilerTarget) -> str:
        if self.mode != "auto":
            return self.mode
        return "continuous" if target.accelerator == "tpu" else "ring"

    # -- control -------------------------------------------------------------------
    def start(self, targets: list[ProfilerTarget]) -> list[dict[str, Any]]:
        """Keep snapshots of ``targets`` (already kept ones are left as they are)."""
        answers = []
        for target in targets:
            with self._lock:
                kept = self._kept.get(target.address)
            if kept is None:
                kept = _Kept(target, self._mode_for(target))
                if kept.mode == "continuous":
                    options = {
                        "host_tracer_level": self.engine.limits.max_host_tracer_level,
                        "device_tracer_level": 1,
                        "python_tracer_level": 0,
                    }
                    try:
                        self.engine.client.start_continuous(target.address, options)
                    except RuntimeError as exc:
                        answers.append(self._describe(kept) | {"error": str(exc)})
                        continue
                with self._lock:
                    self._kept[target.address] = kept
            answers.append(self._describe(kept))
        return answers

    def stop(self, addresses: list[str] | None = None) -> list[str]:
        """Stop keeping snapshots of these addresses (None: all); drop their ring."""
        with self._lock:
            chosen = [a for a in self._kept if addresses is None or a in addresses]
            removed = [self._kept.pop(a) for a in chosen]
        for kept in removed:
            if kept.mode == "continuous":
                try:
                    self.engine.client.stop_continuous(kept.target.address)
                except RuntimeError as exc:
                    log.warning("stop continuous profiling on %s: %s", kept.target.address, exc)
            for window in kept.windows:
                shutil.rmtree(window, ignore_errors=True)
        return chosen

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._describe(k) for k in self._kept.values()]

    def _describe(self, kept: _Kept) -> dict[str, Any]:
        return {
            "address": kept.target.address,
            "host": kept.target.host,
            "run_id": kept.target.run_id,
            "mode": kept.mode,
            "since": kept.started,
            "windows": len(kept.windows),
            "window_bytes": sum(_size(w) for w in kept.windows),
            "last_window": kept.last_window,
            "last_error": kept.last_error,
        }

    def close(self) -> None:
        self.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- ring ------------------------------------------------------------------------
    def tick(self) -> tuple[str, str]:
        """Start the ring captures that are due (called every second or so)."""
        now = time.monotonic()
        with self._lock:
            due = [
                k
                for k in self._kept.values()
                if k.mode == "ring" and not k.capturing and k.next_due <= now
            ]
            for kept in due:
                kept.capturing = True
                kept.next_due = now + self.ring.interval_s
        for kept in due:
            self._pool.submit(self._capture_window, kept)
        with self._lock:
            count = len(self._kept)
        return ("ok", f"{count} targets") if count else ("off", "no snapshot targets")

    def _capture_window(self, kept: _Kept) -> None:
        target = kept.target
        try:
            if not self.engine.reserve(target, RING_HOLDER):
                kept.last_error = "target busy with a capture session; window skipped"
                return
            window_id = new_session_id("ring")
            options = {
                "duration_ms": self.ring.duration_ms,
                "delay_ms": 0,
                "host_tracer_level": min(2, self.engine.limits.max_host_tracer_level),
                "device_tracer_level": min(1, self.engine.limits.max_device_tracer_level),
                "python_tracer_level": 0,
            }
            try:
                outcome = self.engine.trace_into(target, window_id, options, self.ring_logdir)
            finally:
                self.engine.release(target, RING_HOLDER)
            window = self.ring_logdir / PROFILE_DIR / window_id
            if outcome.status != "ok":
                kept.last_error = outcome.error
                shutil.rmtree(window, ignore_errors=True)
                return
            for stray in set(window.iterdir()) - set(outcome.files):
                stray.unlink(missing_ok=True)  # another target's file is not this window's
            with self._lock:
                if self._kept.get(target.address) is not kept:
                    shutil.rmtree(window, ignore_errors=True)  # stopped meanwhile
                    return
                kept.windows.append(window)
                kept.last_window, kept.last_error = time.time(), ""
                self._prune_locked()
        except Exception as exc:  # the ring keeps going; the status tells what broke
            log.exception("snapshot ring capture of %s failed", target.address)
            kept.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            kept.capturing = False

    def _prune_locked(self) -> None:
        for kept in self._kept.values():
            while len(kept.windows) > self.ring.max_count:
                shutil.rmtree(kept.windows.pop(0), ignore_errors=True)
        windows = sorted(
            ((w.stat().st_mtime, w, k) for k in self._kept.values() for w in k.windows),
            key=lambda item: item[0],
        )
        total = sum(_size(w) for _, w, _ in windows)
        for _, window, kept in windows:
            if total <= self.ring.max_bytes or len(kept.windows) <= 1:
                continue  # the newest window of a target always stays
            total -= _size(window)
            kept.windows.remove(window)
            shutil.rmtree(window, ignore_errors=True)

    # -- taking a snapshot -------------------------------------------------------------
    def take(self, target: ProfilerTarget, staging: Path) -> TargetOutcome | None:
        """Write the target's newest snapshot into ``staging``; None if none is kept."""
        with self._lock:
            kept = self._kept.get(target.address)
            newest = kept.windows[-1] if kept and kept.windows else None
        if kept is None:
            return None
        staging.mkdir(parents=True, exist_ok=True)
        if kept.mode == "continuous":
            return self._continuous_snapshot(target, staging)
        if newest is None:
            return TargetOutcome(
                "failed",
                f"{target.address}: no ring window captured yet (first one within "
                f"{self.ring.interval_s:g}s of start; last error: {kept.last_error or 'none'})",
                mode="ring",
            )
        files = []
        for source in sorted(newest.iterdir()):
            copy = staging / source.name
            # Both directories are the workload's to write: a link in the window is not
            # followed (an outside file's bytes would become the capture), and one at
            # the copy's name is replaced, not written through.
            try:
                with open_regular(source, below=self.engine.logdir) as handle:
                    replace_file(copy, handle, below=self.engine.logdir, sync=False)
            except OSError as exc:
                log.warning("snapshot of %s: %s not copied (%s)", target.address, source.name,
                            exc)  # fmt: skip
                continue
            files.append(copy)
        return TargetOutcome("ok", files=files, mode="ring")

    def _continuous_snapshot(self, target: ProfilerTarget, staging: Path) -> TargetOutcome:
        scratch = self.engine.logdir / SNAPSHOT_DIR / staging.name / target.file_stem()
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            self.engine.client.get_snapshot(target.address, str(scratch))
            written = sorted(  # a link planted in the scratch dir is never a capture
                p
                for p in scratch.rglob("*")
                if not p.is_symlink() and p.is_file() and p.stat().st_size
            )
            if not written:
                return TargetOutcome(
                    "failed",
                    f"{target.address}: get_snapshot succeeded but wrote nothing (no device "
                    "trace: continuous profiling needs a TPU; use MLPROF_SNAPSHOT_MODE=ring)",
                    mode="continuous",
                )
            files = []
            for index, source in enumerate(written):
                name = source.name if index == 0 else f"{source.stem}-{index}{source.suffix}"
                if name.endswith(".xplane.pb") and not name.startswith(target.file_stem()):
                    name = f"{target.file_stem()}.xplane.pb" if index == 0 else name
                destination = staging / name
                shutil.move(source, destination)
                files.append(destination)
            return TargetOutcome("ok", files=files, mode="continuous")
        except RuntimeError as exc:
            return TargetOutcome("failed", f"{target.address}: {exc}", mode="continuous")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except FileNotFoundError:
        return 0
