"""Profiler targets: workloads' profiler servers, found by static list, run.json, DNS or k8s.

Only what discovery found is ever dialled: selection (``TargetRegistry.select``) filters
known targets and never creates one from a caller's input.

>>> registry = TargetRegistry([StaticDiscovery(["127.0.0.1:9999"])])
>>> registry.refresh(check=False)
>>> [t.address for t in registry.select(hosts=["127.0.0.1"])]
['127.0.0.1:9999']
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final, Protocol

import httpx

from exporter import schema
from exporter.ascii_digits import parse_ascii_int
from exporter.capture.fingerprints import fingerprint_of
from exporter.config import parse_hostport
from exporter.regular_files import read_regular

__all__ = [
    "DEFAULT_PROFILER_PORT",
    "DnsDiscovery",
    "K8sDiscovery",
    "LocalRunDiscovery",
    "ProfilerTarget",
    "StaticDiscovery",
    "TargetHealth",
    "TargetRegistry",
    "format_address",
    "probe",
]

log = logging.getLogger(__name__)

DEFAULT_PROFILER_PORT: Final = 9999
SERVICEACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Pod annotations/labels the k8s discovery reads (see deploy/k8s/training-job.yaml).
PORT_ANNOTATION: Final = "mlprof.io/profiler-port"
RUN_ID_KEYS: Final = ("mlprof.io/run-id", "run_id")
# A run is live while the SDK's flusher touches its step log (every second). Looser than
# mlprof_workload_up's 10 s: a busy host may starve that thread for a while, and a
# target that flickers away is worse for a capture than one that lingers a little.
LIVE_HEARTBEAT_S: Final = 30.0


@dataclass(frozen=True)
class ProfilerTarget:
    """A workload's profiler server: the only address a capture dials."""

    address: str  # host:port of the profiler server
    host: str  # the ``host`` label of the workload's metrics
    run_id: str | None  # the run it belongs to, when known
    source: str  # static | local | dns | k8s; "static+local" when several found it
    accelerator: str | None = None  # tpu | gpu | cpu when known (chooses snapshot mode)
    workload: str | None = None  # the run's name (``workload`` label), when known
    # The run's configuration (capture.fingerprints): with the workload, whose history
    # a session of this target is.
    config_fingerprint: str | None = None

    @property
    def address_host(self) -> str:
        return parse_hostport(self.address)[0]

    def merged(self, other: ProfilerTarget) -> ProfilerTarget:
        """This target with the facts ``other`` (same address) knows and this one lacks.

        A host label that is only the address's host (static and DNS targets) gives way
        to a real one (the run's ``host``, a pod name).
        """
        named = self.host != self.address_host
        # The workload and its configuration come from one discovery, never half each.
        run = self if self.workload else other
        return replace(
            self,
            host=self.host if named or other.host == other.address_host else other.host,
            run_id=self.run_id or other.run_id,
            source=f"{self.source}+{other.source}",
            accelerator=self.accelerator or other.accelerator,
            workload=run.workload,
            config_fingerprint=run.config_fingerprint,
        )

    def file_stem(self) -> str:
        """The stem XProf gives this target's capture file: ``<host>_<port>``."""
        host, port = parse_hostport(self.address)
        return f"{host}_{port}"


@dataclass
class TargetHealth:
    """Last reachability of a target, as ``GET /api/v1/targets`` shows it."""

    reachable: bool | None = None  # None: not probed yet
    checked: float | None = None
    error: str = ""


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe(address: str, timeout_s: float = 1.0) -> str:
    """Open (and close) a TCP connection; return "" or the reason it failed."""
    host, port = parse_hostport(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ""
    except OSError as exc:
        return f"cannot connect to {address}: {exc.strerror or exc}"


class Discovery(Protocol):
    name: str

    def discover(self) -> list[ProfilerTarget]: ...


class StaticDiscovery:
    """``MLPROF_TARGETS=host:port,...``; the host label is the address's host."""

    name = "static"

    def __init__(self, addresses: Iterable[str], default_port: int = DEFAULT_PROFILER_PORT):
        self.targets = []
        for item in addresses:
            host, port = parse_hostport(item, default_port)
            self.targets.append(ProfilerTarget(format_address(host, port), host, None, "static"))

    def discover(self) -> list[ProfilerTarget]:
        return list(self.targets)


class LocalRunDiscovery:
    """Every live run process beside the sidecar with a profiler server.

    Each process of a run has its record in ``procs/<host>-<pid>.json`` (several
    processes of one run, one per GPU, each serve on their own port); a run written by
    an SDK without them is found through ``runs/<run_id>.json``. A process is live while
    its step log (``steps/<host>-<pid>.jsonl``, touched by the SDK every second) is fresh
    and its record does not say it ended. Its profiler server is at
    ``<address_host>:<profiler_port>`` (``MLPROF_LOCAL_TARGETS_HOST``, 127.0.0.1 unless
    the workload runs in another container). When two live processes name the same
    port (an SDK that did not check it), the one that started first holds it: the later
    one's server could not bind.
    """

    name = "local"
    refresh_on_capture = True  # cheap: re-read when a capture starts (see TargetRegistry)

    def __init__(
        self,
        shared_dir: Path,
        address_host: str = "127.0.0.1",
        heartbeat_timeout_s: float = LIVE_HEARTBEAT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.shared_dir = shared_dir
        self.address_host = address_host
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._clock = clock
        self._cache: dict[str, tuple[int, dict[str, Any] | None]] = {}  # path -> mtime, info

    def discover(self) -> list[ProfilerTarget]:
        paths: list[Path] = []
        for directory in (self.shared_dir / schema.RUNS_DIR, self.shared_dir / schema.PROCS_DIR):
            try:
                paths += sorted(directory.glob("*.json"))
            except OSError as exc:
                raise RuntimeError(f"{directory}: cannot list run files ({exc.strerror})") from None
        # One record per process (host, pid): its own procs/ record, listed last, wins
        # over runs/<run_id>.json, which is whichever process of the run wrote last.
        by_process: dict[tuple[Any, Any], dict[str, Any]] = {}
        for path in paths:
            info = self._info(path)
            if info is not None:
                by_process[(info.get("host"), info.get("pid"))] = info
        live = []
        for info in by_process.values():
            try:
                if self._live(info):
                    live.append(info)
            except Exception as exc:  # one bad record must not hide every later run
                log.debug("run record of %r unusable: %s", info.get("run_id"), exc)
        names = {str(p) for p in paths}
        self._cache = {n: v for n, v in self._cache.items() if n in names}
        owners: dict[int, dict[str, Any]] = {}
        for info in sorted(live, key=lambda i: _float(i.get("start_unix"))):
            owners.setdefault(info["profiler_port"], info)
        return [self._target(info) for _, info in sorted(owners.items())]

    def _info(self, path: Path) -> dict[str, Any] | None:
        """A run file with a profiler port, cached by modification time."""
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return None
        cached = self._cache.get(str(path))
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            # Bounded, regular, no link followed under the shared dir (runs/ included).
            info = json.loads(read_regular(path, below=self.shared_dir))
        except (OSError, ValueError, RecursionError) as exc:
            log.debug("run file %s unreadable: %s", path, exc)
            return None  # being replaced, or not a run file: not cached, read again
        port = info.get("profiler_port") if isinstance(info, dict) else None
        valid = isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
        found = info if valid and info.get("run_id") else None
        self._cache[str(path)] = (mtime, found)
        return found

    def _live(self, info: dict[str, Any]) -> bool:
        if info.get("ended_unix") is not None:
            return False  # the run closed cleanly: its profiler server is gone
        host, pid = info.get("host"), info.get("pid")
        log_name = f"{host}-{pid}{schema.STEP_LOG_SUFFIX}"
        if (
            not isinstance(host, str)
            or not host
            or "/" in host
            or "\0" in host  # os.stat() raises ValueError on it: one bad record, not all
            or not isinstance(pid, int)
        ):
            return False
        try:
            beat = (self.shared_dir / schema.STEPS_DIR / log_name).stat().st_mtime
        except (OSError, ValueError):
            return False
        return self._clock() - beat <= self.heartbeat_timeout_s

    def _target(self, info: dict[str, Any]) -> ProfilerTarget:
        system = info.get("system")
        backend = system.get("backend") if isinstance(system, dict) else None
        return ProfilerTarget(
            format_address(self.address_host, info["profiler_port"]),
            str(info.get("host") or self.address_host),
            str(info["run_id"]),
            "local",
            str(backend) if backend else None,
            str(info["name"]) if info.get("name") else None,
            fingerprint_of(info),
        )


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


Resolver = Callable[[str, int], list[str]]


def _resolve_all(name: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class DnsDiscovery:
    """Every A/AAAA record of a name (a headless Service lists one per ready pod)."""

    name = "dns"

    def __init__(
        self, name: str, port: int = DEFAULT_PROFILER_PORT, resolver: Resolver | None = None
    ):
        self.dns_name = name
        self.port = port
        self._resolve = resolver or _resolve_all

    def discover(self) -> list[ProfilerTarget]:
        try:
            addresses = self._resolve(self.dns_name, self.port)
        except socket.gaierror as exc:
            raise RuntimeError(f"DNS name {self.dns_name!r}: {exc.strerror or exc}") from None
        return [ProfilerTarget(format_address(ip, self.port), ip, None, "dns") for ip in addresses]


class K8sDiscovery:
    """Running pods matching a label selector, read from the Kubernetes API (in-cluster).

    Needs ``get``/``list`` on ``pods`` in the namespace (deploy/k8s/capture-rbac.yaml).
    A pod's host label is its name (the SDK's default host is the pod's hostname), its
    run from the ``mlprof.io/run-id`` label or annotation, its port from the
    ``mlprof.io/profiler-port`` annotation or the default.
    """

    name = "k8s"

    def __init__(
        self,
        selector: str,
        namespace: str,
        api_url: str,
        token: str | None = None,
        ca_file: Path | None = None,
        port: int = DEFAULT_PROFILER_PORT,
        timeout_s: float = 5.0,
    ) -> None:
        self.selector = selector
        self.namespace = namespace
        self.api_url = api_url.rstrip("/")
        self.port = port
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            verify=str(ca_file) if ca_file else True, timeout=timeout_s, headers=self._headers
        )

    @classmethod
    def in_cluster(
        cls, selector: str, namespace: str | None, port: int = DEFAULT_PROFILER_PORT
    ) -> K8sDiscovery:
        """Use the pod's service account; raise RuntimeError outside a cluster."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        api_port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError(
                "k8s discovery needs in-cluster config (KUBERNETES_SERVICE_HOST is not set)"
            )
        token_file = SERVICEACCOUNT_DIR / "token"
        ns_file = SERVICEACCOUNT_DIR / "namespace"
        token = token_file.read_text().strip() if token_file.is_file() else None
        if namespace is None and ns_file.is_file():
            namespace = ns_file.read_text().strip()
        ca = SERVICEACCOUNT_DIR / "ca.crt"
        return cls(
            selector,
            namespace or "default",
            f"https://{format_address(host, int(api_port))}",
            token,
            ca if ca.is_file() else None,
            port,
        )

    def discover(self) -> list[ProfilerTarget]:
        url = f"{self.api_url}/api/v1/namespaces/{self.namespace}/pods"
        try:
            response = self._client.get(url, params={"labelSelector": self.selector})
        except httpx.HTTPError as exc:
            raise RuntimeError(f"Kubernetes API {self.api_url}: {exc}") from None
        if response.status_code != 200:
            reason = response.text[:200].strip()
            raise RuntimeError(
                f"Kubernetes API: listing pods in {self.namespace!r} answered "
                f"{response.status_code} ({reason}); does the service account have the "
                "Role in deploy/k8s/capture-rbac.yaml?"
            )
        return [t for pod in response.json().get("items", []) if (t := self._target(pod))]

    def _target(self, pod: dict[str, Any]) -> ProfilerTarget | None:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
            return None
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        port_text = str(annotations.get(PORT_ANNOTATION, self.port))
        port = parse_ascii_int(port_text) or 0
        port = port if 0 < port < 65536 else self.port
        run_id = next((d[k] for k in RUN_ID_KEYS for d in (labels, annotations) if d.get(k)), None)
        return ProfilerTarget(format_address(ip, port), str(meta.get("name") or ip), run_id, "k8s")

    def close(self) -> None:
        self._client.close()


class TargetRegistry:
    """The known targets of every discovery, with their last reachability."""

    def __init__(self, discoveries: Iterable[Discovery], probe_timeout_s: float = 1.0) -> None:
        self.discoveries = list(discoveries)
        self.probe_timeout_s = probe_timeout_s
        self._lock = threading.Lock()
        self._found: dict[str, list[ProfilerTarget]] = {}
        self._errors: dict[str, str] = {}
        self._health: dict[str, TargetHealth] = {}
        self.refreshed: float | None = None

    def refresh(self, check: bool = True) -> None:
        """Run every discovery (keeping the last list of one that fails) and probe targets."""
        for discovery in self.discoveries:
            try:
                found = discovery.discover()
            except Exception as exc:  # a failing source keeps its last known targets
                log.warning("target discovery %s: %s", discovery.name, exc)
                with self._lock:
                    self._errors[discovery.name] = str(exc)
                continue
            with self._lock:
                self._found[discovery.name] = found
                self._errors.pop(discovery.name, None)
        if check:
            for target in self.known():
                error = probe(target.address, self.probe_timeout_s)
                self.mark(target.address, not error, error)
        with self._lock:
            self.refreshed = time.time()
            known = {t.address for t in self._known_locked()}
            self._health = {a: h for a, h in self._health.items() if a in known}

    def mark(self, address: str, reachable: bool, error: str = "") -> None:
        """Record a target's reachability (probes and captures both report here)."""
        with self._lock:
            self._health[address] = TargetHealth(reachable, time.time(), error)

    def health(self, address: str) -> TargetHealth:
        with self._lock:
            return self._health.get(address, TargetHealth())

    def _known_locked(self) -> list[ProfilerTarget]:
        merged: dict[str, ProfilerTarget] = {}
        for discovery in self.discoveries:  # earlier discoveries first on the same address
            for target in self._found.get(discovery.name, []):
                seen = merged.get(target.address)
                merged[target.address] = target if seen is None else seen.merged(target)
        return list(merged.values())

    def refresh_cheap(self) -> None:
        """Run again the discoveries that only read the shared dir (no network, no probe).

        Called before a request picks targets: a run that started seconds ago is found
        without waiting for the next discovery interval.
        """
        for discovery in self.discoveries:
            if getattr(discovery, "refresh_on_capture", False):
                try:
                    found = discovery.discover()
                except Exception as exc:  # keep the last list, as refresh() does
                    log.warning("target discovery %s: %s", discovery.name, exc)
                    continue
                with self._lock:
                    self._found[discovery.name] = found

    def current(self, targets: Iterable[ProfilerTarget]) -> list[ProfilerTarget]:
        """``targets`` with the facts known right now (for labelling a capture at its start).

        Discoveries that are cheap to run (the shared dir) are run again first: the run
        that owns a profiler port may have changed since the last refresh. A target no
        discovery knows any more keeps its address but loses its run and workload (and
        configuration): whose server answers there is not known.
        """
        self.refresh_cheap()
        known = {t.address: t for t in self.known()}
        return [
            known.get(t.address) or replace(t, run_id=None, workload=None, config_fingerprint=None)
            for t in targets
        ]

    def known(self) -> list[ProfilerTarget]:
        """Every known target, one per address."""
        with self._lock:
            return self._known_locked()

    def select(
        self, run_id: str | None = None, hosts: Collection[str] | None = None
    ) -> list[ProfilerTarget]:
        """Known targets of ``run_id`` (if given) matching any of ``hosts`` (if given).

        A host matches a target's ``host`` label or the host part of its address.
        """
        wanted = {h.strip().strip("[]").lower() for h in hosts} if hosts is not None else None
        chosen = []
        for target in self.known():
            if run_id is not None and target.run_id != run_id:
                continue
            names = {target.host.lower(), target.address_host.lower(), target.address.lower()}
            if wanted is not None and not names & wanted:
                continue
            chosen.append(target)
        return chosen

    def errors(self) -> dict[str, str]:
        with self._lock:
            return dict(self._errors)

    def describe(self, targets: Iterable[ProfilerTarget] | None = None) -> list[dict[str, Any]]:
        """Targets (default: all known) with their last reachability, for the API."""
        chosen = self.known() if targets is None else targets
        return [asdict(t) | {"health": asdict(self.health(t.address))} for t in chosen]
