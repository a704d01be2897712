"""After a session completes: each host's capture -> flame graphs -> Pyroscope + the store.

:class:`SessionProcessor` is the engine's (and the watcher's) ``on_complete`` hook. It
queues the work on its own thread, so a capture's API answer never waits for it, and
records what it made as ``artifacts`` in ``session.json``:

* ``<file stem>.<profile_source>.pb.gz`` beside the capture: the flame graph as pprof
  (``go tool pprof``, Pyroscope's ``profilecli`` and ``mlprof flamegraph`` read it);
* one push per flame graph when a sink is configured, with the sink's answer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from exporter.capture.session import SessionRecord, utcnow
from exporter.capture.store import SessionStore
from exporter.profiles.capture_files import capture_stem, is_capture_name
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.torch_trace import is_trace_name, trace_stem
from exporter.profiles.xplane import xplane_flamegraphs

if TYPE_CHECKING:
    from exporter.pipeline.job import Converted

__all__ = [
    "MAX_CONVERSION_STARTS",
    "Convert",
    "Push",
    "SessionJob",
    "SessionProcessor",
    "bounded_flamegraphs",
]

log = logging.getLogger(__name__)

# A session whose processing raised (the store or the converter failed) is tried again
# after each of these delays, then left unprocessed, logged, until the next restart.
RETRY_DELAYS_S: Final = (30.0, 120.0, 600.0)
# A session whose conversion was started this many times without finishing (the
# sidecar stopped or was killed during it, at every start) is not converted again: its
# artifacts say so and it is marked processed. ``conversion_starts`` in session.json
# counts them; it is removed when a conversion finishes.
MAX_CONVERSION_STARTS: Final = 3
Convert = Callable[[Path], Mapping[str, FlameGraph]]  # capture -> {profile_source: graph}
Push = Callable[[FlameGraph, dict[str, str]], object]
# (record, its capture names) -> each name's graphs (with the pprof bytes to store) or
# its one-line error: a session's captures converted in one child, with its report
# (exporter.pipeline.worker.ReportWorker.session_job).
SessionJob = Callable[[SessionRecord, list[str]], Mapping[str, "Mapping[str, Converted] | str"]]


def bounded_flamegraphs(timeout_s: float, max_memory_mb: int) -> Convert:
    """A ``Convert`` that reads each capture in a child bounded in time and memory.

    The sidecar's own: a capture is written by the workload, and a hostile or simply
    huge one must cost a child (which fails with a one-line reason), never the sidecar.
    """
    from exporter.pipeline.job import flamegraphs_in_child

    def convert(path: Path) -> Mapping[str, FlameGraph]:
        return flamegraphs_in_child(path, "capture", timeout_s, max_memory_mb)

    return convert


def _capture_labels(
    profile_source: str,
    *,
    service_name: str,
    run_id: str,
    host: str,
    trigger: str,
    session_id: str | None = None,
) -> dict[str, str]:
    """Pyroscope labels of one flame graph of a capture (see ``profile_labels``)."""
    from exporter.sinks.pyroscope import profile_labels

    return profile_labels(
        service_name,
        run_id=run_id,
        host=host,
        trigger=trigger,
        profile_source=profile_source,
        session_id=session_id,
    )


def _encode(graph: FlameGraph) -> bytes:
    from exporter.profiles.pprof import encode_pprof

    return encode_pprof(graph)


# ``session.json`` notes each flame graph handed to the sink (``capture:source``) until
# the session is marked processed: a sidecar killed between a push and that mark would
# otherwise push the graph again after its restart (Pyroscope adds it twice).
PUSHED_KEY: Final = "pushed"


def _pushed(record: SessionRecord) -> list[str]:
    value = (record.model_extra or {}).get(PUSHED_KEY)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _conversion_starts(record: SessionRecord) -> int:
    value = (record.model_extra or {}).get("conversion_starts", 0)
    return value if isinstance(value, int) and value >= 0 else MAX_CONVERSION_STARTS


class SessionProcessor:
    """Converts a finished session's captures, pushes them, records the artifacts.

    >>> processor = SessionProcessor(store, xplane_flamegraphs, sink.push)  # doctest: +SKIP
    >>> engine.on_complete.append(processor)  # doctest: +SKIP
    """

    def __init__(
        self,
        store: SessionStore,
        convert: Convert = xplane_flamegraphs,
        push: Push | None = None,
        service_name: Callable[[str | None], str] = lambda run_id: "mlprof",
        labels: Callable[..., dict[str, str]] | None = None,
        write_pprof: bool = True,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
    ) -> None:
        self.store = store
        self.convert = convert
        self.push = push
        self.service_name = service_name
        self.write_pprof = write_pprof
        self._labels = labels
        self.retry_delays_s = retry_delays_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="session-processor")
        self._lock = threading.Lock()
        # Sessions queued, being processed or waiting for a retry: an id leaves once it
        # is processed or given up on, so the set stays as small as the work at hand.
        self._pending: dict[str, int] = {}  # session id -> attempts that failed
        self._timers: dict[str, threading.Timer] = {}
        self._closed = False
        self.processed = 0
        self.given_up = 0
        # When set, one child per session converts every capture and makes the report
        # (SessionJob); else each capture is converted alone (``convert``).
        self.session_job: SessionJob | None = None
        # Called with each session's record once it is processed or given up on (the
        # report worker, for a report the session job did not make).
        self.on_processed: list[Callable[[SessionRecord], object]] = []

    def __call__(self, record: SessionRecord) -> Future[None] | None:
        """Queue a finished session (once at a time per id); the future, None if skipped."""
        if record.status == "running" or record.processed is not None:
            return None
        with self._lock:
            if record.id in self._pending:
                return None
            self._pending[record.id] = 0
        return self._pool.submit(self._process_logged, record.id)

    def pending(self, session_id: str) -> bool:
        """Whether the session is queued, being processed or waiting for a retry here."""
        with self._lock:
            return session_id in self._pending

    def _process_logged(self, session_id: str) -> None:
        try:
            record = self.process(session_id)
        except Exception:  # retried later (bounded), never in a tight loop
            log.exception("processing session %s failed", session_id)
            self._failed(session_id)
            if self.pending(session_id) or self._closed:
                return
            # Given up: its report is no longer this processor's to wait for.
            try:
                record = self.store.read_record(session_id)
            except Exception:  # the store that failed the processing: nothing to hand on
                return
        else:
            with self._lock:
                self._pending.pop(session_id, None)
        if record is None:
            return
        for hook in self.on_processed:
            try:
                hook(record)
            except Exception:  # one hook's failure never stops the others
                log.exception("hook %r failed for session %s", hook, session_id)

    def _failed(self, session_id: str) -> None:
        with self._lock:
            attempt = self._pending.get(session_id, 0)
            if self._closed or attempt >= len(self.retry_delays_s):
                self._pending.pop(session_id, None)
                self.given_up += 0 if self._closed else 1
                if not self._closed:
                    log.error("session %s: processing failed %d times; left unprocessed until "
                              "the sidecar restarts", session_id, attempt + 1)  # fmt: skip
                return
            self._pending[session_id] = attempt + 1
            delay = self.retry_delays_s[attempt]
            timer = threading.Timer(delay, self._retry, [session_id])
            timer.daemon = True
            self._timers[session_id] = timer
        log.warning("session %s: processing is retried in %gs", session_id, delay)
        timer.start()

    def _retry(self, session_id: str) -> None:
        with self._lock:
            self._timers.pop(session_id, None)
            if self._closed:
                return
        with contextlib.suppress(RuntimeError):  # the pool shut down: the sidecar is stopping
            self._pool.submit(self._process_logged, session_id)

    def process(self, session_id: str) -> SessionRecord | None:
        """Convert, push and record one session now (blocking)."""
        record = self.store.read_record(session_id)
        if record is None:
            return None
        captures = [
            (target.host, target.run_id, name)
            for target in record.targets
            for name in target.files
            if is_capture_name(name) or is_trace_name(name)  # torch traces: torch_watcher.py
        ]
        starts = _conversion_starts(record)
        artifacts: list[dict[str, Any]] = []
        if captures and starts >= MAX_CONVERSION_STARTS:
            log.error("session %s: conversion started %d times without finishing; given up",
                      session_id, starts)  # fmt: skip
            error = (
                f"conversion started {starts} times without finishing (the sidecar stopped "
                "during it each time): not tried again"
            )
            artifacts = [
                {"kind": "flamegraph", "capture": name, "host": host, "error": error}
                for host, _, name in captures
            ]
        elif captures:

            def started(current: SessionRecord) -> None:
                current.conversion_starts = starts + 1  # type: ignore[attr-defined]

            self.store.update_record(session_id, started)
            made: Mapping[str, Mapping[str, Converted] | str] | None = None
            if self.session_job is not None:
                try:
                    made = self.session_job(record, [name for _, _, name in captures])
                except Exception as exc:  # e.g. a remote store's copy failed: recorded
                    log.warning("session %s: session job failed: %s", session_id, exc)
                    made = {name: f"{type(exc).__name__}: {exc}" for _, _, name in captures}
            for host, run_id, name in captures:
                one = None if made is None else made.get(name, "not converted")
                artifacts.extend(self._convert_one(record, host, run_id, name, one))

        def record_artifacts(current: SessionRecord) -> None:
            current.artifacts = [a for a in current.artifacts if a.get("kind") != "flamegraph"]
            current.artifacts.extend(artifacts)
            current.processed = utcnow()
            for note in ("conversion_starts", PUSHED_KEY):
                if note in (current.model_extra or {}):
                    delattr(current, note)

        record = self.store.update_record(session_id, record_artifacts) or record
        self.processed += 1
        log.info("session %s: %d flame graphs", session_id, len(artifacts))
        return record

    def _note_pushed(self, record: SessionRecord, key: str) -> None:
        """Remember in ``session.json`` at once that ``key`` went to the sink."""
        done = [*_pushed(record), key]
        setattr(record, PUSHED_KEY, done)

        def note(current: SessionRecord) -> None:
            setattr(current, PUSHED_KEY, sorted({*_pushed(current), key}))

        try:
            self.store.update_record(record.id, note)
        except (OSError, ValueError) as exc:  # not fatal: at worst a restart sends it again
            log.warning("session %s: cannot note the push of %s: %s", record.id, key, exc)

    def _convert_one(
        self,
        record: SessionRecord,
        host: str,
        run_id: str | None,
        name: str,
        made: Mapping[str, Converted] | str | None = None,
    ) -> list[dict[str, Any]]:
        """Store and push the graphs of capture ``name``: ``made`` by the session job
        (each with the pprof it encoded; a string: why it did not convert), else
        converted here."""
        base = {"kind": "flamegraph", "capture": name, "host": host}
        if isinstance(made, str):
            return [base | {"error": f"cannot convert: {made}"}]
        encoded: dict[str, bytes] = {}
        if made is not None:
            graphs: Mapping[str, FlameGraph] = {s: c.graph for s, c in made.items()}
            encoded = {source: converted.pprof for source, converted in made.items()}
        else:
            try:
                with self.store.local_file(record.id, name) as path:
                    graphs = self.convert(path)
            except Exception as exc:  # an unreadable capture is recorded, not fatal
                return [base | {"error": f"cannot convert: {exc}"}]
        artifacts = []
        stem = trace_stem(name) if is_trace_name(name) else capture_stem(name)
        for source, graph in graphs.items():
            artifact: dict[str, Any] = base | {
                "profile_source": source,
                "sample_type": graph.sample_type,
                "unit": graph.unit,
                "total": graph.root.total,
                "nodes": graph.node_count,
            }
            if self.write_pprof:
                pprof_name = f"{stem}.{source}.pb.gz"
                try:
                    data = encoded.get(source) or _encode(graph)  # the child's, as it is
                    self.store.write_file(record.id, pprof_name, data)
                    artifact["file"] = pprof_name
                except OSError as exc:
                    artifact["file_error"] = str(exc)
            key = f"{name}:{source}"
            if self.push is not None and key in _pushed(record):
                # Handed to the sink by a sidecar that stopped before the session was
                # marked processed: sent again, Pyroscope would count it twice.
                artifact["push"] = {
                    "sink": "pyroscope",
                    "status": "ok",
                    "message": "pushed before the sidecar restarted; not sent again",
                }
            elif self.push is not None:
                try:
                    labels = self._push_labels(record, source, host, run_id)
                    outcome = self.push(graph, labels)
                except Exception as exc:  # e.g. a label the sink refuses: this push only
                    log.warning("session %s: push of %s (%s) failed: %s",
                                record.id, name, source, exc)  # fmt: skip
                    artifact["push"] = {
                        "sink": "pyroscope",
                        "status": "rejected",
                        "message": f"{type(exc).__name__}: {exc}",
                    }
                else:
                    status = getattr(outcome, "status", str(outcome))
                    artifact["push"] = {
                        "sink": "pyroscope",
                        "status": status,
                        "message": getattr(outcome, "message", ""),
                    }
                    if status in ("ok", "spooled"):  # delivered, or the spool delivers it
                        self._note_pushed(record, key)
            artifacts.append(artifact)
        return artifacts

    def _push_labels(
        self, record: SessionRecord, source: str, host: str, run_id: str | None
    ) -> dict[str, str]:
        labels = self._labels or _capture_labels
        return labels(
            source,
            service_name=record.workload or self.service_name(run_id or record.run_id),
            run_id=run_id or record.run_id or "",
            host=host,
            trigger=record.trigger,
            session_id=record.id,
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            timers = list(self._timers.values())
            self._timers.clear()
        for timer in timers:
            timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
