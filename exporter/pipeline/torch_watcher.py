"""The sidecar's side of torch.profiler traces: each new one becomes a session in the store.

The workload writes Kineto traces into ``<shared>/torch_traces/`` (``schema.TORCH_TRACES_DIR``):
``run.torch_profile()`` (the SDK) writes ``<name>.pt.trace.json`` with its identity
``<name>.json`` beside it, identity first and the trace renamed into place last; or the
workload points ``torch.profiler.tensorboard_trace_handler`` there, which writes
``<worker>.<ns>.pt.trace.json[.gz]`` in place and no identity. :class:`TorchTraceWatcher`
takes each trace once (remembered across restarts, as the memory-profile watcher does):
an SDK trace as soon as it appears, a trace without identity once it has stopped
changing (same size and mtime as at the previous poll, and older than ``settle_s``:
Kineto writes it in place, and half a trace is no trace). The trace moves into a new
session of the store, whose record the watcher writes (``done``, the run's identity
from the SDK's identity or else the shared directory's ``run.json``), and the session
goes to the capture hooks: the session processor converts it in a bounded child into
the ``torch_device`` / ``torch_host`` / ``torch_memory`` flame graphs and pushes them,
and the report worker writes its report, as for an XSpace capture.

The workload writes the shared dir: a ``torch_traces/`` that is a link (or lies under
one) is not read; a trace that is a link, a FIFO or a device is recorded as failed
without being opened, and one larger than :data:`MAX_TRACE_BYTES` without being copied;
identities are read bounded (``read_regular_at``). The store copies only from a
descriptor opened without following links.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, Field

from exporter import schema
from exporter.capture.fingerprints import FINGERPRINT_KEY, checked_fingerprint, fingerprint_of
from exporter.capture.names import check_session_id
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.profiles.torch_trace import MAX_TRACE_BYTES, is_trace_name, trace_stem
from exporter.regular_files import (
    WatchedDirectory,
    read_regular,
    read_regular_at,
)
from exporter.state_files import BadStateError, load_state, save_state, set_aside

__all__ = ["SETTLE_S", "TorchTraceResult", "TorchTraceWatcher"]

log = logging.getLogger(__name__)

# A trace without the SDK's identity is taken once unchanged for a poll and this old:
# Kineto's exporter writes a large trace over a few seconds (the JSON is streamed out).
SETTLE_S: Final = 10.0
SESSION_PREFIX: Final = "torch-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
OnSession = Callable[[SessionRecord], object]


class _WatcherState(BaseModel):
    """``sidecar/torch-traces.json``: the traces already taken (or refused)."""

    processed: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)  # name -> why


class TorchTraceResult(BaseModel):
    """One trace picked up: its file name, the session it became, or why not."""

    name: str
    session_id: str | None = None
    error: str = ""


def _session_id(stem: str, moment: float) -> str:
    """A safe session id from a trace's name, ``torch-<stem>-<time>-<random>`` (the random
    part as ``run.profile()``'s: a stem seen again in the same second is another session)."""
    safe = _UNSAFE.sub("_", stem).replace("..", "_").strip("._-")[:80] or "trace"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(moment))
    return check_session_id(f"{SESSION_PREFIX}{safe}-{stamp}-{secrets.token_hex(3)}")


def _identity_name(name: str) -> str:
    return trace_stem(name) + schema.TORCH_TRACE_META_SUFFIX


class TorchTraceWatcher:
    """Takes each new torch.profiler trace in the shared dir into the store as a session.

    ``poll()`` is what the sidecar calls periodically; ``on_session`` are the capture
    hooks (conversion and push, report). ``clock`` is injectable for the settle rule.

    >>> watcher = TorchTraceWatcher(shared, store, [hooks])  # doctest: +SKIP
    >>> watcher.poll()  # doctest: +SKIP
    """

    def __init__(
        self,
        shared_dir: Path,
        store: SessionStore,
        on_session: list[OnSession] | None = None,
        state_path: Path | None = None,
        *,
        settle_s: float = SETTLE_S,
        max_bytes: int = MAX_TRACE_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.shared_dir = shared_dir
        self.directory = shared_dir / schema.TORCH_TRACES_DIR
        self.store = store
        self.on_session = list(on_session or [])
        self.state_path = state_path or shared_dir / schema.SIDECAR_DIR / "torch-traces.json"
        self.settle_s = settle_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.processed: set[str] = set()
        self.failed: dict[str, str] = {}
        self.imported = 0
        self.errors = 0
        self.watched = WatchedDirectory(
            self.directory, below=shared_dir, what="torch.profiler traces", log=log
        )
        self.state_discarded: str | None = None
        # name -> (size, mtime_ns) at the previous poll, for traces without an identity
        self._seen: dict[str, tuple[int, int]] = {}
        try:
            state = load_state(self.state_path, _WatcherState)
        except BadStateError as exc:
            self.state_discarded = str(exc)
            set_aside(self.state_path, str(exc))
        else:
            if state is not None:
                self.processed, self.failed = set(state.processed), dict(state.failed)

    def _save(self) -> None:
        failed = {k: v for k, v in sorted(self.failed.items()) if k in self.processed}
        save_state(self.state_path, json.dumps({"processed": sorted(self.processed),
                                                "failed": failed}).encode())  # fmt: skip

    @property
    def refused(self) -> str | None:
        """Why ``torch_traces/`` is not read now (said once), None while it is."""
        return self.watched.refused

    def poll(self) -> list[TorchTraceResult]:
        """Take every settled trace not taken before; oldest first."""
        dir_fd = self.watched.open()
        if dir_fd is None:
            return []  # no trace yet, or refused (said once)
        try:
            return self._poll_in(dir_fd)
        finally:
            os.close(dir_fd)

    def _listing(self, dir_fd: int) -> list[tuple[str, os.stat_result]]:
        found = []
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                # A leading dot: the SDK's (or anyone's) file still being written.
                if entry.name.startswith(".") or not is_trace_name(entry.name):
                    continue
                try:
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:  # gone since listed
                    continue
        return sorted(found, key=lambda item: (item[1].st_mtime_ns, item[0]))

    def _poll_in(self, dir_fd: int) -> list[TorchTraceResult]:
        listed = self._listing(dir_fd)
        names = {name for name, _ in listed}
        # Taken traces leave the directory: the state holds only what is still there.
        if self.processed - names:
            self.processed &= names
            self._save()
        self._seen = {k: v for k, v in self._seen.items() if k in names}
        results = []
        for name, info in listed:
            if name in self.processed:
                continue
            refusal = self._refusal(info)
            if refusal:
                results.append(self._refuse(name, refusal))
                continue
            identity = self._identity(dir_fd, name)
            if identity is None and not self._settled(name, info):
                continue
            results.append(self._take(dir_fd, name, info, identity or {}))
        return results

    def _refusal(self, info: os.stat_result) -> str:
        if stat.S_ISLNK(info.st_mode):  # it would read a file outside the shared dir
            return "not a regular file (a symbolic link)"
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device: would block or never end
            return "not a regular file"
        if info.st_size > self.max_bytes:
            return (
                f"{info.st_size} bytes, over the {self.max_bytes}-byte bound of a "
                "torch.profiler trace: not taken (profile fewer steps: schedule(active=...))"
            )
        return ""

    def _refuse(self, name: str, why: str) -> TorchTraceResult:
        error = f"{self.directory / name}: {why}"
        self.errors += 1
        log.warning("skipping torch.profiler trace: %s", error)
        self.processed.add(name)
        self.failed[name] = error[:500]
        self._save()
        return TorchTraceResult(name=name, error=error)

    def _settled(self, name: str, info: os.stat_result) -> bool:
        """Unchanged since the previous poll and ``settle_s`` old: Kineto is done with it."""
        now = (info.st_size, info.st_mtime_ns)
        before = self._seen.get(name)
        self._seen[name] = now
        return before == now and self.clock() - info.st_mtime >= self.settle_s

    def _identity(self, dir_fd: int, name: str) -> dict[str, Any] | None:
        """The SDK's identity beside the trace (bounded, regular, no link); None if none."""
        meta = _identity_name(name)
        try:
            data = json.loads(read_regular_at(dir_fd, meta, self.directory / meta))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("%s: identity not read (%s); taken as a trace without one",
                        self.directory / meta, exc)  # fmt: skip
            return None
        return data if isinstance(data, dict) else None

    def _run_identity(self) -> dict[str, Any]:
        """The shared dir's newest run (``run.json``): whose trace one without identity is."""
        try:
            path = self.shared_dir / schema.RUN_FILE
            data = json.loads(read_regular(path, below=self.shared_dir))
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {"run_id": data.get("run_id"), "workload": data.get("name"),
                "host": data.get("host"), FINGERPRINT_KEY: fingerprint_of(data)}  # fmt: skip

    def _record(
        self, name: str, info: os.stat_result, identity: dict[str, Any], session_id: str
    ) -> SessionRecord:
        from exporter.sinks.pyroscope import TRIGGERS

        found = identity or self._run_identity()
        when = identity.get("time")
        moment = float(when) if isinstance(when, int | float) else info.st_mtime
        stamp = datetime.fromtimestamp(moment, UTC)
        trigger = str(identity.get("trigger") or "programmatic")
        if trigger not in TRIGGERS:  # the workload's string: a known label or none
            trigger = "programmatic"
        run_id = found.get("run_id")
        fingerprint = checked_fingerprint(found.get(FINGERPRINT_KEY))
        if fingerprint is None and identity and run_id:
            # An identity from an SDK before the fingerprint: run.json, when it is the
            # same run's, gives it (computed from its configs if it has none either).
            run = self._run_identity()
            fingerprint = run.get(FINGERPRINT_KEY) if run.get("run_id") == run_id else None
        host = str(found.get("host") or trace_stem(name).split(".")[0] or "unknown")
        return SessionRecord(
            id=session_id,
            status="done",
            kind="torch_trace",
            trigger=trigger,
            requester="sdk" if identity else "tensorboard_trace_handler",
            run_id=str(run_id) if run_id else None,
            workload=str(found["workload"]) if found.get("workload") else None,
            config_fingerprint=fingerprint,
            name=str(identity.get("name") or trace_stem(name))[:128],
            created=stamp,
            started=stamp,
            finished=stamp,
            targets=[
                TargetResult(
                    address="local",
                    host=host[:128],
                    run_id=str(run_id) if run_id else None,
                    status="ok",
                    files=[name],
                    bytes=info.st_size,
                    started=stamp,
                    finished=stamp,
                    mode="programmatic",
                )
            ],
        )

    def _take(
        self, dir_fd: int, name: str, info: os.stat_result, identity: dict[str, Any]
    ) -> TorchTraceResult:
        """Move one trace into a new session, write its record, hand it to the hooks."""
        # Remembered before the copy: a trace that takes the sidecar down is not tried
        # again at every start (its error says so).
        self.processed.add(name)
        self.failed[name] = "import did not finish (the sidecar stopped)"
        self._save()
        try:
            session_id = _session_id(trace_stem(name), self.clock())
            record = self._record(name, info, identity, session_id)
            self.store.import_file(session_id, self.directory / name, below=self.shared_dir)
            self.store.write_record(record)
        except Exception as exc:  # one bad trace must not stop the others
            self.errors += 1
            error = f"{self.directory / name}: not taken into the store: {exc}"
            log.warning("%s", error)
            self.failed[name] = error[:500]
            self._save()
            return TorchTraceResult(name=name, error=error)
        # import_file removed it: a trace written under this name again is a new one.
        self.failed.pop(name, None)
        self.processed.discard(name)
        self._save()
        with contextlib.suppress(OSError):  # the identity goes with its trace
            os.unlink(_identity_name(name), dir_fd=dir_fd)
        self.imported += 1
        log.info("torch.profiler trace %s is session %s", name, session_id)
        for hook in self.on_session:
            try:
                hook(record)
            except Exception:  # one hook's failure never stops the others
                log.exception("session hook %r failed for %s", hook, session_id)
        return TorchTraceResult(name=name, session_id=session_id)
