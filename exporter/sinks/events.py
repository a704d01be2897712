"""Run events (run started, capture finished, alert received, …) as log entries.

One schema for every event (``docs/events.md``): a ``type`` from :data:`EVENT_TYPES`,
a ``severity`` (Cloud Logging's names), a one-line ``message``, the run identity
(``run_id``, ``workload``, ``host``, ``session_id``; each only when known) and ``data``,
the type's own fields. ``MLPROF_EVENTS`` picks where they go:

``off``
    nowhere (still counted in ``mlprof_events_total{type}``);
``log``
    one JSON object per line on stderr;
``cloud-logging-structured``
    google-cloud-logging's ``StructuredLogHandler`` format on stdout, which GKE's logging
    agent turns into entries: severity and labels in its special fields;
``cloud-logging-api``
    ``entries:write`` through google-cloud-logging's client, from a bounded queue
    drained by one thread: emitting never blocks; what does not fit, or fails after
    retries, is counted in ``mlprof_events_dropped_total{sink}``.

>>> events = LogEvents()
>>> events.emit("run_started", "run r1 of trainer started", run_id="r1",
...             workload="trainer", host="h0", pid=7)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

from opentelemetry.metrics import Meter

from exporter.config import EVENT_SINKS
from exporter.errors import ConfigError

if TYPE_CHECKING:
    from exporter.config import Settings

__all__ = [
    "EVENT_SINKS",
    "EVENT_TYPES",
    "SEVERITIES",
    "ApiEvents",
    "Emit",
    "Event",
    "EventSink",
    "LogEvents",
    "StructuredEvents",
    "Throttle",
    "events_from_settings",
    "no_events",
    "report_written",
]

log = logging.getLogger(__name__)

# Event type -> default severity (an emitter may raise it: a failed capture is ERROR).
EVENT_TYPES: Final[Mapping[str, str]] = {
    "run_started": "INFO",
    "run_ended": "INFO",
    "capture_requested": "INFO",
    "capture_finished": "INFO",
    "alert_received": "INFO",
    "report_written": "INFO",
    "profile_push_failed": "WARNING",
    "spool_overflow": "ERROR",
    "source_error": "WARNING",
}
# Cloud Logging LogSeverity names that are also Python logging level names, so the
# structured handler (which writes the record's level name) keeps them as they are.
SEVERITIES: Final[Mapping[str, int]] = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
IDENTITY: Final = ("run_id", "workload", "host", "session_id")
DEFAULT_LOG_NAME: Final = "mlprof-events"
LABEL_VALUE_MAX: Final = 1024  # Cloud Logging allows more; identities are far shorter


class Emit(Protocol):
    """What emitting modules are given: ``emit(kind, message, **identity_and_data)``.

    ``kind`` is the event's ``type``; keyword arguments other than the identity and
    ``severity`` become its ``data``.
    """

    def __call__(
        self,
        kind: str,
        message: str = "",
        /,
        *,
        severity: str | None = None,
        run_id: str | None = None,
        workload: str | None = None,
        host: str | None = None,
        session_id: str | None = None,
        **data: Any,
    ) -> None: ...


def no_events(kind: str, message: str = "", /, **fields: Any) -> None:
    """The default ``emit`` of components built without an event sink."""


@dataclass(frozen=True)
class Event:
    """One event; :meth:`payload` is the schema's JSON object without ``severity``/``time``."""

    type: str
    severity: str
    message: str
    time: float
    identity: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, **self.identity, "data": self.data}

    def labels(self) -> dict[str, str]:
        """Cloud Logging labels: the type and the identity, for filters like labels.run_id."""
        identity = {k: v[:LABEL_VALUE_MAX] for k, v in self.identity.items()}
        return {"event_type": self.type, **identity}

    def as_json(self) -> dict[str, Any]:
        """The ``log`` form: the payload with ``time`` (RFC 3339) and ``severity``."""
        stamp = datetime.fromtimestamp(self.time, UTC).isoformat(timespec="milliseconds")
        return {"time": stamp.replace("+00:00", "Z"), "severity": self.severity, **self.payload()}


def _jsonable(value: Any) -> Any:
    """Data values as JSON has them (datetimes as RFC 3339, other objects as text)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


class Throttle:
    """At most one event per key per ``interval_s``; ``allow`` says how many were held back."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> int | None:
        """None to hold this one back, else the count held back since the last allowed."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            if len(self._last) > 1000:  # keys are reasons: bound them all the same
                self._last.clear()
            self._last[key] = now
            return self._held.pop(key, 0)


class EventSink:
    """Base of the sinks: builds, counts and hands events to :meth:`write`.

    ``emit`` never raises and never blocks on I/O beyond a local write: events come from
    the capture engine, the API and background loops.
    """

    name = "off"

    def __init__(self, meter: Meter | None = None) -> None:
        self._emitted = self._dropped = None
        if meter is not None:
            self._emitted = meter.create_counter(
                "mlprof.events", unit="{event}", description="Events emitted, by type."
            )
            self._dropped = meter.create_counter(
                "mlprof.events.dropped",
                unit="{event}",
                description="Events lost by the event sink (queue full or delivery failed).",
            )
            for kind in EVENT_TYPES:
                self._emitted.add(0, {"type": kind})  # series exist before the first event
            self._dropped.add(0, {"sink": self.name})

    def emit(
        self,
        kind: str,
        message: str = "",
        /,
        *,
        severity: str | None = None,
        run_id: str | None = None,
        workload: str | None = None,
        host: str | None = None,
        session_id: str | None = None,
        **data: Any,
    ) -> None:
        """Record one event of type ``kind`` (one of :data:`EVENT_TYPES`)."""
        if kind not in EVENT_TYPES:
            log.error("unknown event type %r dropped (expected one of %s)", kind, list(EVENT_TYPES))
            return
        level = severity if severity is not None and severity in SEVERITIES else EVENT_TYPES[kind]
        known = {"run_id": run_id, "workload": workload, "host": host, "session_id": session_id}
        event = Event(
            type=kind,
            severity=level,
            message=message or kind.replace("_", " "),
            time=time.time(),
            identity={k: str(v) for k, v in known.items() if v},
            data={k: _jsonable(v) for k, v in data.items() if v is not None},
        )
        if self._emitted is not None:
            self._emitted.add(1, {"type": kind})
        try:
            self.write(event)
        except Exception:  # an event must never break what emitted it
            log.exception("event sink %s failed to write a %s event", self.name, kind)
            self.count_dropped(1)

    def count_dropped(self, n: int) -> None:
        if self._dropped is not None and n:
            self._dropped.add(n, {"sink": self.name})

    def write(self, event: Event) -> None:
        """Deliver one event (the ``off`` sink delivers nothing)."""

    def close(self) -> None:
        """Flush what is pending (bounded in time) and stop."""


class LogEvents(EventSink):
    """``log``: one JSON object per line (default stderr)."""

    name = "log"

    def __init__(self, meter: Meter | None = None, stream: IO[str] | None = None) -> None:
        super().__init__(meter)
        self.stream = stream
        self._lock = threading.Lock()

    def write(self, event: Event) -> None:
        line = json.dumps(event.as_json(), separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            out = self.stream or sys.stderr
            out.write(line + "\n")
            out.flush()


class StructuredEvents(EventSink):
    """``cloud-logging-structured``: google-cloud-logging's StructuredLogHandler on stdout.

    Each line is the JSON GKE's logging agent parses into an entry: ``severity`` and
    ``logging.googleapis.com/labels`` are its special fields, the rest is the payload.
    """

    name = "cloud-logging-structured"

    def __init__(
        self,
        meter: Meter | None = None,
        stream: IO[str] | None = None,
        project: str | None = None,
    ) -> None:
        super().__init__(meter)
        from google.cloud.logging_v2.handlers import StructuredLogHandler

        # A private logger: events never reach the root logger's handlers (or theirs us).
        self._logger = logging.Logger("mlprof.events", logging.DEBUG)
        handler = StructuredLogHandler(  # type: ignore[no-untyped-call]
            stream=stream or sys.stdout, project_id=project
        )
        self._logger.addHandler(handler)

    def write(self, event: Event) -> None:
        payload = event.payload()
        message = payload.pop("message")
        self._logger.log(
            SEVERITIES[event.severity],
            message,
            extra={"json_fields": payload, "labels": event.labels()},
        )


class ApiEvents(EventSink):
    """``cloud-logging-api``: batches of entries through google-cloud-logging's client.

    ``client_factory`` builds the client on the sender thread (credential lookup and
    resource detection may take seconds). ``emit`` only puts on a queue of
    ``queue_size``; a full queue drops (counted). The sender retries a failed batch
    ``attempts`` times with backoff, then drops it (counted, logged).
    """

    name = "cloud-logging-api"

    def __init__(
        self,
        client_factory: Callable[[], Any],
        meter: Meter | None = None,
        log_name: str = DEFAULT_LOG_NAME,
        queue_size: int = 1000,
        batch_size: int = 100,
        flush_interval_s: float = 1.0,
        attempts: int = 3,
        backoff_s: float = 1.0,
        resource: Any = None,
        close_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(meter)
        self.close_timeout_s = close_timeout_s
        self._factory = client_factory
        self.log_name = log_name
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._resource = resource
        self._logger: Any = None
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=max(1, queue_size))
        self._stop = threading.Event()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="mlprof-events", daemon=True)
        self._thread.start()

    def write(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.count_dropped(1)

    def _cloud_logger(self) -> Any:
        if self._logger is None:
            client = self._factory()
            if self._resource is None:
                self._logger = client.logger(self.log_name)  # resource detected here
            else:
                self._logger = client.logger(self.log_name, resource=self._resource)
        return self._logger

    def _send(self, events: list[Event]) -> None:
        logger = self._cloud_logger()
        batch = logger.batch()
        for event in events:
            batch.log_struct(
                event.payload(),
                severity=event.severity,
                labels=event.labels(),
                timestamp=datetime.fromtimestamp(event.time, UTC),
                resource=logger.default_resource,  # entries default to a label-less global
            )
        batch.commit()

    def _deliver(self, events: list[Event]) -> None:
        error: Exception | None = None
        for attempt in range(self.attempts):
            if attempt and self._stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                break  # closing: no more waiting
            try:
                self._send(events)
            except Exception as exc:  # the API, the network or credentials: retry
                error = exc
                continue
            self.sent += len(events)
            return
        log.warning("Cloud Logging: %d events dropped: %s", len(events), error)
        self.count_dropped(len(events))

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            try:
                first = self._queue.get(timeout=self.flush_interval_s)
            except queue.Empty:
                continue
            events = [first]
            while len(events) < self.batch_size:
                try:
                    events.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._deliver(events)

    def close(self) -> None:
        """Send what is queued for up to ``close_timeout_s``; the rest is counted as dropped."""
        self._stop.set()
        self._thread.join(self.close_timeout_s)
        left = self._queue.qsize()
        if self._thread.is_alive() or left:
            self.count_dropped(left)


def report_written(
    emit: Emit,
    *,
    session_id: str,
    status: str,
    findings: Mapping[str, int],
    run_id: str | None = None,
    workload: str | None = None,
    host: str | None = None,
    files: list[str] | None = None,
) -> None:
    """Emit ``report_written`` for an analysis report (``status`` OPTIMAL/NEEDS_ATTENTION/error).

    ``findings`` counts findings per priority (P0, P1, P2). Severity: INFO when
    OPTIMAL, WARNING when NEEDS_ATTENTION, ERROR when the analysis failed.
    """
    severity = {"OPTIMAL": "INFO", "NEEDS_ATTENTION": "WARNING"}.get(status, "ERROR")
    counts = {p: int(findings.get(p, 0)) for p in ("P0", "P1", "P2")}
    summary = ", ".join(f"{n} {p}" for p, n in counts.items() if n) or "no findings"
    emit(
        "report_written",
        f"report of session {session_id}: {status} ({summary})",
        severity=severity,
        session_id=session_id,
        run_id=run_id,
        workload=workload,
        host=host,
        status=status,
        findings=counts,
        files=files,
    )


def _api_client(settings: Settings) -> Callable[[], Any]:
    def build() -> Any:
        from google.cloud import logging as cloud_logging

        endpoint = settings.events_api_endpoint
        options = {"api_endpoint": endpoint} if endpoint else None
        return cloud_logging.Client(  # type: ignore[no-untyped-call]
            project=settings.events_project, client_options=options
        )

    return build


def events_from_settings(settings: Settings, meter: Meter | None = None) -> EventSink:
    """The sink ``MLPROF_EVENTS`` names (``off`` by default).

    Raises ConfigError when a Cloud Logging form is asked for without the library.
    """
    kind = settings.events
    if kind.startswith("cloud-logging"):
        try:
            import google.cloud.logging_v2  # noqa: F401 - only checking it is there
        except ImportError:
            raise ConfigError(
                f"MLPROF_EVENTS={kind} needs google-cloud-logging: "
                "pip install 'mlprof-exporter[gcp]'"
            ) from None
    if kind == "log":
        return LogEvents(meter)
    if kind == "cloud-logging-structured":
        return StructuredEvents(meter, project=settings.events_project)
    if kind == "cloud-logging-api":
        return ApiEvents(
            _api_client(settings),
            meter,
            log_name=settings.events_log_name,
            queue_size=settings.events_queue_size,
        )
    return EventSink(meter)
