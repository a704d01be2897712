"""Host CPU profiles from inside the workload: pyroscope-io's sampling agent, tagged by phase.

``sdk.run(..., host_profiling=True)`` (or ``MLPROF_HOST_PROFILING=1``) starts Grafana's
Python agent (``pyroscope-io``, py-spy sampling in a native thread) with the run's
identity as labels, so the host CPU profile of a run sits beside its device-time and
memory profiles under one selector::

    process_cpu{service_name="<workload>", run_id="…", host="…", trigger="periodic",
                profile_source="pyspy_cpu"}

and every sample taken inside ``run.step()`` or ``run.phase(name)`` carries the pprof
sample label ``phase``. ``pyroscope`` is imported only when host profiling is on.

Where profiles go (first that applies):

1. ``HostProfiling(server_address=…)`` or ``$MLPROF_HOST_PROFILING_URL``;
2. ``$MLPROF_PYROSCOPE_URL`` when the workload can open a TCP connection to it (with
   ``$MLPROF_PYROSCOPE_USER``/``_PASSWORD``/``_TENANT``, as the sidecar reads them);
3. the sidecar, whose address is in ``<shared_dir>/sidecar/ingest.json`` (written when
   the sidecar pushes to Pyroscope); it forwards through its spool and retries, with its
   own credentials. ``$MLPROF_AUTH_TOKEN`` is sent as a bearer token when set.

Until one is found the SDK looks again every second from its flusher thread, so a
workload that starts before its sidecar is profiled once the sidecar is up.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from exporter import schema
from exporter.ascii_digits import parse_ascii_int

__all__ = [
    "Destination",
    "HostProfiler",
    "HostProfiling",
    "check_phase",
    "find_destination",
    "options_from_env",
]

ENV_PREFIX = schema.HOST_PROFILING_ENV + "_"
# py-spy samples each thread's Python stack this many times a second; 100 Hz is the
# agent's default and costs well under 1 % of a core (see bench/host_profiling.py).
DEFAULT_SAMPLE_RATE = 100
MAX_SAMPLE_RATE = 1000  # py-spy's own ceiling for a useful rate
DEFAULT_UPLOAD_INTERVAL_S = 10  # the agent's default: one push per 10 s per process
PROBE_TIMEOUT_S = 1.0  # TCP connect to $MLPROF_PYROSCOPE_URL before choosing it
# While no destination is found the lookup repeats every second on the step log's
# flusher thread; a probe that times out would hold that thread up, so Pyroscope is
# probed again only this often (the sidecar's file is looked at every time).
PROBE_EVERY_S = 30.0
PHASE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a label value, kept short and plain
_PHASE = schema.PHASE_LABEL  # bound once: read on every step
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _warn(message: str) -> None:
    print(f"mlprof: host profiling: {message}", file=sys.stderr, flush=True)


def check_phase(name: str) -> str:
    """Return ``name`` if it can be a ``phase`` label value; ValueError otherwise."""
    if not isinstance(name, str) or not PHASE_RE.fullmatch(name):
        raise ValueError(f"phase {name!r}: expected 1-64 characters of A-Z a-z 0-9 _ . -")
    return name


@dataclass(frozen=True)
class HostProfiling:
    """Options of the workload's host CPU profiler (each also ``$MLPROF_HOST_PROFILING_*``).

    >>> sdk.run("llama", host_profiling=HostProfiling(sample_rate=50))  # doctest: +SKIP
    """

    sample_rate: int = DEFAULT_SAMPLE_RATE  # samples per second per thread (1-1000)
    oncpu: bool = True  # only threads running on a CPU; False samples idle ones too (wall)
    gil_only: bool = True  # only the thread holding the GIL (the Python that runs)
    # Restart the agent in fork()ed children (multiprocessing's "fork", DataLoader
    # workers) under the same labels, their samples labelled with their pid. The agent
    # itself stops in a forked child and has no option for other subprocesses.
    subprocesses: bool = False
    upload_interval_s: int = DEFAULT_UPLOAD_INTERVAL_S  # seconds between pushes (1-60)
    server_address: str | None = None  # fixed destination instead of the lookup above

    def __post_init__(self) -> None:
        if not 1 <= self.sample_rate <= MAX_SAMPLE_RATE:
            raise ValueError(
                f"host profiling sample_rate={self.sample_rate}: expected 1..{MAX_SAMPLE_RATE}"
            )
        if not 1 <= self.upload_interval_s <= 60:
            raise ValueError(
                f"host profiling upload_interval_s={self.upload_interval_s}: expected 1..60"
            )
        if self.server_address is not None and not self.server_address.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"host profiling server_address={self.server_address!r}: expected an "
                "http:// or https:// URL"
            )


def _flag(environ: Mapping[str, str], name: str) -> bool | None:
    raw = environ.get(name)
    if raw is None:
        return None
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected 1/true/on or 0/false/off")


def options_from_env(
    requested: bool | HostProfiling | None, environ: Mapping[str, str] | None = None
) -> HostProfiling | None:
    """The profiler's options, or None when host profiling is off.

    ``requested`` is ``sdk.run``'s argument: None follows ``$MLPROF_HOST_PROFILING``,
    True turns it on with the ``$MLPROF_HOST_PROFILING_*`` options, an instance is used
    as given. A bad variable is reported on stderr and turns profiling off: a typo must
    not stop training.
    """
    env = os.environ if environ is None else environ
    if requested is False:
        return None
    if isinstance(requested, HostProfiling):
        return requested
    try:
        enabled = _flag(env, schema.HOST_PROFILING_ENV)
        if not (requested or enabled):
            return None
        options: dict[str, Any] = {}
        for key in ("oncpu", "gil_only", "subprocesses"):
            value = _flag(env, ENV_PREFIX + key.upper())
            if value is not None:
                options[key] = value
        numbers = (("sample_rate", "SAMPLE_RATE"), ("upload_interval_s", "UPLOAD_INTERVAL_S"))
        for key, var in numbers:
            raw = env.get(ENV_PREFIX + var, "").strip()
            if raw:
                number = parse_ascii_int(raw)
                if number is None:
                    raise ValueError(f"{ENV_PREFIX}{var}={raw!r}: expected a whole number")
                options[key] = number
        url = env.get(ENV_PREFIX + "URL", "").strip()
        if url:
            options["server_address"] = url.rstrip("/")
        return HostProfiling(**options)
    except ValueError as exc:
        _warn(f"{exc}; host profiling is off")
        return None


@dataclass(frozen=True)
class Destination:
    """Where the agent pushes, and how it authenticates there."""

    url: str
    via: str  # "configured", "pyroscope" (direct) or "sidecar"
    headers: dict[str, str] = field(default_factory=dict)
    basic_auth: tuple[str, str] | None = None
    tenant: str | None = None


def _reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host and port opens within ``timeout_s``."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _sidecar_url(shared_dir: Path) -> str | None:
    """The sidecar's ingest URL from the file it writes, None when absent or malformed."""
    import json

    path = shared_dir / schema.SIDECAR_DIR / schema.INGEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    return url.rstrip("/")


def find_destination(
    options: HostProfiling,
    shared_dir: Path,
    environ: Mapping[str, str] | None = None,
    reachable: Callable[[str], bool] = _reachable,
) -> Destination | None:
    """The first destination that applies (see the module docstring), or None yet."""
    env = os.environ if environ is None else environ
    if options.server_address:
        return Destination(options.server_address, "configured")
    direct = env.get("MLPROF_PYROSCOPE_URL", "").strip().rstrip("/")
    if direct and reachable(direct):
        user = env.get("MLPROF_PYROSCOPE_USER", "").strip()
        auth = (user, env.get("MLPROF_PYROSCOPE_PASSWORD", "")) if user else None
        tenant = env.get("MLPROF_PYROSCOPE_TENANT", "").strip() or None
        return Destination(direct, "pyroscope", basic_auth=auth, tenant=tenant)
    sidecar = _sidecar_url(shared_dir)
    if sidecar:
        token = env.get("MLPROF_AUTH_TOKEN", "").strip()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return Destination(sidecar, "sidecar", headers=headers)
    return None


class _PhaseStacks(threading.local):
    """Each thread's stack of phases, empty on first use (no try/except per step)."""

    def __init__(self) -> None:
        self.stack: list[str] = []


class HostProfiler:
    """The process's pyroscope-io agent for one run, and the ``phase`` tags of its threads.

    ``enter(phase)`` / ``leave()`` keep a per-thread stack so that nested phases tag the
    innermost one only (the agent keys tags by thread and would keep both otherwise);
    ``leave`` restores the outer phase, as ``pyroscope.tag_wrapper`` does in ``finally``.
    """

    def __init__(
        self,
        options: HostProfiling,
        identity: Mapping[str, str],
        shared_dir: Path,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options
        self.identity = dict(identity)
        self.shared_dir = shared_dir
        self._environ = environ
        self.destination: Destination | None = None
        self.started = False
        self._lib: ModuleType | None = None
        self._add: Callable[[str, str], object] = _no_tag
        self._remove: Callable[[str, str], object] = _no_tag
        self._local = _PhaseStacks()
        self._announced = False
        self._gave_up = False
        self._fork_hook = False
        self._probed_at: float | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> bool:
        """Start the agent if a destination is known; True once it runs."""
        if self.started:
            return True
        destination = find_destination(
            self.options, self.shared_dir, self._environ, reachable=self._probe
        )
        if destination is None:
            if not self._announced:
                self._announced = True
                _warn(
                    "no destination yet (set MLPROF_PYROSCOPE_URL for the workload, or run "
                    "the sidecar with MLPROF_PYROSCOPE_URL); looking again every second"
                )
            return False
        try:
            import pyroscope  # the agent: a native extension, loaded only now
        except ImportError:
            _warn("pyroscope-io is not installed (pip install pyroscope-io); host profiling is off")
            self._gave_up = True
            return False
        self._lib = pyroscope
        self._configure(destination)
        self.destination = destination
        self._bind_tags()
        self.started = True
        if self.options.subprocesses and not self._fork_hook:
            os.register_at_fork(after_in_child=self._after_fork_in_child)
            self._fork_hook = True
        shown = urlsplit(destination.url)
        shown = shown._replace(netloc=shown.netloc.rpartition("@")[2])  # no credentials
        print(
            f"mlprof: host profiling at {self.options.sample_rate} Hz, pushing to "
            f"{shown.geturl()} ({destination.via})",
            file=sys.stderr,
            flush=True,
        )
        return True

    def _probe(self, url: str) -> bool:
        now = time.monotonic()
        if self._probed_at is not None and now - self._probed_at < PROBE_EVERY_S:
            return False
        self._probed_at = now
        return _reachable(url)

    def _configure(self, destination: Destination) -> None:
        assert self._lib is not None
        tags = {
            "run_id": self.identity["run_id"],
            "host": self.identity["host"],
            "trigger": "periodic",
            "profile_source": schema.HOST_PROFILE_SOURCE,
        }
        user, password = destination.basic_auth or ("", "")
        ok = self._lib.configure(
            application_name=self.identity["workload"],  # the agent's service_name
            server_address=destination.url,
            basic_auth_username=user,
            basic_auth_password=password,
            tenant_id=destination.tenant or "",
            http_headers=destination.headers,
            sample_rate=self.options.sample_rate,
            oncpu=self.options.oncpu,
            gil_only=self.options.gil_only,
            report_pid=self.options.subprocesses,
            tags=tags,
            upload_interval=self.options.upload_interval_s,
        )
        if ok is False:
            _warn(
                "the pyroscope agent did not start (another one already runs in this "
                "process?); phase tags go to the running agent"
            )

    def _bind_tags(self) -> None:
        # The native functions themselves, bound once: they run twice per step, and the
        # package's Python wrappers plus attribute lookups would add a measurable share
        # of the per-step budget (bench/sdk_step.py).
        # Since pyroscope-io 1.4 ``pyroscope.lib`` is the pyo3 module taking str; older
        # releases expose a cffi object taking bytes, so they keep the wrappers.
        assert self._lib is not None
        native = getattr(self._lib, "lib", None)
        tags = native if isinstance(native, ModuleType) else self._lib
        self._add = tags.add_thread_tag
        self._remove = tags.remove_thread_tag

    def tick(self) -> None:
        """Retry a start that found no destination (called every second by the SDK)."""
        if not self.started and not self._gave_up:
            self.start()

    def stop(self) -> None:
        """Stop the agent; it pushes what it sampled since the last upload first."""
        if not self.started or self._lib is None:
            return
        self.started = False
        self._add = self._remove = _no_tag
        try:
            self._lib.shutdown()
        except Exception as exc:  # stopping must never fail the run's close()
            _warn(f"stopping the agent failed: {exc!r}")

    def _after_fork_in_child(self) -> None:
        # The agent's own fork hook (registered when pyroscope was imported, so it runs
        # first) has dropped the parent's agent: start this process's own, same labels.
        self._local = _PhaseStacks()
        self.started = False
        self._add = self._remove = _no_tag
        if self.destination is not None and self._lib is not None:
            self._configure(self.destination)
            self._bind_tags()
            self.started = True

    # -- phase tags --------------------------------------------------------------------
    def enter(self, phase: str) -> None:
        """Tag this thread's samples with ``phase`` (the innermost phase wins)."""
        stack = self._local.stack
        if stack:
            self._remove(_PHASE, stack[-1])
        self._add(_PHASE, phase)
        stack.append(phase)

    def leave(self) -> None:
        """Undo the latest ``enter`` of this thread, restoring the outer phase."""
        stack = self._local.stack
        if not stack:
            return
        self._remove(_PHASE, stack.pop())
        if stack:
            self._add(_PHASE, stack[-1])


def _no_tag(key: str, value: str) -> bool:
    return False
