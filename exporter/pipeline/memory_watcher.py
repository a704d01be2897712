"""The sidecar's side of device-memory profiles: pick up new ones, convert, publish.

The workload's SDK writes ``memory/*.pprof.gz`` (JAX) or ``memory/*.pickle`` (PyTorch CUDA
allocator snapshots), with a ``.json`` identity beside each, into the shared directory;
:class:`MemoryProfileWatcher` converts each new one once (remembered across restarts) and
hands the flame graph and its labels to ``publish`` (e.g. ``PyroscopeSink.push``).
:func:`request_memory_profile` asks the workload for one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from exporter import schema
from exporter.errors import InputError
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.pprof import InflateLimits
from exporter.regular_files import (
    WatchedDirectory,
    open_directory,
    read_regular_at,
    replace_file,
)
from exporter.state_files import BadStateError, load_state, save_state, set_aside

__all__ = [
    "MEMORY_REQUEST_ID",
    "MemoryProfileResult",
    "MemoryProfileWatcher",
    "answers_to",
    "request_memory_profile",
]

log = logging.getLogger(__name__)

PROFILE_SOURCE = "device_memory"
MEMORY_REQUEST_ID = re.compile(r"^\d{9,12}-[0-9a-f]{8}$")  # what request_memory_profile makes
REQUEST_TTL_S = 300.0  # requests older than this are removed (the SDK ignores them too)
Publish = Callable[[FlameGraph, dict[str, str]], object]
SUFFIXES = (schema.MEMORY_PROFILE_SUFFIX, schema.MEMORY_SNAPSHOT_SUFFIX)


class _WatcherState(BaseModel):
    """``sidecar/memory-profiles.json``: the profiles already published."""

    processed: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)  # name -> why, of those processed


@dataclass(frozen=True)
class MemoryProfileResult:
    """One profile picked up: its file, labels, what publishing returned or the error."""

    path: Path
    labels: dict[str, str]
    graph: FlameGraph | None
    outcome: object = None
    error: str = ""


def request_memory_profile(shared_dir: Path) -> str:
    """Ask the workload (SDK) for a device-memory profile; return the request id.

    InputError (naming the directory) when the request cannot be written. The workload
    writes the shared dir too: ``requests/`` must not be a link, and a link planted under
    any name there is replaced, never written through.
    """
    request_id = f"{int(time.time())}-{secrets.token_hex(4)}"
    directory = shared_dir / schema.REQUESTS_DIR
    name = f"{schema.MEMORY_PROFILE_REQUEST_PREFIX}{request_id}{schema.REQUEST_SUFFIX}"
    body = json.dumps({"id": request_id, "time": time.time()}).encode()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        replace_file(directory / name, body, below=shared_dir)
    except OSError as exc:
        raise InputError(
            f"shared dir {shared_dir}: cannot write a memory-profile request in {directory} "
            f"({exc.strerror or exc})"
        ) from None
    return request_id


def _profiles(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    """The profiles in an open directory, each with its own (not a link target's) stat."""
    found = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if entry.name.endswith(SUFFIXES):
                try:
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:  # gone since listed
                    continue
    return found


def _meta_name(name: str) -> str:
    suffix = next(s for s in SUFFIXES if name.endswith(s))
    return name[: -len(suffix)] + schema.MEMORY_META_SUFFIX


def _meta(dir_fd: int, path: Path) -> dict[str, Any]:
    """The identity beside profile ``path``, read from the open directory it is in."""
    name = _meta_name(path.name)
    try:
        data = json.loads(read_regular_at(dir_fd, name, path.with_name(name)))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def answers_to(shared_dir: Path, request_id: str) -> list[Path]:
    """Profiles written in answer to ``request_id``; none where ``memory/`` is a link."""
    directory = shared_dir / schema.MEMORY_DIR
    try:
        dir_fd = open_directory(directory, below=shared_dir)
    except OSError:
        return []
    try:
        paths = (directory / name for name, _ in _profiles(dir_fd))
        return sorted(p for p in paths if _meta(dir_fd, p).get("request_id") == request_id)
    finally:
        os.close(dir_fd)


class MemoryProfileWatcher:
    """Converts each new device-memory profile in the shared dir once and publishes it.

    ``poll()`` is what the sidecar calls periodically; ``keep`` bounds how many
    converted profiles stay on disk (the oldest are deleted); ``limits`` bound how far
    a workload-written profile may inflate (``MLPROF_MAX_PROFILE_BYTES``/``_RATIO``).

    Each profile is converted in a child bounded to ``timeout_s`` and ``max_memory_mb``
    (``convert`` replaces that, e.g. in tests), and is remembered as processed *before*
    its conversion: one that kills the conversion is recorded in ``failed`` (with the
    child's one-line reason) and never tried again, even after a restart.

    The workload writes the shared dir: a ``memory/`` that is a symbolic link (or lies
    under one) is not read, and nothing in it is converted, published or deleted; a
    profile that is a link is recorded as failed, not converted.
    """

    def __init__(
        self,
        shared_dir: Path,
        publish: Publish | None = None,
        state_path: Path | None = None,
        keep: int = 100,
        limits: InflateLimits | None = None,
        *,
        convert: Callable[[Path, str], FlameGraph] | None = None,
        timeout_s: float = 300.0,
        max_memory_mb: int = 4096,
    ) -> None:
        self.shared_dir = shared_dir
        self.limits = limits or InflateLimits()
        self.timeout_s = timeout_s
        self.max_memory_mb = max_memory_mb
        self.convert = convert or self._convert_in_child
        self.failed: dict[str, str] = {}
        self.converting: str | None = None  # the profile being converted now
        self.directory = shared_dir / schema.MEMORY_DIR
        self.publish = publish
        self.state_path = state_path or shared_dir / schema.SIDECAR_DIR / "memory-profiles.json"
        self.keep = keep
        self.processed: set[str] = set()
        self.errors = 0
        self.state_discarded: str | None = None  # why the state file was set aside
        self.watched = WatchedDirectory(
            self.directory, below=shared_dir, what="memory profiles", log=log
        )
        try:
            state = load_state(self.state_path, _WatcherState)
        except BadStateError as exc:
            self.state_discarded = str(exc)
            set_aside(self.state_path, str(exc))
        else:
            self.processed = set(state.processed) if state is not None else set()
            self.failed = dict(state.failed) if state is not None else {}

    def _save(self) -> None:
        failed = {k: v for k, v in sorted(self.failed.items()) if k in self.processed}
        body = {"processed": sorted(self.processed), "failed": failed}
        save_state(self.state_path, json.dumps(body).encode())

    def _convert_in_child(self, path: Path, kind: str) -> FlameGraph:
        from exporter.pipeline.job import flamegraphs_in_child

        graphs = flamegraphs_in_child(
            path,
            kind,
            self.timeout_s,
            self.max_memory_mb,
            max_profile_bytes=self.limits.max_bytes,
            max_profile_ratio=self.limits.max_ratio,
            below=self.shared_dir,  # the child opens it again: no link on the way
        )
        return graphs[PROFILE_SOURCE]

    @staticmethod
    def labels_for(meta: dict[str, Any], path: Path) -> dict[str, str]:
        """Pyroscope labels of a profile from its identity file.

        The workload writes ``trigger`` (``run.memory_profile(trigger=...)`` takes any
        string); one outside ``TRIGGERS`` becomes ``programmatic`` (the workload's own
        call) with a warning, so the profile is still published with a known label.
        """
        from exporter.sinks.pyroscope import TRIGGERS, profile_labels

        trigger = str(meta.get("trigger") or "periodic")
        if trigger not in TRIGGERS:
            log.warning(
                "%s: trigger %r is not one of %s; published as 'programmatic'",
                path,
                trigger,
                sorted(TRIGGERS),
            )
            trigger = "programmatic"
        return profile_labels(
            str(meta.get("workload") or "unknown_service"),
            run_id=str(meta.get("run_id") or "unknown"),
            host=str(meta.get("host") or path.name.split("-")[0]),
            trigger=trigger,
            profile_source=PROFILE_SOURCE,
        )

    def poll(self) -> list[MemoryProfileResult]:
        """Convert and publish every profile not seen before; oldest first."""
        results: list[MemoryProfileResult] = []
        dir_fd = self.watched.open()
        if dir_fd is not None:
            try:
                results = self._poll_in(dir_fd)
            finally:
                os.close(dir_fd)
        self._expire_requests()
        return results

    @property
    def refused(self) -> str | None:
        """Why ``memory/`` is not read now (said once), None while it is."""
        return self.watched.refused

    def _poll_in(self, dir_fd: int) -> list[MemoryProfileResult]:
        results: list[MemoryProfileResult] = []
        try:
            listed = sorted(_profiles(dir_fd), key=lambda entry: entry[1].st_mtime)
        except OSError:
            listed = []
        found = [self.directory / name for name, _ in listed]
        for path, (_, info) in zip(found, listed, strict=True):
            if path.name in self.processed:
                continue
            if stat.S_ISLNK(info.st_mode):  # it would read a file outside the shared dir
                self.errors += 1
                error = f"{path}: not a regular file (a symbolic link)"
                log.warning("skipping memory profile: %s", error)
                self.processed.add(path.name)
                self.failed[path.name] = error
                self._save()
                labels = self.labels_for(_meta(dir_fd, path), path)
                results.append(MemoryProfileResult(path, labels, None, error=error))
                continue
            if not stat.S_ISREG(info.st_mode):  # a FIFO or device: would block or never end
                self.errors += 1
                log.warning("skipping memory profile %s: not a regular file", path)
                self.processed.add(path.name)
                continue
            # Remembered before converting, one by one: a conversion that takes the
            # sidecar down is not tried again at every start, and a later failure must
            # not re-push this one.
            self.processed.add(path.name)
            self.failed[path.name] = "conversion did not finish (the sidecar stopped)"
            self._save()
            self.converting = path.name
            try:
                result = self._process(dir_fd, path)
            finally:
                self.converting = None
            if result.error:
                self.failed[path.name] = result.error[:500]
            else:
                self.failed.pop(path.name, None)
            self._save()
            results.append(result)
        if results:
            self._retain(dir_fd, found)
            self._save()
        return results

    def _process(self, dir_fd: int, path: Path) -> MemoryProfileResult:
        """Convert and publish one profile; any failure is logged and returned, not raised."""
        meta = _meta(dir_fd, path)
        labels = self.labels_for(meta, path)
        try:
            if path.name.endswith(schema.MEMORY_SNAPSHOT_SUFFIX):
                graph = self.convert(path, "torch")
            else:
                graph = self.convert(path, "memory")
            if meta.get("time"):
                graph.time_nanos = int(float(meta["time"]) * 1e9)
        except InputError as exc:
            self.errors += 1
            log.warning("skipping memory profile: %s", exc)
            return MemoryProfileResult(path, labels, None, error=str(exc))
        except Exception as exc:  # one bad profile must not stop the others
            self.errors += 1
            log.warning("converting memory profile %s failed: %s", path, exc, exc_info=True)
            return MemoryProfileResult(path, labels, None, error=f"{path}: {exc}")
        try:
            outcome = self.publish(graph, labels) if self.publish is not None else None
        except Exception as exc:  # one bad profile must not stop the others
            self.errors += 1
            log.warning("publishing memory profile %s failed: %s", path, exc, exc_info=True)
            return MemoryProfileResult(path, labels, graph, error=f"{path}: {exc}")
        return MemoryProfileResult(path, labels, graph, outcome)

    def _retain(self, dir_fd: int, found: list[Path]) -> None:
        """Delete the oldest converted profiles beyond ``keep``: entries of the open
        directory (a profile that is a link goes, not what it points to)."""
        done = [p for p in found if p.name in self.processed]
        for path in done[: max(0, len(done) - self.keep)]:
            for name in (path.name, _meta_name(path.name)):
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("cannot remove %s: %s", path.with_name(name), exc)
            self.processed.discard(path.name)
            self.failed.pop(path.name, None)

    def _expire_requests(self) -> None:
        """Remove old requests: entries of ``requests/``, never through a link."""
        directory = self.shared_dir / schema.REQUESTS_DIR
        try:
            dir_fd = open_directory(directory, below=self.shared_dir)
        except OSError:
            return
        now = time.time()
        try:
            with os.scandir(dir_fd) as entries:
                for entry in entries:
                    if not entry.name.startswith(schema.MEMORY_PROFILE_REQUEST_PREFIX):
                        continue
                    try:
                        if now - entry.stat(follow_symlinks=False).st_mtime > REQUEST_TTL_S:
                            os.unlink(entry.name, dir_fd=dir_fd)
                    except OSError:
                        continue
        except OSError:
            pass
        finally:
            os.close(dir_fd)
