"""Push flame graphs to Grafana Pyroscope (``/push.v1.PusherService/Push``, Connect).

Each push is one ``PushRequest`` with one series: labels plus the gzip pprof of the
flame graph, sent as ``application/proto`` with a gzip-compressed body. Profiles are
fitted to the server's default limits first (depth, samples, size, labels) by
truncation into ``other`` nodes, never by being refused. Transient failures (network,
5xx, 429) are retried with backoff and then spooled on disk; the spool drains when the
server answers again. Other 4xx answers are permanent: recorded with the server's
message and not retried.

>>> sink = PyroscopeSink("http://127.0.0.1:4040")  # doctest: +SKIP
>>> sink.push(graph, profile_labels("trainer", run_id="r1", host="h0",
...           trigger="manual", profile_source="xprof_device"))  # doctest: +SKIP
PushResult(status='ok', ...)
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import gzip
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import httpx
from google.protobuf.message import DecodeError
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from exporter import schema
from exporter.config import Settings, redact_url
from exporter.errors import ConfigError
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.pprof import decode_pprof, to_pprof
from exporter.proto import profile_pb2, pyroscope_push_pb2
from exporter.sinks.events import Emit, Throttle, no_events
from exporter.sinks.spool import Spool, SpoolItem

__all__ = [
    "PUSH_PATH",
    "PushResult",
    "PyroscopeLimits",
    "PyroscopeSink",
    "Rejection",
    "basic_auth",
    "decode_push",
    "fit_to_limits",
    "profile_labels",
    "request_headers",
    "sink_from_settings",
    "validate_labels",
]

log = logging.getLogger(__name__)

PUSH_PATH = "/push.v1.PusherService/Push"
SINK_NAME = "pyroscope"
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
SESSION_ID_RE = re.compile(r"^[0-9a-f]{16}$")  # Pyroscope's __session_id__ format
TRIGGERS = frozenset(schema.TRIGGERS)
# torch_*: the graphs of a torch.profiler trace (exporter.profiles.torch_trace.TRACE_SOURCES).
PROFILE_SOURCES = frozenset({"xprof_device", "xprof_host", "device_memory",
                             "torch_device", "torch_host", "torch_memory"})  # fmt: skip
# Pyroscope drops profiles older than its ingestion window (default 1 h); a spooled
# profile older than this is re-stamped to now, with the capture time in a comment.
RESTAMP_AFTER_NS = 50 * 60 * 1_000_000_000
# While Pyroscope is down every profile is spooled: one event a minute (with the count
# of those not reported) tells the story without flooding the log.
PUSH_FAILED_EVENT_INTERVAL_S = 60.0

Status = Literal["ok", "spooled", "rejected", "dropped"]


@dataclass(frozen=True)
class PyroscopeLimits:
    """Pyroscope's default per-tenant limits (``pkg/validation/limits.go``)."""

    max_profile_bytes: int = 4 * 1024 * 1024  # max_profile_size_bytes, uncompressed
    max_samples: int = 16_000  # max_profile_stacktrace_samples
    max_depth: int = 1000  # max_profile_stacktrace_depth
    max_labels: int = 30  # max_label_names_per_series
    max_label_name_length: int = 1024
    max_label_value_length: int = 2048


@dataclass(frozen=True)
class PushResult:
    """Outcome of one push: ``ok``, ``spooled``, ``rejected`` (4xx) or ``dropped``."""

    status: Status
    message: str = ""
    http_status: int | None = None
    attempts: int = 0


@dataclass(frozen=True)
class Rejection:
    """A profile the server refused for good, with the server's own message."""

    time: float
    labels: dict[str, str]
    http_status: int
    message: str


def profile_labels(
    service_name: str,
    *,
    run_id: str,
    host: str,
    trigger: str,
    profile_source: str,
    session_id: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The labels of a pushed profile (``__name__`` is added from the flame graph).

    A session id in Pyroscope's own format (16 hex digits) goes into ``__session_id__``;
    any other into ``session_id``. ``trigger`` must be one of :data:`TRIGGERS` and
    ``profile_source`` one of :data:`PROFILE_SOURCES` (ValueError otherwise): dashboards
    select on them and a free-form value would add series. Callers passing values a
    workload wrote (e.g. the memory watcher) map unknown ones first.
    """
    if trigger not in TRIGGERS:
        raise ValueError(f"label trigger={trigger!r}: expected one of {sorted(TRIGGERS)}")
    if profile_source not in PROFILE_SOURCES:
        raise ValueError(
            f"label profile_source={profile_source!r}: expected one of {sorted(PROFILE_SOURCES)}"
        )
    labels = {
        "service_name": service_name,
        "run_id": run_id,
        "host": host,
        "trigger": trigger,
        "profile_source": profile_source,
        **(extra or {}),
    }
    if session_id:
        key = "__session_id__" if SESSION_ID_RE.fullmatch(session_id) else "session_id"
        labels[key] = session_id
    return labels


def validate_labels(labels: Mapping[str, str], limits: PyroscopeLimits) -> None:
    """Raise ValueError on labels Pyroscope would refuse."""
    if "__name__" not in labels or not labels["__name__"]:
        raise ValueError("labels: __name__ is required")
    if len(labels) > limits.max_labels:
        raise ValueError(f"labels: {len(labels)} labels, Pyroscope accepts {limits.max_labels}")
    for name, value in labels.items():
        if not LABEL_NAME_RE.fullmatch(name) or len(name) > limits.max_label_name_length:
            raise ValueError(f"label name {name!r}: expected [a-zA-Z_][a-zA-Z0-9_]*")
        if len(value) > limits.max_label_value_length:
            raise ValueError(f"label {name}: value longer than {limits.max_label_value_length}")


def _sample_count(graph: FlameGraph) -> int:
    return sum(1 for _, node in graph.paths() if node.self_value)


def _fit_one(graph: FlameGraph, limits: PyroscopeLimits) -> FlameGraph:
    fitted = graph
    if fitted.max_depth > limits.max_depth:
        fitted = fitted.depth_limited(limits.max_depth)
    if _sample_count(fitted) > limits.max_samples:
        fitted = fitted.truncated(limits.max_samples)
    budget = fitted.node_count
    size = len(to_pprof(fitted).SerializeToString())
    while size > limits.max_profile_bytes and budget > 1:
        budget = max(1, int(budget * min(0.9, limits.max_profile_bytes / size)))
        fitted = graph.truncated(budget)
        if fitted.max_depth > limits.max_depth:
            fitted = fitted.depth_limited(limits.max_depth)
        size = len(to_pprof(fitted).SerializeToString())
    return fitted


def fit_to_limits(graph: FlameGraph, limits: PyroscopeLimits) -> tuple[bytes, FlameGraph]:
    """Serialized (uncompressed) pprof of ``graph`` within ``limits``, and the graph used.

    Deep stacks are cut at ``max_depth``; too many samples or bytes fold the smallest
    subtrees into ``other`` nodes (totals unchanged). A graph with companions (other
    sample types, e.g. ``inuse_objects``) is pushed as one pprof with all its sample
    types, which Pyroscope stores as one series per sample type
    (``pkg/phlaredb/labels/labels.go``, ``CreateProfileLabels``); each part is fitted
    to an equal share of the limits.
    """
    parts = [graph, *graph.companions]
    share = dataclasses.replace(
        limits,
        max_profile_bytes=limits.max_profile_bytes // len(parts),
        max_samples=limits.max_samples // len(parts),
    )
    fitted, *companions = [_fit_one(dataclasses.replace(p, companions=[]), share) for p in parts]
    if companions:
        fitted = dataclasses.replace(fitted, companions=companions)
    return to_pprof(fitted).SerializeToString(), fitted


def _connect_message(response: httpx.Response) -> str:
    """The ``message`` of a Connect error body, else the body text."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return response.text[:500]


class _TransientError(Exception):
    """A failure worth retrying (network, 5xx, 429)."""


class _PermanentError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class PyroscopeSink:
    """Pushes flame graphs to one Pyroscope server, with retry, backoff and a spool.

    ``meter`` publishes ``mlprof.profile.pushes`` (by ``sink`` and ``status``) and
    ``mlprof.spool.size``. ``sleep`` is injectable so tests need not wait.
    """

    def __init__(
        self,
        url: str,
        *,
        spool: Spool | None = None,
        meter: Meter | None = None,
        tenant: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        limits: PyroscopeLimits | None = None,
        attempts: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Pyroscope URL {redact_url(url)!r}: expected http:// or https://")
        self.url = url.rstrip("/")
        self.spool = spool
        self.limits = limits or PyroscopeLimits()
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.rejections: collections.deque[Rejection] = collections.deque(maxlen=100)
        self._sleep = sleep
        # Events (profile_push_failed, spool_overflow); the sidecar sets its event sink.
        self.emit: Emit = no_events
        self._throttle = Throttle(PUSH_FAILED_EVENT_INTERVAL_S)
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        headers = {
            "Content-Type": "application/proto",
            "Content-Encoding": "gzip",
            "Connect-Protocol-Version": "1",
            "User-Agent": "mlprof-exporter",
        }
        if tenant:
            headers["X-Scope-OrgID"] = tenant
        self._client = httpx.Client(
            headers=headers,
            auth=httpx.BasicAuth(*basic_auth) if basic_auth else None,
            timeout=timeout_s,
            transport=transport,
        )
        self._pushes = None
        if meter is not None:
            self._pushes = meter.create_counter(
                "mlprof.profile.pushes",
                unit="{profile}",
                description="Profile pushes by sink and status.",
            )
            meter.create_observable_gauge(
                "mlprof.spool.size",
                callbacks=[self._observe_spool],
                unit="By",
                description="Bytes of profiles waiting in the spool to be pushed.",
            )

        if spool is not None and spool.in_doubt:
            # Killed with these pushes in flight: Pyroscope may have them; resent, it
            # would count them twice. Dropped and counted instead (at most once).
            log.warning(
                "%d spooled profiles were being pushed when the sidecar stopped; not sent "
                "again (Pyroscope may have them and would count them twice): %s",
                len(spool.in_doubt), ", ".join(i.name for i in spool.in_doubt),
            )  # fmt: skip
            self._count("dropped", len(spool.in_doubt))
            spool.in_doubt = []

    # -- metrics ---------------------------------------------------------------------
    def _observe_spool(self, options: CallbackOptions) -> Iterable[Observation]:
        size = self.spool.size_bytes if self.spool is not None else 0
        return [Observation(size, {"sink": SINK_NAME})]

    def _count(self, status: str, n: int = 1) -> None:
        if self._pushes is not None and n:
            self._pushes.add(n, {"sink": SINK_NAME, "status": status})

    # -- building --------------------------------------------------------------------
    def build_request(
        self, graph: FlameGraph, labels: Mapping[str, str]
    ) -> pyroscope_push_pb2.PushRequest:
        """A PushRequest for ``graph`` with ``labels`` (plus ``__name__``), within limits."""
        full = {"__name__": graph.profile_name, **labels}
        validate_labels(full, self.limits)
        raw, _ = fit_to_limits(graph, self.limits)
        request = pyroscope_push_pb2.PushRequest()
        series = request.series.add()
        for name in sorted(full):
            series.labels.add(name=name, value=full[name])
        sample = series.samples.add()
        sample.raw_profile = gzip.compress(raw, compresslevel=6, mtime=0)
        return request

    # -- sending ---------------------------------------------------------------------
    def _send(self, body: bytes) -> None:
        try:
            response = self._client.post(
                self.url + PUSH_PATH, content=gzip.compress(body, compresslevel=1, mtime=0)
            )
        except httpx.HTTPError as exc:
            # An httpx message may quote the URL, and the URL may carry user:password@.
            raise _TransientError(redact_url(f"{type(exc).__name__}: {exc}")) from None
        if response.is_success:
            return
        message = _connect_message(response)
        if response.status_code == 429 or response.status_code >= 500:
            raise _TransientError(f"HTTP {response.status_code}: {message}")
        raise _PermanentError(response.status_code, message)

    def _backoff(self, attempt: int) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * (2.0**attempt))
        return delay * (0.5 + random.random() / 2)  # jitter: hosts don't retry in step

    def _reject(self, labels: Mapping[str, str], error: _PermanentError) -> PushResult:
        log.warning(
            "Pyroscope refused a profile %s: HTTP %s %s", dict(labels), error.status, error.message
        )
        self.rejections.append(Rejection(time.time(), dict(labels), error.status, error.message))
        self._count("rejected")
        self._event("rejected", labels, f"HTTP {error.status}: {error.message}")
        return PushResult("rejected", error.message, error.status)

    def push(self, graph: FlameGraph, labels: Mapping[str, str]) -> PushResult:
        """Push one flame graph; retry transient failures, then spool what is left."""
        return self._deliver(self.build_request(graph, labels), self.attempts)

    def forward(self, request: pyroscope_push_pb2.PushRequest) -> PushResult:
        """Send a PushRequest received from an agent: one try now, then the spool.

        One try only: the agent waits for the answer (10 s at most) and its next upload
        follows; the spool's drain loop does the retrying, with backoff.
        """
        return self._deliver(request, 1)

    def _deliver(self, request: pyroscope_push_pb2.PushRequest, attempts: int) -> PushResult:
        body = request.SerializeToString()
        full = {pair.name: pair.value for pair in request.series[0].labels}
        last = ""
        for attempt in range(attempts):
            if attempt:
                self._sleep(self._backoff(attempt - 1))
            try:
                self._send(body)
            except _TransientError as exc:
                last = str(exc)
                continue
            except _PermanentError as exc:
                return self._reject(full, exc)
            self._count("ok")
            return PushResult("ok", attempts=attempt + 1)
        return self._spool(body, last, attempts, full)

    def _spool(
        self, body: bytes, reason: str, attempts: int, labels: Mapping[str, str]
    ) -> PushResult:
        if self.spool is None:
            log.error("Pyroscope push failed and no spool is configured: %s", reason)
            self._count("dropped")
            self._event("dropped", labels, f"{reason}; no spool configured")
            return PushResult("dropped", f"{reason}; no spool configured", attempts=attempts)
        put = self.spool.put(body)
        if put.evicted:
            log.error("spool full: dropped %d oldest profiles", len(put.evicted))
            self._count("dropped", len(put.evicted))
            self.emit(
                "spool_overflow",
                f"Pyroscope spool full: dropped the {len(put.evicted)} oldest profiles",
                dropped=len(put.evicted),
                spool_bytes=self.spool.size_bytes,
                max_bytes=self.spool.max_bytes,
            )
        if not put.stored:
            log.error("Pyroscope push failed and the spool refused it: %s", put.reason)
            self._count("dropped")
            self._event("dropped", labels, f"{reason}; {put.reason}")
            return PushResult("dropped", f"{reason}; {put.reason}", attempts=attempts)
        log.warning("Pyroscope push failed (%s); spooled for later", reason)
        self._count("spooled")
        self._event("spooled", labels, reason)
        return PushResult("spooled", reason, attempts=attempts)

    def _event(self, status: str, labels: Mapping[str, str], reason: str) -> None:
        """A ``profile_push_failed`` event; spooled ones at most once a minute per reason."""
        suppressed = 0
        if status == "spooled":
            allowed = self._throttle.allow(reason)
            if allowed is None:
                return
            suppressed = allowed
        self.emit(
            "profile_push_failed",
            f"Pyroscope push {status}: {reason}",
            severity="WARNING" if status == "spooled" else "ERROR",
            workload=labels.get("service_name"),
            run_id=labels.get("run_id"),
            host=labels.get("host"),
            session_id=labels.get("__session_id__") or labels.get("session_id"),
            status=status,
            reason=reason,
            profile=labels.get("__name__"),
            sink=SINK_NAME,
            suppressed=suppressed,
        )

    # -- the spool -----------------------------------------------------------------------
    @staticmethod
    def _restamp(body: bytes, now_ns: int) -> bytes:
        """Move profiles older than the ingestion window to now, noting the real time."""
        request = pyroscope_push_pb2.PushRequest()
        request.ParseFromString(body)
        changed = False
        for series in request.series:
            for sample in series.samples:
                profile = decode_pprof(sample.raw_profile)
                if profile.time_nanos and now_ns - profile.time_nanos > RESTAMP_AFTER_NS:
                    note = "mlprof: captured at " + time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(profile.time_nanos / 1e9)
                    )
                    profile.comment.append(len(profile.string_table))
                    profile.string_table.append(note)
                    profile.time_nanos = now_ns
                    sample.raw_profile = gzip.compress(
                        profile.SerializeToString(), compresslevel=6, mtime=0
                    )
                    changed = True
        return request.SerializeToString() if changed else body

    def drain(self, max_items: int | None = None) -> int:
        """Send spooled profiles oldest first; stop at the first transient failure.

        Returns how many were delivered.
        """
        if self.spool is None:
            return 0
        delivered = 0
        with self._drain_lock:
            for item in self.spool.items()[:max_items]:
                if not self._drain_one(item):
                    break
                delivered += 1
        return delivered

    def _drain_one(self, item: SpoolItem) -> bool:
        assert self.spool is not None
        try:
            body = self._restamp(self.spool.read(item), time.time_ns())
        except FileNotFoundError:
            return True
        except (OSError, DecodeError, ValueError) as exc:
            log.error("spooled profile %s is unreadable, dropping it: %s", item.name, exc)
            self.spool.remove(item)
            self._count("dropped")
            return True
        self.spool.sending(item)
        try:
            self._send(body)
        except _TransientError as exc:
            self.spool.not_sent(item)
            log.info("Pyroscope still unavailable (%s); %d profiles spooled", exc, len(self.spool))
            return False
        except _PermanentError as exc:
            request = pyroscope_push_pb2.PushRequest.FromString(body)
            labels = {p.name: p.value for s in request.series for p in s.labels}
            self._reject(labels, exc)
            self.spool.remove(item)
            return True
        self.spool.remove(item)
        self._count("ok")
        return True

    def start(self, interval_s: float = 10.0) -> None:
        """Drain the spool every ``interval_s`` seconds on a daemon thread."""
        if self._thread is not None or self.spool is None:
            return

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.drain()
                except Exception:  # the drain loop must outlive any one bad file
                    log.exception("draining the Pyroscope spool failed")

        self._thread = threading.Thread(target=run, name="mlprof-pyroscope-drain", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the drain thread and close the HTTP client."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._client.close()


def decode_push(body: bytes) -> list[tuple[dict[str, str], list[profile_pb2.Profile]]]:
    """(labels, profiles) per series of a serialized PushRequest."""
    request = pyroscope_push_pb2.PushRequest.FromString(body)
    return [
        (
            {p.name: p.value for p in series.labels},
            [decode_pprof(s.raw_profile) for s in series.samples],
        )
        for series in request.series
    ]


def basic_auth(settings: Settings) -> tuple[str, str] | None:
    """``(user, password)`` for Pyroscope's basic auth, or None without a user."""
    if not settings.pyroscope_user:
        return None
    password = settings.pyroscope_password
    return settings.pyroscope_user, password.get_secret_value() if password else ""


def request_headers(settings: Settings) -> dict[str, str]:
    """The credentials every request to Pyroscope carries: pushes (the sink, through
    httpx's own basic auth, which sends the same header) and queries (comparisons of
    ``pyroscope:`` sides from any door)."""
    headers: dict[str, str] = {}
    if settings.pyroscope_tenant:
        headers["X-Scope-OrgID"] = settings.pyroscope_tenant
    auth = basic_auth(settings)
    if auth is not None:
        token = base64.b64encode(":".join(auth).encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return headers


def sink_from_settings(settings: Settings, meter: Meter | None = None) -> PyroscopeSink | None:
    """The sidecar's sink: None when ``pyroscope_url`` is unset (Pyroscope off)."""
    if not settings.pyroscope_url:
        return None
    auth = basic_auth(settings)
    try:
        spool = Spool(settings.spool_dir, settings.spool_max_bytes)
    except OSError as exc:
        raise ConfigError(
            f"MLPROF_SPOOL_DIR={settings.spool_dir}: cannot create it ({exc.strerror or exc})"
        ) from None
    return PyroscopeSink(
        settings.pyroscope_url,
        spool=spool,
        meter=meter,
        tenant=settings.pyroscope_tenant,
        basic_auth=auth,
    )
