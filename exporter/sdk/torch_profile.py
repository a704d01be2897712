"""torch.profiler traces into the shared directory, for the sidecar to take as sessions.

``run.torch_profile("name", ...)`` is ``torch.profiler.profile(...)`` whose traces land
in ``<shared>/torch_traces/`` (``run.torch_trace_handler("name")`` is the ``on_trace_ready``
alone, for a profiler the workload builds itself). Each trace is written as the
sidecar's watcher (``exporter.pipeline.torch_watcher``) expects: the identity
``<stem>.json`` first, then the trace exported under a hidden name and renamed to
``<stem>.pt.trace.json`` (``.gz`` with ``use_gzip``), so the sidecar never sees half a
trace. Imports torch only when called; a trace that cannot be written says so in one
line on stderr and training goes on.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from exporter import schema

__all__ = ["TorchTraceHandler", "torch_profile"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
_PLAIN, _GZIP = schema.TORCH_TRACE_SUFFIXES


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise ValueError(
            f"trace name {name!r}: expected 1-81 characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit, without '..'"
        )
    return name


class TorchTraceHandler:
    """An ``on_trace_ready`` that writes each trace into ``<shared>/torch_traces/``.

    >>> handler = run.torch_trace_handler("train")  # doctest: +SKIP
    >>> with torch.profiler.profile(schedule=..., on_trace_ready=handler) as prof:  # doctest: +SKIP
    ...     for batch in loader:
    ...         train_step(batch); prof.step()
    """

    def __init__(
        self,
        shared_dir: Path,
        identity: dict[str, str],
        name: str = "trace",
        use_gzip: bool = False,
        trigger: str = "programmatic",
    ) -> None:
        self.directory = shared_dir / schema.TORCH_TRACES_DIR
        self.identity = identity
        self.name = _check_name(name)
        self.use_gzip = use_gzip
        self.trigger = trigger
        self.written: list[Path] = []
        self._lock = threading.Lock()
        self._seq = 0

    def __call__(self, prof: Any) -> Path | None:
        """Export ``prof``'s trace into the shared dir; its path, or None (said) on failure."""
        try:
            return self._write(prof)
        except Exception as exc:  # the profiler calls this inside training: never raise
            print(f"mlprof: torch trace {self.name!r} not written: {exc}", file=sys.stderr)
            return None

    def _write(self, prof: Any) -> Path:
        now = time.time()
        with self._lock:
            self._seq += 1
            seq = self._seq
        host = re.sub(r"[^A-Za-z0-9_-]+", "_", self.identity.get("host", "host"))[:60]
        stem = f"{self.name}-{host}-{os.getpid()}-{int(now * 1000)}-{seq}"
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"{stem}{_GZIP if self.use_gzip else _PLAIN}"
        exported = self.directory / f".{stem}.export.tmp"  # a dot: the sidecar skips it
        try:
            prof.export_chrome_trace(str(exported))
            if self.use_gzip:
                packed = self.directory / f".{stem}.gz.tmp"
                with exported.open("rb") as src, gzip.open(packed, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                packed.replace(exported)
            meta = {**self.identity, "pid": os.getpid(), "time": now,
                    "trigger": self.trigger, "name": self.name}  # fmt: skip
            meta_path = self.directory / f"{stem}{schema.TORCH_TRACE_META_SUFFIX}"
            tmp = self.directory / f".{meta_path.name}.tmp"
            tmp.write_text(json.dumps(meta), encoding="utf-8")
            tmp.replace(meta_path)  # identity first: whoever sees the trace finds it
            exported.replace(target)
        finally:
            exported.unlink(missing_ok=True)
        self.written.append(target)
        return target


def torch_profile(handler: TorchTraceHandler, **kwargs: Any) -> Any:
    """``torch.profiler.profile(**kwargs)`` whose traces ``handler`` writes."""
    if "on_trace_ready" in kwargs:
        raise ValueError(
            "torch_profile: on_trace_ready is the SDK's (it writes the trace into the shared "
            "directory); build torch.profiler.profile yourself with run.torch_trace_handler()"
        )
    import torch.profiler

    return torch.profiler.profile(on_trace_ready=handler, **kwargs)
