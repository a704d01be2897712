"""Reports for finished sessions: ``analysis.json`` and ``summary.html`` in each session.

:class:`ReportWorker` is a post-session hook (``CaptureService.hooks``). The hook only
queues the session; one background thread runs each analysis in a child process
(:func:`exporter.pipeline.job.run_job`, bounded in time and memory), so neither a
request nor the capture engine ever waits for it, and a report that fails is recorded
(``analysis-error.json`` and ``mlprof_reports_total{status="error"}``), never fatal.
In the sidecar a finished session's report is made by the session processor's one
child for it (:meth:`ReportWorker.session_job`, with the conversion, from one read of
each capture); the hook queues the others (a report asked for later, one that child
did not make).

Alert-started and snapshot sessions are compared against their baseline
(:mod:`exporter.analysis.sides.baselines`) automatically. When a report is finished, every
callable in :attr:`ReportWorker.on_report` is called with a :class:`ReportEvent`:
that is the one place to hang "report written" notifications (e.g. an event sink).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

from exporter.analysis.compare.noise import MIN_HISTORY
from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.session import SessionRecord
from exporter.capture.store import SessionStore
from exporter.json_limits import load_json, load_json_object
from exporter.pipeline.job import REPORT_HTML, REPORT_JSON, SessionRun, run_job, run_session
from exporter.pipeline.replicates import plan_replicates, replicate_specs
from exporter.profiles.capture_files import is_capture_name
from exporter.profiles.torch_trace import is_trace_name
from exporter.regular_files import open_directory, read_regular, read_tail

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

    from exporter.config import Settings
    from exporter.pipeline.job import Converted

__all__ = [
    "ERROR_FILE",
    "REPORT_STATUSES",
    "ReportEvent",
    "ReportSettings",
    "ReportWorker",
    "config_from_shared_dir",
    "report_worker_from_settings",
    "workload_from_shared_dir",
]

log = logging.getLogger(__name__)

ERROR_FILE: Final = "analysis-error.json"
REPORT_STATUSES: Final = ("OPTIMAL", "NEEDS_ATTENTION", "error")
COMPARED_TRIGGERS: Final = frozenset({"alert", "snapshot"})
# Runs whose newest report's findings are exported; the oldest are dropped beyond this
# (label cardinality stays bounded on a long-lived sidecar).
MAX_RUNS_EXPORTED: Final = 200
# A session left without a report (a sidecar restarted with reports queued) is analysed
# when the store is next scanned, if it finished within this window. Older ones (a store
# that predates reports, a long outage) would hold a core for hours at start-up: they
# get their report when someone asks for it (GET /api/v1/sessions/{id}/report).
BACKFILL_MAX_AGE_S: Final = 24 * 3600.0
DASHBOARD_UID: Final = "mlprof-overview"
# The newest part of each step log read for device-memory samples: the SDK writes one
# memory line per interval among the step lines, so the last MiB holds the newest
# (a step line is ~200 bytes). Read as a tail whatever the file's size (1 GiB seen).
MEMORY_TAIL_BYTES: Final = 1 << 20
# The earlier runs' side caches a report reads as its history, in all (a 34.6 MiB TPU
# capture's cache is a few hundred KiB; a 373 MB one's a few MiB).
HISTORY_MAX_CACHE_BYTES: Final = 64 << 20
# A run's identity file (runs/<id>.json) is a few KiB.
MAX_RUN_FILE_BYTES: Final = 1 << 20


def _analysed(name: str) -> bool:
    """A session file the report reads: an XProf capture or a torch.profiler trace."""
    return is_capture_name(name) or is_trace_name(name)


@dataclass(frozen=True)
class ReportSettings:
    """``MLPROF_REPORT_*`` and the URLs reports link to."""

    enabled: bool = True
    timeout_s: float = 300.0
    max_memory_mb: int = 4096
    xprof: bool = True
    grafana_url: str | None = None
    pyroscope_url: str | None = None
    api_base: str = ""


@dataclass(frozen=True)
class ReportEvent:
    """A finished report (or a failed one: ``status == "error"``)."""

    session_id: str
    run_id: str | None
    workload: str | None
    trigger: str
    status: str
    findings: dict[str, int]
    baseline_session: str | None
    top_regression: str | None
    error: str = ""
    seconds: float = 0.0
    written_at: float = field(default_factory=time.time)
    session_created: float = 0.0  # when the session was created (Unix seconds)


class ReportWorker:
    """Queues finished sessions and writes their reports (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore,
        settings: ReportSettings | None = None,
        *,
        shared_dir: Path | None = None,
        workload_of: Callable[[SessionRecord], str | None] | None = None,
        config_of: Callable[[SessionRecord], str | None] | None = None,
        meter: Meter | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or ReportSettings()
        self.shared_dir = shared_dir
        self.workload_of = workload_of or (lambda record: record.workload)
        self.baselines = BaselineStore(
            store, self.workload_of, config_of or (lambda record: record.config_fingerprint)
        )
        self.on_report: list[Callable[[ReportEvent], object]] = []
        # Sessions the session processor holds: it makes their reports in its own child
        # (session_job), with their conversion, so the hook leaves them to it.
        self.deferred: Callable[[str], bool] = lambda session_id: False
        # One worker thread; alert and snapshot sessions go first (someone was paged),
        # then the others in arrival order.
        self._queue: queue.PriorityQueue[tuple[int, int, str, Future[ReportEvent | None]]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        # (run_id, workload) -> (session created, findings per priority) of its newest
        # session's report: reports may finish out of order (alerts go first).
        self._findings: OrderedDict[tuple[str, str], tuple[float, dict[str, int]]] = OrderedDict()
        self.written = 0
        self._counter = None
        if meter is not None:
            self._counter = meter.create_counter(
                "mlprof.reports",
                unit="{report}",
                description="Analysis reports written, by status (error: the analysis failed).",
            )
            for status in REPORT_STATUSES:
                self._counter.add(0, {"status": status})  # so increase() sees the first one
            meter.create_observable_gauge(
                "mlprof.report.findings",
                callbacks=[self._observe_findings],
                unit="{finding}",
                description="Findings of each run's newest report, by priority.",
            )

    # -- hook --------------------------------------------------------------------
    def __call__(
        self, record: SessionRecord, *, on_request: bool = False
    ) -> Future[ReportEvent | None] | None:
        """Queue a finished session once; the hook returns at once.

        A session that has its verdict already is skipped; one that was processed long
        ago (see BACKFILL_MAX_AGE_S) only ``on_request``.
        """
        if not self.settings.enabled or record.status == "running" or not record.finished_ok:
            return None
        if record.report is not None or self.deferred(record.id):
            return None
        ended = record.finished or record.created
        if (
            not on_request
            and record.processed is not None
            and time.time() - ended.timestamp() > BACKFILL_MAX_AGE_S
        ):
            return None
        with self._lock:
            if record.id in self._seen:
                return None
            self._seen.add(record.id)
        future: Future[ReportEvent | None] = Future()
        urgent = 0 if record.trigger in COMPARED_TRIGGERS else 1
        self._queue.put((urgent, next(self._order), record.id, future))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="mlprof-reports", daemon=True
                )
                self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            _, _, session_id, future = self._queue.get()
            if not session_id:  # close()
                return
            if future.set_running_or_notify_cancel():
                future.set_result(self._process_logged(session_id))

    def _process_logged(self, session_id: str) -> ReportEvent | None:
        try:
            return self.process(session_id)
        except Exception:  # never fatal: the next session still gets its report
            log.exception("report of session %s failed", session_id)
            return None

    def _claim(self, record: SessionRecord) -> bool:
        """Whether ``record``'s report is due and now this caller's to make (not queued)."""
        if not self.settings.enabled or record.status == "running" or not record.finished_ok:
            return False
        if record.report is not None:
            return False
        with self._lock:
            if record.id in self._seen:
                return False
            self._seen.add(record.id)
        return True

    def session_job(
        self, record: SessionRecord, names: list[str]
    ) -> dict[str, dict[str, Converted] | str]:
        """The session processor's one child for a finished session (``run_session``):
        ``names`` converted, and the session's report written when it is due, from one
        read of each capture. Each name's graphs, or its one-line error.

        The processor calls it for the sessions it holds (:attr:`deferred`), so the hook
        leaves their reports to it; a report the child did not get to make is left to
        the hook again (the processor's ``on_processed``).
        """
        if self._claim(record):
            made: list[SessionRun] = []
            try:
                self.process(record.id, converting=(names, made))
            except Exception:  # the report's failure is its own; the conversion goes on
                log.exception("report of session %s failed", record.id)
            if made and made[0].graphs:
                return made[0].graphs
            with self._lock:  # not made here: the hook may queue it
                self._seen.discard(record.id)
        with self._local_session(record.id, names) as session_dir:
            run = run_session(session_dir, names, self.settings.timeout_s,
                              self.settings.max_memory_mb)  # fmt: skip
        return run.graphs

    # -- work --------------------------------------------------------------------
    def process(
        self,
        session_id: str,
        *,
        converting: tuple[list[str], list[SessionRun]] | None = None,
    ) -> ReportEvent | None:
        """Analyse one session now (blocking) and write its report into the session.

        ``converting``: (files, out) also converts those files in the same child
        (:meth:`session_job`); what it made is appended to ``out``.
        """
        record = self.store.read_record(session_id)
        if record is None:
            return None
        captures = [n for t in record.targets for n in t.files if _analysed(n)]
        if not captures:
            return None
        workload = self.workload_of(record)
        baseline = self.baselines.choose(record) if record.trigger in COMPARED_TRIGGERS else None
        # An alert's several captures: compared one by one with the baseline's (replicates).
        plan = plan_replicates(record, baseline.session_id, self.baselines) if baseline else None
        started = time.monotonic()
        with (
            self._local_session(record.id, captures) as session_dir,
            self._local_baseline(baseline.session_id if baseline else None) as base_dir,
            tempfile.TemporaryDirectory(prefix="mlprof-report-") as out,
            replicate_specs(plan, session_dir, base_dir, self._local_session) as (heads, bases),
        ):
            args = [
                "analyze",
                str(session_dir),
                out,
                "--title",
                f"mlprof report: session {record.id}",
            ]
            if baseline is not None and base_dir is not None:
                args += [f"--baseline={spec}" for spec in bases]
                args += [f"--replicate={spec}" for spec in heads]
                args += [
                    "--baseline-session",
                    baseline.session_id,
                    "--baseline-reason",
                    baseline.reason,
                ]
                compared = (
                    {baseline.session_id, *(sid for sid, _ in plan.base_sessions)}
                    if plan
                    else {baseline.session_id}
                )
                history = self.baselines.history(record, exclude=compared)
                if history:
                    args += ["--history-ns", json.dumps(history)]
                args += [f"--history={path}" for path in self._history_dirs(record, compared)]
            samples = self._memory_samples(record)
            if samples:
                args += ["--memory-samples", json.dumps(samples)]
            args += ["--links", json.dumps(self._links(record, workload))]
            if not self.settings.xprof:
                args.append("--no-xprof")
            if converting is not None:  # one child: the conversion, then this report
                names, made = converting
                limits = (self.settings.timeout_s, self.settings.max_memory_mb)
                run = run_session(session_dir, names, *limits, report_args=args[3:])
                made.append(run)
                result = run.result
                started += run.conversion_s  # analysis_seconds: the report's part
                if run.report is not None:
                    report, page = run.report
            else:
                result = run_job(args, self.settings.timeout_s, self.settings.max_memory_mb)
                if result.ok:
                    report = json.loads((Path(out) / REPORT_JSON).read_text(encoding="utf-8"))
                    page = (Path(out) / REPORT_HTML).read_bytes()
        seconds = time.monotonic() - started
        if not result.ok:
            return self._failed(record, workload, result.error, seconds)
        report["session"] = {
            "id": record.id,
            "run_id": record.run_id,
            "workload": workload,
            "trigger": record.trigger,
            "alert": (record.alert or {}).get("name"),
        }
        report["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + (
            f".{int(time.time() * 1000) % 1000:03d}Z"
        )
        report["analysis_seconds"] = round(seconds, 3)
        try:
            self.store.write_file(record.id, REPORT_HTML, page)
            # The JSON last: its presence means the report is complete.
            text = json.dumps(report, indent=2).encode() + b"\n"
            self.store.write_file(record.id, REPORT_JSON, text)
        except OSError as exc:  # a full or failing store: said, never a silent half-report
            for name in (REPORT_JSON, REPORT_HTML):
                with contextlib.suppress(Exception):
                    self.store.fs.rm(f"{self.store.session_dir(record.id)}/{name}")
            error = f"cannot write the report into the store {self.store.url}: {exc}"
            return self._failed(record, workload, error, seconds)
        with contextlib.suppress(OSError, FileNotFoundError):
            self.store.fs.rm(f"{self.store.session_dir(record.id)}/{ERROR_FILE}")
        top = (report.get("baseline") or {}).get("top_regression") or {}
        event = ReportEvent(
            record.id,
            record.run_id,
            workload,
            record.trigger,
            report["status"],
            report.get("finding_counts", {}),
            baseline.session_id if baseline else None,
            top.get("frame"),
            seconds=seconds,
            session_created=record.created.timestamp(),
        )
        self._record_verdict(
            record.id,
            {"status": event.status, "findings": event.findings, "file": REPORT_JSON},
        )
        self._count(event)
        if baseline is None and record.trigger != "alert" and converting is None:
            # (The session child wrote the side caches with its conversion already.)
            self._keep_sides(record.id)
        return event

    def _keep_sides(self, session_id: str) -> None:
        """Leave the session's sides beside its captures (``<capture>.sides.json.gz``), so
        that a later report compared against it loads them instead of decoding them.

        For a session that may become a baseline (an alert-started one is not chosen
        automatically; one compared already kept its sides in its comparison). A child of
        its own, after the report is written: it never delays or fails the report. Only
        on a local store: a remote session is read from a temporary copy, and no cache is
        written there (:func:`exporter.analysis.sides.cache.writable`).
        """
        local = self.store.local_dir(session_id)
        if local is None:
            return
        with tempfile.TemporaryDirectory(prefix="mlprof-sides-") as out:
            result = run_job(
                ["sides", str(local), out], self.settings.timeout_s, self.settings.max_memory_mb
            )
        if not result.ok:  # only the next comparison against it is slower
            log.warning("session %s: side cache not written: %s", session_id, result.error)

    def _record_verdict(self, session_id: str, verdict: dict[str, Any]) -> None:
        """The verdict in ``session.json`` too: session lists show it without the report."""

        def change(record: SessionRecord) -> None:
            record.report = verdict

        try:
            self.store.update_record(session_id, change)
        except (OSError, ValueError) as exc:  # the report itself is written: not fatal
            log.warning("session %s: cannot record the report's verdict: %s", session_id, exc)

    def _failed(
        self, record: SessionRecord, workload: str | None, error: str, seconds: float
    ) -> ReportEvent:
        log.warning("report of session %s failed: %s", record.id, error)
        body = {
            "status": "error",
            "error": error,
            "seconds": round(seconds, 3),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with contextlib.suppress(OSError, ValueError):
            self.store.write_file(record.id, ERROR_FILE, json.dumps(body).encode() + b"\n")
        event = ReportEvent(
            record.id,
            record.run_id,
            workload,
            record.trigger,
            "error",
            {},
            None,
            None,
            error=error,
            seconds=seconds,
            session_created=record.created.timestamp(),
        )
        self._record_verdict(record.id, {"status": "error", "error": error})
        self._count(event)
        return event

    def _count(self, event: ReportEvent) -> None:
        self.written += event.status != "error"
        if self._counter is not None:
            self._counter.add(1, {"status": event.status})
        if event.status != "error":
            key = (event.run_id or "", event.workload or "")
            counts = {p: int(event.findings.get(p, 0)) for p in ("P0", "P1", "P2")}
            with self._lock:
                known = self._findings.get(key)
                if known is None or event.session_created >= known[0]:
                    self._findings.pop(key, None)
                    self._findings[key] = (event.session_created, counts)
                while len(self._findings) > MAX_RUNS_EXPORTED:
                    self._findings.popitem(last=False)
        for callback in list(self.on_report):
            try:
                callback(event)
            except Exception:  # one listener's failure never stops the others
                log.exception("report callback %r failed for %s", callback, event.session_id)

    def _observe_findings(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        with self._lock:
            items = list(self._findings.items())
        for (run_id, workload), (_, counts) in items:
            for priority, count in counts.items():
                yield Observation(
                    count, {"run_id": run_id, "workload": workload, "priority": priority}
                )

    # -- inputs ------------------------------------------------------------------
    @contextlib.contextmanager
    def _local_session(self, session_id: str, names: list[str]) -> Iterator[Path]:
        local = self.store.local_dir(session_id)
        if local is not None:
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="mlprof-session-") as tmp:
            # A copy in the store's layout, its record beside: the child writes each
            # capture's side cache there, and the report it makes next loads it
            # (analysis.sides.cache.writable) instead of decoding the capture again.
            copy = Path(tmp) / "plugins" / "profile" / session_id
            copy.mkdir(parents=True)
            with contextlib.suppress(OSError, ValueError):  # no record: no cache, still read
                self.store.copy_file(session_id, "session.json", copy / "session.json")
            for name in names:  # streamed to disk: a capture is never whole in memory
                self.store.copy_file(session_id, name, copy / name)
            yield copy

    def _history_dirs(self, record: SessionRecord, compared: set[str]) -> list[Path]:
        """The workload's earlier sessions whose captures give each frame's spread, but
        the ``compared`` ones: on a local store only (on a bucket each would be copied
        first; there the reports' median steps alone judge the step time,
        ``--history-ns``), and only those whose sides are cached beside their captures,
        up to :data:`HISTORY_MAX_CACHE_BYTES` in all: the report reads each run's
        cache, never decodes an earlier capture (ten 373 MB captures would be minutes)."""
        from exporter.analysis.sides import cache as side_cache

        found: list[Path] = []
        budget = HISTORY_MAX_CACHE_BYTES
        for sid in self.baselines.history_sessions(record, exclude=compared):
            directory, earlier = self.store.local_dir(sid), self.store.read_record(sid)
            if directory is None or earlier is None:
                continue
            names = [n for t in earlier.targets for n in t.files if _analysed(n)]
            caches = [side_cache.cache_path(directory / n) for n in names]
            try:
                size = sum(c.stat().st_size for c in caches) if caches else -1
            except OSError:  # a capture without its cache: it would be decoded
                continue
            if 0 <= size <= budget:
                found.append(directory)
                budget -= size
        return found if len(found) >= MIN_HISTORY else []

    @contextlib.contextmanager
    def _local_baseline(self, session_id: str | None) -> Iterator[Path | None]:
        if session_id is None:
            yield None
            return
        record = self.store.read_record(session_id)
        names = [n for t in (record.targets if record else []) for n in t.files if _analysed(n)]
        if not names:
            yield None
            return
        with self._local_session(session_id, names) as path:
            yield path

    def _memory_samples(self, record: SessionRecord) -> list[dict[str, Any]]:
        """The run's newest device memory samples (``kind: memory`` step-log lines).

        The step logs are the workload's: each is read as a bounded tail
        (MEMORY_TAIL_BYTES) of a regular file, never a link, nor under a linked
        ``steps/``, never blocking on a FIFO (which wedged every later report).
        """
        if self.shared_dir is None or not record.run_id:
            return []
        from exporter import schema

        steps = self.shared_dir / schema.STEPS_DIR
        try:
            directory = open_directory(steps, below=self.shared_dir)
        except OSError:  # none yet, or steps/ is a link elsewhere: no samples
            return []
        try:
            with os.scandir(directory) as listing:
                names = sorted(e.name for e in listing if e.name.endswith(schema.STEP_LOG_SUFFIX))
        finally:
            os.close(directory)
        newest: dict[str, Any] | None = None
        for name in names:
            try:
                tail = read_tail(steps / name, MEMORY_TAIL_BYTES, below=self.shared_dir)
            except OSError:  # a link, a FIFO, gone: not this run's samples
                continue
            for line in tail.decode("utf-8", errors="replace").splitlines():
                if '"memory"' not in line:
                    continue
                try:
                    entry = load_json(line, "step-log line")
                except ValueError:
                    continue
                if (
                    isinstance(entry, dict)
                    and entry.get("kind") == schema.KIND_MEMORY
                    and entry.get("run_id") == record.run_id
                    and (newest is None or entry.get("time", 0) >= newest.get("time", 0))
                ):
                    newest = entry
        devices = newest.get("devices") if newest else None
        return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []

    def _links(self, record: SessionRecord, workload: str | None) -> dict[str, str]:
        base = self.settings.api_base.rstrip("/")
        links = {
            "session": f"{base}/api/v1/captures/{quote(record.id)}",
            "report (JSON)": f"{base}/api/v1/sessions/{quote(record.id)}/report?format=json",
        }
        grafana = self.settings.grafana_url
        if grafana:
            params = {"var-run_id": record.run_id or "", "var-workload": workload or ""}
            links["Grafana dashboard"] = (
                f"{grafana.rstrip('/')}/d/{DASHBOARD_UID}/?{urlencode(params)}"
            )
            if self.settings.pyroscope_url is None:
                selector = f'{{service_name="{workload or ""}",run_id="{record.run_id or ""}"}}'
                links["Pyroscope (in Grafana)"] = (
                    f"{grafana.rstrip('/')}/explore?{urlencode({'left': selector})}"
                )
        if self.settings.pyroscope_url:
            query = (
                f"device:device_time:nanoseconds:device_time:nanoseconds"
                f'{{service_name="{workload or ""}",run_id="{record.run_id or ""}"}}'
            )
            links["Pyroscope"] = (
                f"{self.settings.pyroscope_url.rstrip('/')}/?{urlencode({'query': query})}"
            )
        return links

    def close(self) -> None:
        """Stop after the report in progress; queued sessions are dropped (and cancelled)."""
        while True:
            try:
                _, _, _, future = self._queue.get_nowait()
            except queue.Empty:
                break
            future.cancel()
        self._queue.put((-1, -1, "", Future()))


def _run_info(shared_dir: Path, record: SessionRecord) -> dict[str, Any] | None:
    """The identity file of the record's run in the shared dir (``runs/<run_id>.json``)."""
    from exporter import schema

    run_id = record.run_id or next((t.run_id for t in record.targets if t.run_id), None)
    if not run_id:
        return None
    try:
        path = shared_dir / schema.RUNS_DIR / f"{run_id}.json"
        # The workload's file: regular, no link under the shared dir, bounded.
        data = read_regular(path, MAX_RUN_FILE_BYTES, below=shared_dir)
        return load_json_object(data, str(path))
    except (OSError, ValueError, TypeError):
        return None


def workload_from_shared_dir(shared_dir: Path) -> Callable[[SessionRecord], str | None]:
    """A record's workload: its own, else the name in the run's identity file."""

    def workload_of(record: SessionRecord) -> str | None:
        if record.workload:
            return record.workload
        info = _run_info(shared_dir, record)
        return str(info["name"]) if info is not None and "name" in info else None

    return workload_of


def config_from_shared_dir(shared_dir: Path) -> Callable[[SessionRecord], str | None]:
    """A record's configuration fingerprint: its own, else the run's identity file's,
    when the record took its workload from there too (a target found by DNS, k8s or a
    static list carries no run file's identity)."""
    from exporter.capture.fingerprints import fingerprint_of

    def config_of(record: SessionRecord) -> str | None:
        if record.config_fingerprint or record.workload:
            return record.config_fingerprint
        info = _run_info(shared_dir, record)
        return fingerprint_of(info) if info is not None else None

    return config_of


def report_worker_from_settings(
    settings: Settings, store: SessionStore, meter: Meter | None = None
) -> ReportWorker:
    """The sidecar's worker (its metrics exist even when ``MLPROF_REPORTS=false``)."""
    return ReportWorker(
        store,
        ReportSettings(
            enabled=settings.reports,
            timeout_s=settings.report_timeout_s,
            max_memory_mb=settings.report_max_memory_mb,
            xprof=settings.report_xprof,
            grafana_url=settings.grafana_url,
            pyroscope_url=settings.pyroscope_url,
            api_base=f"http://{settings.listen}",
        ),
        shared_dir=settings.shared_dir,
        workload_of=workload_from_shared_dir(settings.shared_dir),
        config_of=config_from_shared_dir(settings.shared_dir),
        meter=meter,
    )
