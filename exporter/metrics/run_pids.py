"""Which run a process id belongs to: the ``pid`` the SDK writes into every run record.

``sdk.run`` writes ``run.json``, ``runs/<run_id>.json`` and, for each process of the
run, ``procs/<host>-<pid>.json`` with the process's ``pid`` and ``start_unix``. NVML
reports the processes using a GPU by pid; this maps them to ``run_id`` and
``workload`` so per-process memory lands on the run's series (every process of a run
that runs one process per GPU).

Pids are those of the pid namespace the SDK ran in. They match NVML's where the
workload and the sidecar share the host's pid namespace (bare metal, ``hostPID``, a
process-sharing pod on a node whose driver reports the same namespace); elsewhere a
process simply stays unmapped. A pid the kernel reused for a younger process is not
mistaken for the old run: when ``/proc/<pid>`` is visible, a run that started before
the process did cannot be its run.

Run records are written by the workload: each is read at most ``MAX_RECORD_BYTES``,
bad ones are ignored, and the directory is re-read only when it changes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from exporter import schema
from exporter.regular_files import read_regular

__all__ = ["RunPids", "process_start_unix"]

log = logging.getLogger(__name__)

MAX_RECORD_BYTES: Final = 1 << 20  # a run record is a few KiB; more is not one
MAX_RECORDS: Final = 10_000  # run records read per directory scan (oldest ignored beyond)
# A run record's start_unix is taken after the process started; this much clock slack
# is allowed between the kernel's start time (boot time + ticks) and time.time().
START_SLACK_S: Final = 2.0
RACY_S: Final = 2.0  # coarser than any file system's mtime granularity (ext4: a jiffy)


@dataclass(frozen=True)
class _Run:
    run_id: str
    workload: str
    start_unix: float


def process_start_unix(pid: int, proc: Path = Path("/proc")) -> float | None:
    """When process ``pid`` started (Unix time), or None if this namespace cannot see it."""
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        boot = next(
            float(line.split()[1])
            for line in (proc / "stat").read_text(encoding="ascii").splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    try:
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class RunPids:
    """``pid -> {"run_id", "workload"}`` from the run records in the shared directory.

    >>> RunPids(Path("shared")).identity(4242)  # doctest: +SKIP
    {'run_id': 'llama-20250101-120000-ab12', 'workload': 'llama'}
    """

    def __init__(
        self,
        shared_dir: Path,
        started: Callable[[int], float | None] = process_start_unix,
    ) -> None:
        self.shared_dir = shared_dir
        self._started = started
        self._lock = threading.Lock()
        self._stamp: tuple[float | None, ...] = ()
        self._files: dict[Path, tuple[float, int, int | None, _Run | None]] = {}
        self._by_pid: dict[int, list[_Run]] = {}

    def identity(self, pid: int) -> dict[str, str] | None:
        """The run of process ``pid``, or None when no run record claims it."""
        with self._lock:
            self._refresh()
            runs = self._by_pid.get(pid)
        if not runs:
            return None
        started = self._started(pid)
        if started is not None:  # a run begins after its process does
            runs = [r for r in runs if r.start_unix + START_SLACK_S >= started]
        if not runs:
            return None
        newest = max(runs, key=lambda r: r.start_unix)
        return {"run_id": newest.run_id, "workload": newest.workload}

    def _refresh(self) -> None:
        dirs = (self.shared_dir / schema.RUNS_DIR, self.shared_dir / schema.PROCS_DIR)
        stamp = (*map(_mtime, dirs), _mtime(self.shared_dir / schema.RUN_FILE))
        # A change within the file system's timestamp granularity can leave the mtime as
        # it was (git's "racy" case): while the newest stamp is that young, look anyway.
        racy = time.time() - max((m for m in stamp if m is not None), default=0.0) < RACY_S
        if stamp == self._stamp and not racy:
            return
        self._stamp = stamp
        paths = [self.shared_dir / schema.RUN_FILE]
        for directory in dirs:
            try:
                with os.scandir(directory) as entries:
                    paths += sorted(
                        Path(e.path) for e in entries if e.name.endswith(".json") and e.is_file()
                    )[-MAX_RECORDS:]
            except OSError:
                pass
        files: dict[Path, tuple[float, int, int | None, _Run | None]] = {}
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            known = self._files.get(path)
            if known is not None and known[:2] == (st.st_mtime, st.st_size):
                files[path] = known
                continue
            files[path] = (
                st.st_mtime,
                st.st_size,
                *_read_record(path, st.st_size, self.shared_dir),
            )
        self._files = files
        by_pid: dict[int, list[_Run]] = {}
        for _, _, pid, run in files.values():
            if pid is not None and run is not None and run not in by_pid.get(pid, []):
                by_pid.setdefault(pid, []).append(run)
        self._by_pid = by_pid


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _read_record(path: Path, size: int, shared_dir: Path) -> tuple[int | None, _Run | None]:
    """(pid, run) of one run record; (None, None) for anything that is not one."""
    if size > MAX_RECORD_BYTES:
        log.debug("run record %s: %d bytes, more than a run record; ignored", path, size)
        return None, None
    try:
        # Bounded and regular (a FIFO blocks, /dev/zero never ends), no link followed.
        data = json.loads(read_regular(path, MAX_RECORD_BYTES, below=shared_dir))
    except (OSError, ValueError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    pid, run_id, name, start = (data.get(k) for k in ("pid", "run_id", "name", "start_unix"))
    if (
        not isinstance(pid, int)
        or isinstance(pid, bool)
        or pid <= 0
        or not isinstance(run_id, str)
        or not run_id
        or not isinstance(start, int | float)
    ):
        return None, None
    workload = name if isinstance(name, str) else ""
    return pid, _Run(run_id[:128], workload[:128], float(start))
