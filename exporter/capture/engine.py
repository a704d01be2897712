"""The capture engine: fan-out of remote traces (and snapshots) into the session store.

Each target gets at most one session at a time (a profiler server runs one profiling
session): a target already capturing is reported ``busy`` at once, never queued or
retried. Captures run in a bounded pool of worker threads; each has a deadline of
``delay + duration + timeout``. The profiler server writes its file into the capture
logdir (a directory the workload sees, e.g. the shared dir); the engine then moves it
into the store, so every store (``memory://``, ``gs://``, a local path) works the same.
A file the store refuses stays in the staging dir beside the session's record, and the
watcher retries the import (the session's hooks run once it succeeds).

>>> engine = CaptureEngine(SessionStore("memory://doc"), Path("/shared/captures"))  # doctest: +SKIP
>>> record = engine.submit(CaptureRequest(duration_ms=1000), registry.known())  # doctest: +SKIP
>>> engine.wait(record.id).status  # doctest: +SKIP
'done'
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from exporter.capture.client import ProfilerClient, XprofClient
from exporter.capture.session import (
    SESSION_FILE,
    SessionRecord,
    TargetResult,
    TargetStatus,
    check_session_id,
    new_session_id,
    utcnow,
)
from exporter.capture.store import PROFILE_DIR, SessionStore
from exporter.capture.targets import ProfilerTarget, TargetRegistry, probe
from exporter.config import MAX_ALERT_CAPTURES
from exporter.errors import MlprofError
from exporter.regular_files import NotRegularFileError, open_directory, replace_file
from exporter.schema import TRIGGERS

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from exporter.config import Settings

__all__ = [
    "LEVEL_RANGES",
    "TRIGGERS",
    "CaptureEngine",
    "CaptureLimits",
    "CaptureRejected",
    "CaptureRequest",
    "CaptureStoreError",
    "SnapshotSource",
    "TargetOutcome",
    "capture_rounds",
    "remove_staging",
]

log = logging.getLogger(__name__)

# What XProf's profiler accepts: host 0-3, device 0-1, python 0-1.
LEVEL_RANGES: Final[dict[str, tuple[int, int]]] = {
    "host_tracer_level": (0, 3),
    "device_tracer_level": (0, 1),
    "python_tracer_level": (0, 1),
}
# Longest capture anyone may ask for at all; the configured maximum clamps below it.
HARD_MAX_DURATION_MS: Final = 3_600_000
# The holder name of the snapshot ring's short captures (see snapshots.py).
RING_HOLDER: Final = "snapshot-ring"
CAPTURE_SUFFIX: Final = ".xplane.pb"
# Finished records the store refused, kept so ``get`` answers their final status.
MAX_UNSAVED: Final = 256
FINAL_STATUSES: Final = ("done", "partial", "failed")  # how a session ends (summarize())
# Captures one session may take of each target one after another (an alert's
# replicates: MLPROF_ALERT_CAPTURES); each is a profiling session on the workload.
MAX_CAPTURES: Final = MAX_ALERT_CAPTURES
# A session of several captures names each target's files <stem>.r<i>.xplane.pb (i from
# 1): the store is flat, and each capture is a replicate its report reads on its own.
_ROUND_NAME = re.compile(
    r"^(?P<stem>.+)\.r(?P<round>[1-9][0-9]{0,2})(?P<suffix>\.xplane\.(?:pb|riegeli))$"
)


class CaptureRejected(ValueError):  # noqa: N818 (name fixed by the capture contract)
    """A bad capture request; the message names the field and what was expected."""


class CaptureStoreError(MlprofError):
    """The session store refused a new session's record; nothing was started."""


@dataclass
class CaptureRequest:
    """What to capture; levels and duration are clamped to the configured maxima."""

    kind: Literal["trace", "snapshot"] = "trace"
    duration_ms: int = 2000
    host_tracer_level: int = 2
    device_tracer_level: int = 1
    python_tracer_level: int = 0
    delay_ms: int = 0
    name: str | None = None
    trigger: str = "manual"
    requester: str = "api"
    alert: dict[str, Any] | None = None
    # Traces of each target one after another, ``duration_ms`` split among them (see
    # capture_rounds); a snapshot is one window.
    captures: int = 1


def capture_rounds(record: SessionRecord) -> list[list[str]]:
    """The capture files of a session of several captures, one list per capture (every
    target's file of that round), in the order taken; [] for a session of one capture."""
    if record.options.get("captures", 1) <= 1:
        return []
    rounds: dict[int, list[str]] = {}
    for target in record.targets:
        for name in target.files:
            found = _ROUND_NAME.match(name)
            if found is not None:
                rounds.setdefault(int(found["round"]), []).append(name)
    return [sorted(rounds[i]) for i in sorted(rounds)]


def _round_name(name: str, stem: str, index: int) -> str:
    """``<stem>.xplane.pb`` as round ``index``'s ``<stem>.r<index>.xplane.pb``."""
    return f"{stem}.r{index}{name.removeprefix(stem)}"


@dataclass(frozen=True)
class CaptureLimits:
    """Maxima and pool sizes (``MLPROF_CAPTURE_*``)."""

    max_duration_ms: int = 60_000
    max_delay_ms: int = 60_000
    max_host_tracer_level: int = 3
    max_device_tracer_level: int = 1
    max_python_tracer_level: int = 1
    timeout_s: float = 30.0  # beyond delay + duration, per target
    concurrency: int = 16
    retention_count: int = 200
    retention_bytes: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> CaptureLimits:
        return cls(
            max_duration_ms=settings.capture_max_duration_ms,
            max_delay_ms=settings.capture_max_delay_ms,
            max_host_tracer_level=settings.capture_max_host_tracer_level,
            max_device_tracer_level=settings.capture_max_device_tracer_level,
            max_python_tracer_level=settings.capture_max_python_tracer_level,
            timeout_s=settings.capture_timeout_s,
            concurrency=settings.capture_concurrency,
            retention_count=settings.capture_retention_count,
            retention_bytes=settings.capture_retention_bytes,
        )


@dataclass
class TargetOutcome:
    """What one target's capture produced: files in the staging directory, or an error."""

    status: TargetStatus
    error: str = ""
    files: list[Path] = field(default_factory=list)
    mode: str = "trace"
    note: str = ""  # what the user should know beside the status (e.g. a fallback)


class SnapshotSource(Protocol):
    """Snapshots kept per target (continuous profiling or a ring of short captures)."""

    def take(self, target: ProfilerTarget, staging: Path) -> TargetOutcome | None:
        """Write the newest snapshot into ``staging``; None when none is kept for it."""
        ...


class CaptureEngine:
    """Runs capture sessions in the background and records them in the store."""

    def __init__(
        self,
        store: SessionStore,
        logdir: Path,
        limits: CaptureLimits | None = None,
        client: ProfilerClient | None = None,
        registry: TargetRegistry | None = None,
        meter: Meter | None = None,
    ) -> None:
        self.store = store
        self.logdir = logdir
        self.limits = limits or CaptureLimits()
        self._client = client
        self.registry = registry
        self.snapshots: SnapshotSource | None = None
        self.on_complete: list[Callable[[SessionRecord], object]] = []
        self.on_submit: list[Callable[[SessionRecord], object]] = []  # e.g. an event
        # Sessions retention must keep (the sidecar hands in the baseline marks').
        self.retention_keep: Callable[[], Collection[str]] = tuple
        self._pool = ThreadPoolExecutor(self.limits.concurrency, thread_name_prefix="capture")
        self._lock = threading.Lock()
        self._busy: dict[str, str] = {}  # address -> session id holding it
        self._running: dict[str, SessionRecord] = {}
        self._done_events: dict[str, threading.Event] = {}
        self._unsaved: OrderedDict[str, SessionRecord] = OrderedDict()
        self._counter = (
            meter.create_counter(
                "mlprof.captures",
                unit="{capture}",
                description="Capture sessions finished, by trigger and status.",
            )
            if meter is not None
            else None
        )
        if self._counter is not None:  # at 0 from the start, so increase() sees the first
            for trigger in TRIGGERS:
                for status in FINAL_STATUSES:
                    self._counter.add(0, {"trigger": trigger, "status": status})

    @property
    def client(self) -> ProfilerClient:
        if self._client is None:
            self._client = XprofClient()
        return self._client

    # -- public ------------------------------------------------------------------
    def check(self, request: CaptureRequest) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """Validate a request; return the options to run and what was clamped."""
        if request.kind not in ("trace", "snapshot"):
            raise CaptureRejected(f"kind={request.kind!r}: expected 'trace' or 'snapshot'")
        if request.trigger not in TRIGGERS:
            raise CaptureRejected(f"trigger={request.trigger!r}: expected one of {TRIGGERS}")
        captures = request.captures
        if not isinstance(captures, int) or isinstance(captures, bool):
            raise CaptureRejected(f"captures={captures!r}: expected an integer")
        if not 1 <= captures <= MAX_CAPTURES:
            raise CaptureRejected(f"captures={captures}: expected 1..{MAX_CAPTURES}")
        if captures > 1 and request.kind != "trace":
            raise CaptureRejected(f"captures={captures}: only a trace takes several captures")
        if request.name is not None:
            try:
                check_session_id(request.name)
            except ValueError as exc:
                raise CaptureRejected(str(exc)) from None
        wanted = {
            "duration_ms": request.duration_ms,
            "delay_ms": request.delay_ms,
            "host_tracer_level": request.host_tracer_level,
            "device_tracer_level": request.device_tracer_level,
            "python_tracer_level": request.python_tracer_level,
        }
        for key, value in wanted.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise CaptureRejected(f"{key}={value!r}: expected an integer")
        if not 1 <= request.duration_ms <= HARD_MAX_DURATION_MS:
            raise CaptureRejected(
                f"duration_ms={request.duration_ms}: expected 1..{HARD_MAX_DURATION_MS} "
                f"(captures are clamped to {self.limits.max_duration_ms})"
            )
        if not 0 <= request.delay_ms <= HARD_MAX_DURATION_MS:
            raise CaptureRejected(
                f"delay_ms={request.delay_ms}: expected 0..{HARD_MAX_DURATION_MS}"
            )
        for key, (low, high) in LEVEL_RANGES.items():
            if not low <= wanted[key] <= high:
                raise CaptureRejected(f"{key}={wanted[key]}: expected {low}..{high}")
        maxima = {
            "duration_ms": self.limits.max_duration_ms,
            "delay_ms": self.limits.max_delay_ms,
            "host_tracer_level": self.limits.max_host_tracer_level,
            "device_tracer_level": self.limits.max_device_tracer_level,
            "python_tracer_level": self.limits.max_python_tracer_level,
        }
        options = {key: min(value, maxima[key]) for key, value in wanted.items()}
        if captures > 1:  # absent for one capture: such records read as they always did
            options["captures"] = captures
        clamped = {
            key: {"requested": wanted[key], "max": maxima[key]}
            for key in wanted
            if wanted[key] > maxima[key]
        }
        return options, clamped

    def submit(self, request: CaptureRequest, targets: list[ProfilerTarget]) -> SessionRecord:
        """Create the session (``running``) and return at once; the capture runs behind."""
        options, clamped = self.check(request)
        if not targets:
            raise CaptureRejected("targets: expected at least one known profiler target")
        unique = list({t.address: t for t in targets}.values())
        if self.registry is not None:
            # Label the session with the run that owns each server now, not the one that
            # did at the last discovery: runs come and go on a shared node.
            unique = self.registry.current(unique)
        session_id = new_session_id(request.name)
        runs = {t.run_id for t in unique}
        workloads = {t.workload for t in unique}
        # One configuration only when every target says the same (as for the workload):
        # a session mixing two is no configuration's history.
        fingerprints = {t.config_fingerprint for t in unique}
        record = SessionRecord(
            id=session_id,
            kind=request.kind,
            trigger=request.trigger,
            requester=request.requester,
            run_id=runs.pop() if len(runs) == 1 else None,
            workload=workloads.pop() if len(workloads) == 1 else None,
            config_fingerprint=fingerprints.pop() if len(fingerprints) == 1 else None,
            alert=request.alert,
            name=request.name,
            options=options,
            clamped=clamped,
            targets=[TargetResult(address=t.address, host=t.host, run_id=t.run_id) for t in unique],
        )
        free: list[tuple[int, ProfilerTarget]] = []
        with self._lock:
            for index, target in enumerate(unique):
                holder = self._busy.get(target.address)
                if request.kind == "snapshot" and holder == RING_HOLDER:
                    free.append((index, target))  # the ring's windows are copied, not traced
                elif holder is not None:
                    result = record.targets[index]
                    result.status, result.finished = "busy", utcnow()
                    result.error = (
                        f"profiler server {target.address} is busy with session {holder} "
                        "(one profiling session per server at a time)"
                    )
                else:
                    self._busy[target.address] = session_id
                    free.append((index, target))
            self._running[session_id] = record
            self._done_events[session_id] = threading.Event()
        try:
            self.store.write_record(record)
        except Exception as exc:
            self._roll_back(session_id)
            raise CaptureStoreError(
                f"session {session_id}: cannot write its record into the store "
                f"{self.store.url} ({type(exc).__name__}: {exc}); no capture was started"
            ) from exc
        log.info(
            "capture %s (%s, %s) on %s", session_id, request.kind, request.trigger,
            ", ".join(t.address for t in unique),
        )  # fmt: skip
        for hook in self.on_submit:
            try:
                hook(record.model_copy(deep=True))
            except Exception:  # a hook (an event sink) never stops a capture
                log.exception("on_submit hook %r failed for %s", hook, session_id)
        threading.Thread(
            target=self._run_session,
            args=(record, free, request.kind),
            name=f"session-{session_id}",
            daemon=True,
        ).start()
        return record.model_copy(deep=True)

    def _roll_back(self, session_id: str) -> None:
        """Undo ``submit``'s reservations for a session that never started."""
        with self._lock:
            for address in [a for a, holder in self._busy.items() if holder == session_id]:
                del self._busy[address]
            self._running.pop(session_id, None)
            event = self._done_events.pop(session_id, None)
        if event is not None:
            event.set()

    def get(self, session_id: str) -> SessionRecord | None:
        """A session's record: live while running, else from the store."""
        with self._lock:
            live = self._running.get(session_id) or self._unsaved.get(session_id)
            if live is not None:
                return live.model_copy(deep=True)
        return self.store.read_record(session_id)

    def get_live(self, session_id: str) -> bool:
        """Whether a session is running in this engine now."""
        with self._lock:
            return session_id in self._running

    def busy(self, target: ProfilerTarget) -> bool:
        """Whether this engine holds a session on the target now."""
        with self._lock:
            return target.address in self._busy

    def reserve(self, target: ProfilerTarget, holder: str) -> bool:
        """Hold a target for ``holder`` (e.g. the snapshot ring); False when it is busy."""
        with self._lock:
            if target.address in self._busy:
                return False
            self._busy[target.address] = holder
            return True

    def release(self, target: ProfilerTarget, holder: str) -> None:
        with self._lock:
            if self._busy.get(target.address) == holder:
                del self._busy[target.address]

    def wait(self, session_id: str, timeout: float | None = None) -> SessionRecord | None:
        """Block until a session submitted here finishes; return its record."""
        with self._lock:
            event = self._done_events.get(session_id)
        if event is not None:
            event.wait(timeout)
        return self.get(session_id)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- capture -------------------------------------------------------------------
    def trace_into(
        self,
        target: ProfilerTarget,
        session_id: str,
        options: dict[str, int],
        logdir: Path | None = None,
    ) -> TargetOutcome:
        """One remote trace of ``target`` into the staging logdir (blocking)."""
        logdir = logdir or self.logdir
        unreachable = probe(target.address, min(2.0, self.limits.timeout_s))
        if unreachable:
            self._mark(target, False, unreachable)
            return TargetOutcome("unreachable", unreachable)
        staging = logdir / PROFILE_DIR / check_session_id(session_id)
        duration_ms = options["duration_ms"]
        trace_options = {
            "host_tracer_level": options["host_tracer_level"],
            "device_tracer_level": options["device_tracer_level"],
            "python_tracer_level": options["python_tracer_level"],
            "delay_ms": options["delay_ms"],
            "session_id": session_id,
        }
        began = time.monotonic()
        try:
            self.client.trace(target.address, str(logdir), duration_ms, trace_options)
        except RuntimeError as exc:
            elapsed_ms = (time.monotonic() - began) * 1000
            message = str(exc).strip()
            self._mark(target, True, "")
            if "UNAVAILABLE" in message and elapsed_ms < options["delay_ms"] + duration_ms:
                # The server answered at once without trace data: XProf's client says
                # UNAVAILABLE both for "another profiling session active" and for an
                # empty answer; the port was open, so the server is there and refusing.
                return TargetOutcome(
                    "busy",
                    f"profiler server {target.address} refused the capture at once: another "
                    f"profiling session is active on it, or it is not a profiler server "
                    f"(XProf: {message})",
                )
            return TargetOutcome("failed", f"{target.address}: {message}")
        self._mark(target, True, "")
        files = self._files_of(target, staging)
        if not files:
            return TargetOutcome(
                "failed",
                f"{target.address}: the capture succeeded but wrote no {CAPTURE_SUFFIX} under "
                f"{staging}: is the capture logdir ({logdir}) visible to the workload "
                "at the same path (MLPROF_CAPTURE_LOGDIR)?",
            )
        return TargetOutcome("ok", files=files)

    def remove_stale_staging(self) -> list[str]:
        """Remove what a killed sidecar's captures left in the logdir; return their ids.

        A ``kill -9`` during a capture leaves the trace the profiler server wrote (tens of
        MB) in ``<logdir>/plugins/profile/<id>`` for ever: no process will import it. A
        staging dir is the engine's (and stale) when the store has its session, this
        engine does not run it, and it holds no ``session.json``: one with it is a
        programmatic session (the SDK writes it last) or files kept for the watcher to
        import again. Call once at start, before any capture.
        """
        root = self.logdir / PROFILE_DIR
        try:
            root_fd = open_directory(root, below=self.logdir)
        except OSError:  # none yet, or not a directory of ours: nothing to remove
            return []
        try:
            with os.scandir(root_fd) as listing:
                names = sorted(e.name for e in listing if e.is_dir(follow_symlinks=False))
        finally:
            os.close(root_fd)
        removed = []
        for name in names:
            try:
                check_session_id(name)
            except ValueError:
                continue
            staged = root / name
            if self.get_live(name) or os.path.lexists(staged / SESSION_FILE):
                continue
            record = self.store.read_record(name)
            if record is None or any(t.unimported for t in record.targets):
                continue
            remove_staging(staged, self.logdir)
            removed.append(name)
        if removed:
            log.warning("removed the staged captures of %d sessions a stopped sidecar left "
                        "in %s: %s", len(removed), root, ", ".join(removed))  # fmt: skip
        return removed

    def staging_dir(self, session_id: str) -> Path:
        check_session_id(session_id)
        return self.logdir / PROFILE_DIR / session_id

    def _files_of(self, target: ProfilerTarget, staging: Path) -> list[Path]:
        if not staging.is_dir():
            return []
        stem = target.file_stem()
        return sorted(p for p in staging.iterdir() if p.is_file() and p.name.startswith(f"{stem}."))

    def _mark(self, target: ProfilerTarget, reachable: bool, error: str) -> None:
        if self.registry is not None:
            self.registry.mark(target.address, reachable, error)

    def _capture_one(
        self, target: ProfilerTarget, record: SessionRecord, kind: str, index: int
    ) -> TargetOutcome:
        with self._lock:
            record.targets[index].started = utcnow()
        try:
            if kind == "snapshot":
                staging = self.staging_dir(record.id)
                taken = self.snapshots.take(target, staging) if self.snapshots else None
                if taken is not None:
                    return taken
                traced = self.trace_into(target, record.id, record.options)
                # Said in the output and the record, not silently: the user asked for a
                # kept window and got a new trace (or its failure).
                traced.note = (
                    f"no snapshot kept for {target.address} (start one with `mlprof snapshot "
                    f"start`): a {record.options.get('duration_ms', 0)} ms trace was "
                    "taken instead"
                )
                return traced
            return self._trace_rounds(target, record.id, record.options)
        except Exception as exc:  # one target's failure is its result, not the session's
            log.exception("capture of %s failed", target.address)
            return TargetOutcome("failed", f"{target.address}: {type(exc).__name__}: {exc}")
        finally:
            self.release(target, record.id)

    def _trace_rounds(
        self, target: ProfilerTarget, session_id: str, options: dict[str, int]
    ) -> TargetOutcome:
        """``options["captures"]`` traces of ``target`` one after another, each of an equal
        share of ``duration_ms`` (the delay before the first), each file renamed to its
        round's name (:func:`capture_rounds`); one trace when there is no such option.

        A round that fails ends the target's captures (a server busy or gone does not
        come back within the session): the rounds before it are the result, said in
        its note; a failed first round is the failure.
        """
        count = options.get("captures", 1)
        if count <= 1:
            return self.trace_into(target, session_id, options)
        each = {**options, "duration_ms": max(1, options["duration_ms"] // count)}
        stem = target.file_stem()
        kept: list[Path] = []
        for index in range(1, count + 1):
            outcome = self.trace_into(target, session_id, each)
            if outcome.status != "ok":
                if not kept:
                    return outcome
                note = f"{index - 1} of {count} captures taken; capture {index}: {outcome.error}"
                return TargetOutcome("ok", files=kept, note=note)
            for path in outcome.files:
                if path not in kept:
                    kept.append(self._rename_round(path, stem, index))
            each["delay_ms"] = 0
        return TargetOutcome("ok", files=kept)

    def _rename_round(self, path: Path, stem: str, index: int) -> Path:
        """Rename a file the profiler wrote in the staging dir, no link under the logdir
        followed (the workload may write there)."""
        renamed = path.with_name(_round_name(path.name, stem, index))
        parent = open_directory(path.parent, below=self.logdir)
        try:
            os.rename(path.name, renamed.name, src_dir_fd=parent, dst_dir_fd=parent)
        finally:
            os.close(parent)
        return renamed

    def _run_session(
        self, record: SessionRecord, free: list[tuple[int, ProfilerTarget]], kind: str
    ) -> None:
        try:
            self._capture_all(record, free, kind)
        except Exception as exc:  # never leave the session running: _finish must run
            log.exception("capture %s failed", record.id)
            with self._lock:
                for result in record.targets:
                    if result.status == "running":
                        result.status, result.finished = "failed", utcnow()
                        result.error = f"the capture session failed: {type(exc).__name__}: {exc}"
        finally:
            self._finish(record)

    def _capture_all(
        self, record: SessionRecord, free: list[tuple[int, ProfilerTarget]], kind: str
    ) -> None:
        with self._lock:
            record.started = utcnow()
        options = record.options
        # Each of a target's captures has its own overhead (connecting, writing the file).
        overhead = self.limits.timeout_s * options.get("captures", 1)
        budget = (options["delay_ms"] + options["duration_ms"]) / 1000 + overhead
        futures: dict[Future[TargetOutcome], int] = {}
        for index, target in free:
            try:
                futures[self._pool.submit(self._capture_one, target, record, kind, index)] = index
            except RuntimeError:  # the pool is shut down: the sidecar is stopping
                self.release(target, record.id)
                self._apply(record, index, TargetOutcome("failed", "sidecar is stopping"))
        # Targets beyond the pool size wait for a free worker: allow one budget per wave.
        waves = max(1, -(-len(futures) // self.limits.concurrency))
        budget *= waves
        deadline = time.monotonic() + budget
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                                 return_when="FIRST_COMPLETED")  # fmt: skip
            if not done:
                break
            for future in done:
                self._apply(record, futures[future], future.result())
            self._save(self._snapshot(record))
        each = " for each capture" if options.get("captures", 1) > 1 else ""
        for future in pending:  # still blocked in the profiler client: the target stays busy
            index = futures[future]
            address = record.targets[index].address
            self._apply(record, index, TargetOutcome(
                "timeout", f"{address}: no answer within {budget:g}s "
                f"(delay + duration + MLPROF_CAPTURE_TIMEOUT_S{each})",
            ))  # fmt: skip
            future.add_done_callback(functools.partial(self._discard_late, record.id))

    def _apply(self, record: SessionRecord, index: int, outcome: TargetOutcome) -> None:
        result = record.targets[index]
        names: list[str] = []
        unimported: list[str] = []
        size = 0
        error = outcome.error
        for path in outcome.files:
            # The workload's profiler wrote the staging dir: no link under the logdir is
            # followed, and what is not a regular file is refused (not retried).
            below = self.logdir if path.is_relative_to(self.logdir) else None
            try:
                size += self.store.import_file(record.id, path, below=below)
                names.append(path.name)
            except NotRegularFileError as exc:
                error = f"{path.name} not imported into the store: {exc}"
                log.warning("capture %s: %s", record.id, error)
            except Exception as exc:  # e.g. a transient gs:// error: keep the file, retry later
                unimported.append(path.name)
                error = (
                    f"cannot move {path.name} into the store {self.store.url} "
                    f"({type(exc).__name__}: {exc}); it is kept in {path.parent} and "
                    "the import is retried"
                )
        with self._lock:
            result.status = "failed" if outcome.status == "ok" and not names else outcome.status
            result.error, result.files, result.bytes = error, names, size
            result.unimported = unimported
            result.mode = outcome.mode
            result.note = outcome.note
            result.finished = utcnow()

    def _discard_late(self, session_id: str, future: Future[TargetOutcome]) -> None:
        outcome = future.result()
        for path in outcome.files:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the staging dir, once no target writes there
            self.staging_dir(session_id).rmdir()
        log.warning(
            "capture %s: a timed-out target answered late; its files are dropped", session_id
        )

    def _snapshot(self, record: SessionRecord) -> SessionRecord:
        with self._lock:
            return record.model_copy(deep=True)

    def _save(self, record: SessionRecord) -> bool:
        """Write a record; a store failure is logged (the capture itself goes on)."""
        try:
            self.store.write_record(record)
        except Exception as exc:
            log.warning("capture %s: cannot write its record to %s: %s",
                        record.id, self.store.url, exc)  # fmt: skip
            return False
        return True

    def _finish(self, record: SessionRecord) -> None:
        with self._lock:
            record.status = record.summarize()
            record.finished = utcnow()
            final = record.model_copy(deep=True)
        saved = False
        deferred = any(t.unimported for t in final.targets)
        try:
            saved = self._save(final)
            staging = self.staging_dir(record.id)
            if deferred:
                try:
                    self._leave_for_retry(final, staging)
                except OSError as exc:  # the files stay; only the automatic retry is lost
                    log.error("capture %s: cannot keep %s for a retry: %s", final.id, staging, exc)
            elif (
                staging.is_dir()
                and staging.resolve() != Path(self.store.session_dir(record.id)).resolve()
            ):
                remove_staging(staging, self.logdir)
        finally:  # whatever the store did, the session is over and its targets are free
            with self._lock:
                self._running.pop(record.id, None)
                if not saved:
                    self._unsaved[record.id] = final
                    while len(self._unsaved) > MAX_UNSAVED:
                        self._unsaved.popitem(last=False)
                event = self._done_events.pop(record.id, None)
            if event is not None:
                event.set()
        if self._counter is not None:
            self._counter.add(1, {"trigger": final.trigger, "status": final.status})
        log.info("capture %s finished: %s", final.id, final.status)
        if deferred:
            return  # the hooks run once the watcher has imported the kept files
        for hook in self.on_complete:
            try:
                hook(final)
            except Exception:  # a hook never fails the capture
                log.exception("on_complete hook %r failed for %s", hook, final.id)
        try:
            self.store.enforce_retention(
                self.limits.retention_count, self.limits.retention_bytes, self.retention_keep()
            )
        except (OSError, ValueError) as exc:
            log.warning("retention on %s failed: %s", self.store.url, exc)

    def _leave_for_retry(self, final: SessionRecord, staging: Path) -> None:
        """Keep files the store refused in ``staging`` with the record they complete.

        The staging dir then looks like a finished programmatic session: the watcher's
        next poll imports the files and writes this record into the store.
        """
        retry = final.model_copy(deep=True)
        for result in retry.targets:
            if result.unimported:
                result.files = [*result.files, *result.unimported]
                result.bytes += sum(
                    (staging / name).stat().st_size
                    for name in result.unimported
                    if (staging / name).is_file()
                )
                result.status, result.error, result.unimported = "ok", "", []
        retry.status = retry.summarize()
        # Written beside and renamed (the watcher never reads half a record); the staging
        # dir is the workload's to write too, so no link there is written through.
        below = self.logdir if staging.is_relative_to(self.logdir) else None
        data = retry.model_dump_json(indent=2).encode() + b"\n"
        replace_file(staging / SESSION_FILE, data, below=below, sync=False)
        log.warning("capture %s: %s kept in %s; the import is retried", final.id,
                    ", ".join(n for t in final.targets for n in t.unimported), staging)  # fmt: skip


def remove_staging(staging: Path, logdir: Path) -> None:
    """Remove a staging dir, no link under the logdir followed (a ``plugins/`` made a
    link elsewhere must not make the sidecar delete a directory there)."""
    if not staging.is_relative_to(logdir):
        shutil.rmtree(staging, ignore_errors=True)
        return
    try:
        parent = open_directory(staging.parent, below=logdir)
    except OSError as exc:
        log.warning("staging dir %s not removed: %s", staging, exc)
        return
    try:
        shutil.rmtree(staging.name, dir_fd=parent, ignore_errors=True)
    finally:
        os.close(parent)
