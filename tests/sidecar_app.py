"""A sidecar app on temp dirs, with a profiler client that writes capture files itself.

The capture engine dials real TCP targets (its reachability probe) and stores what the
client writes; :class:`FileWritingProfilerClient` stands in for XProf's client where a
test needs captures without a JAX process. :class:`ServedSidecar` serves the app with
uvicorn on a loopback port in a thread (what ``mlprof serve`` runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn

from exporter.api.app import create_app
from exporter.api.header_timeout import HeaderTimeoutProtocol
from exporter.config import Settings, load_settings, parse_hostport
from exporter.proto import xplane_pb2
from exporter.sidecar import Sidecar
from tests.harness import free_port, wait_http

__all__ = [
    "FileWritingProfilerClient",
    "ProfilerListener",
    "ServedSidecar",
    "settings_in",
    "write_live_run",
]


class FileWritingProfilerClient:
    """Answers a trace by writing an (empty) XSpace where XProf's server would."""

    def __init__(self) -> None:
        self.traces: list[str] = []

    def trace(
        self, address: str, logdir: str, duration_ms: int, options: Mapping[str, Any]
    ) -> None:
        self.traces.append(address)
        host, port = parse_hostport(address)
        staging = Path(logdir) / "plugins" / "profile" / str(options["session_id"])
        staging.mkdir(parents=True, exist_ok=True)
        (staging / f"{host}_{port}.xplane.pb").write_bytes(
            xplane_pb2.XSpace(hostnames=["vm"]).SerializeToString()
        )

    def start_continuous(self, address: str, options: Mapping[str, Any]) -> None:
        raise RuntimeError("continuous profiling is not offered by this client")

    def get_snapshot(self, address: str, logdir: str) -> None:
        raise RuntimeError("continuous profiling is not offered by this client")

    def stop_continuous(self, address: str) -> None:
        pass


class ProfilerListener:
    """A TCP listener standing for a workload's profiler server (the probe connects)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def write_live_run(shared: Path, run_id: str, name: str, port: int, pid: int, **extra: Any) -> None:
    """``runs/<run_id>.json`` and a fresh step-log heartbeat, as ``sdk.run`` leaves them."""
    info = {"schema": 1, "run_id": run_id, "name": name, "host": "vm", "pid": pid,
            "start_unix": time.time(), "profiler_port": port, "system": {}} | extra  # fmt: skip
    (shared / "runs").mkdir(parents=True, exist_ok=True)
    (shared / "runs" / f"{run_id}.json").write_text(json.dumps(info))
    (shared / "steps").mkdir(exist_ok=True)
    (shared / "steps" / f"vm-{pid}.jsonl").touch()


def settings_in(tmp: Path, **overrides: Any) -> Settings:
    """Settings on temp dirs, collection fast, every outside service off."""
    base: dict[str, Any] = {
        "listen": f"127.0.0.1:{free_port()}",
        "shared_dir": str(tmp / "shared"),
        "store": str(tmp / "store"),
        "spool_dir": str(tmp / "spool"),
        "sources": "jax",
        "collect_interval_s": 0.2,
        "discovery_interval_s": 0.5,
        "capture_max_duration_ms": 200,
    }
    return load_settings(**(base | overrides))


class ServedSidecar:
    """``create_app(Sidecar(settings))`` served by uvicorn in a thread."""

    def __init__(self, settings: Settings, client: FileWritingProfilerClient | None = None):
        self.settings = settings
        self.client = client or FileWritingProfilerClient()
        self.sidecar = Sidecar(settings, profiler_client=self.client)
        host, port = parse_hostport(settings.listen)
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(
            create_app(self.sidecar), host=host, port=port, log_level="warning", lifespan="on",
            http=HeaderTimeoutProtocol,  # as `mlprof serve` runs it
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServedSidecar:
        self.thread.start()
        wait_http(f"{self.url}/healthz", timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def release_fifo(path: Path) -> None:
    """Open a FIFO's write end once, so a reader stuck in open() returns."""
    with contextlib.suppress(OSError):  # nobody is waiting on it
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
