"""Device-memory profiles from the workload: on call, periodically and on request.

Imports JAX only inside :meth:`MemoryProfiler.take`; periodic and requested profiles
are taken only once the workload itself has imported JAX, or, under PyTorch, once the run
records CUDA allocator history (then they are allocator snapshots).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from exporter import schema
from exporter.sdk import torch_memory

__all__ = ["MemoryProfiler", "interval_from_env"]

REQUEST_TTL_S = 300.0  # a request older than this was meant for an earlier process


def interval_from_env() -> float:
    """``$MLPROF_MEMORY_PROFILE_INTERVAL_S`` as seconds; 0 (off) when unset or invalid."""
    raw = os.environ.get(schema.MEMORY_PROFILE_INTERVAL_ENV, "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        print(
            f"mlprof: {schema.MEMORY_PROFILE_INTERVAL_ENV}={raw!r}: expected seconds; "
            "periodic memory profiles are off",
            file=sys.stderr,
        )
        return 0.0
    return value if value > 0 else 0.0


class MemoryProfiler:
    """Writes ``jax.profiler.device_memory_profile()`` or PyTorch CUDA allocator snapshots
    into ``<shared>/memory/``."""

    def __init__(self, shared_dir: Path, identity: dict[str, str], interval_s: float) -> None:
        self.directory = shared_dir / schema.MEMORY_DIR
        self.requests = shared_dir / schema.REQUESTS_DIR
        self.identity = identity
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._seq = 0
        self._last = time.monotonic()
        self._answered: set[str] = set()
        self.torch_history = False  # run.record_memory_history() succeeded

    def take(self, trigger: str = "programmatic", request_id: str | None = None) -> Path:
        """Take a device-memory profile now and return the path of its pprof."""
        import jax.profiler

        data = jax.profiler.device_memory_profile()
        return self._write(data, schema.MEMORY_PROFILE_SUFFIX, trigger, request_id)

    def take_torch_snapshot(
        self, trigger: str = "programmatic", request_id: str | None = None
    ) -> Path | None:
        """Write PyTorch's CUDA allocator snapshot now; None (said on stderr) without CUDA."""
        data = torch_memory.snapshot_pickle()
        if data is None:
            return None
        return self._write(data, schema.MEMORY_SNAPSHOT_SUFFIX, trigger, request_id)

    def _write(self, data: bytes, suffix: str, trigger: str, request_id: str | None) -> Path:
        now = time.time()
        with self._lock:
            self._seq += 1
            stem = f"{self.identity['host']}-{os.getpid()}-{int(now * 1000)}-{self._seq}"
            self.directory.mkdir(parents=True, exist_ok=True)
            meta = {
                **self.identity,
                "pid": os.getpid(),
                "time": now,
                "trigger": trigger,
                "request_id": request_id,
            }
            meta_path = self.directory / f"{stem}{schema.MEMORY_META_SUFFIX}"
            path = self.directory / f"{stem}{suffix}"
            # Identity first, profile last: whoever sees the profile finds its identity.
            for target, payload in ((meta_path, json.dumps(meta).encode()), (path, data)):
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_bytes(payload)
                tmp.replace(target)
            self._last = time.monotonic()
        return path

    def tick(self) -> None:
        """Answer new requests and take the periodic profile when due (flusher thread)."""
        take: Callable[[str, str | None], Path | None]
        if self.torch_history:  # the workload asked for PyTorch's allocator history
            take = self.take_torch_snapshot
        elif "jax" in sys.modules:
            take = self.take
        else:
            return  # never import JAX (or torch) on the workload's behalf
        for request_id in self._pending_requests():
            self._answered.add(request_id)
            take("manual", request_id)
        if self.interval_s and time.monotonic() - self._last >= self.interval_s:
            self._last = time.monotonic()  # a failing profile is retried next interval
            take("periodic", None)

    def _pending_requests(self) -> list[str]:
        try:
            entries = list(self.requests.glob(f"{schema.MEMORY_PROFILE_REQUEST_PREFIX}*"))
        except OSError:
            return []
        pending = []
        now = time.time()
        for entry in entries:
            if not entry.name.endswith(schema.REQUEST_SUFFIX):
                continue
            request_id = entry.name[
                len(schema.MEMORY_PROFILE_REQUEST_PREFIX) : -len(schema.REQUEST_SUFFIX)
            ]
            if request_id in self._answered:
                continue
            try:
                if now - entry.stat().st_mtime > REQUEST_TTL_S:
                    continue
            except OSError:
                continue
            pending.append(request_id)
        return sorted(pending)
