"""``run_started`` and ``run_ended`` events, from the files the SDK writes.

A run starts when its ``runs/<run_id>.json`` appears (the SDK writes it before the first
step) and ends at its step log's ``end`` line (``Run.close``). Runs already announced are
remembered in ``sidecar/runs-announced.json``, so a sidecar restart announces none twice.
Every file is the workload's: a large or malformed one is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from exporter import schema
from exporter.regular_files import read_regular
from exporter.state_files import BadStateError, load_state, save_state, set_aside

if TYPE_CHECKING:
    from exporter.sinks.events import Emit

__all__ = ["RunEvents"]

log = logging.getLogger(__name__)

MAX_RUN_FILE_BYTES = 1 << 20  # run.json holds identity and configs: far smaller
MAX_REMEMBERED = 10_000  # announced run files kept in the state file, oldest forgotten
# A sidecar starting on a shared dir it has no record of announces the runs written in
# the last hour; older ones are history, not news.
FIRST_POLL_MAX_AGE_S = 3600.0
STATE_FILE = "runs-announced.json"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _system_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    system = info.get("system")
    if not isinstance(system, dict):
        return {}
    keys = ("backend", "device_kind", "device_count", "process_count", "platform")
    return {k: system[k] for k in keys if k in system}


class _AnnouncedState(BaseModel):
    """``sidecar/runs-announced.json``: the run files already announced, oldest first."""

    announced: list[str] = Field(default_factory=list)


class RunEvents:
    """Announces runs as they start (``poll``) and end (``ended``, a step-log hook)."""

    def __init__(self, shared_dir: Path, emit: Emit) -> None:
        self.runs_dir = shared_dir / schema.RUNS_DIR
        self.state_file = shared_dir / schema.SIDECAR_DIR / STATE_FILE
        self.shared_dir = shared_dir
        self.emit = emit
        self.state_discarded: str | None = None  # why the state file was set aside
        self._save_failed = False
        announced = self._load()
        self._announced: dict[str, None] = dict.fromkeys(announced or ())
        self._fresh = announced is None  # no (usable) record: skip old runs once

    def _load(self) -> list[str] | None:
        """The announced run files; None when there is no usable record.

        The workload can write ``sidecar/`` too: the file is read as every state file is
        (bounded, regular, no link followed, a bad one moved aside), never fatal.
        """
        try:
            state = load_state(self.state_file, _AnnouncedState)
        except BadStateError as exc:
            self.state_discarded = str(exc)
            set_aside(self.state_file, str(exc))
            return None
        return state.announced if state is not None else None

    def _save(self) -> None:
        while len(self._announced) > MAX_REMEMBERED:
            del self._announced[next(iter(self._announced))]
        data = json.dumps({"announced": list(self._announced)}).encode()
        try:
            save_state(self.state_file, data)
        except OSError as exc:  # e.g. sidecar/ made a link: nothing written through it
            if not self._save_failed:
                log.warning("cannot save %s (%s): runs may be announced again after a restart",
                            self.state_file, exc.strerror or exc)  # fmt: skip
            self._save_failed = True
        else:
            self._save_failed = False

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            # Bounded, a regular file only (a FIFO would block, /dev/zero never end), and
            # no link followed under the shared dir (runs/ itself included).
            data = json.loads(read_regular(path, MAX_RUN_FILE_BYTES, below=self.shared_dir))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("run file %s unreadable (%s): skipped", path, exc)
            return None
        fields = ("run_id", "name", "host")
        if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) and data[k] for k in fields
        ):
            log.warning("run file %s: expected run_id, name and host strings: skipped", path)
            return None
        return data

    def poll(self) -> int:
        """Announce each run file not announced before; return how many were new."""
        try:
            names = sorted(path.name for path in self.runs_dir.iterdir())
        except OSError:
            return 0
        new = [n for n in names if n.endswith(".json") and n not in self._announced]
        oldest = time.time() - FIRST_POLL_MAX_AGE_S if self._fresh else None
        self._fresh = False
        for name in new:
            path = self.runs_dir / name
            self._announced[name] = None  # a bad file is not read again every poll
            if oldest is not None and _mtime(path) < oldest:
                continue
            info = self._read(path)
            if info is None:
                continue
            software = info.get("software")
            self.emit(
                "run_started",
                f"run {info['run_id']} of {info['name']} started on {info['host']}",
                run_id=info["run_id"],
                workload=info["name"],
                host=info["host"],
                start_time=info.get("start_time"),
                pid=info.get("pid"),
                profiler_port=info.get("profiler_port"),
                software=software if isinstance(software, dict) else None,
                system=_system_summary(info),
                host_profiling=info.get("host_profiling"),
            )
        if new:
            self._save()
        return len(new)

    def ended(
        self, identity: Mapping[str, str], record: Mapping[str, Any], steps: int, tokens: int
    ) -> None:
        """Announce the end of a run: called with the step log's ``end`` line."""
        run_id = identity["run_id"]
        end = record.get("time")
        info = self._read(self.runs_dir / f"{run_id}.json") if "/" not in run_id else None
        start = info.get("start_unix") if info else None
        duration = (
            round(end - start, 3)
            if isinstance(end, int | float) and isinstance(start, int | float)
            else None
        )
        self.emit(
            "run_ended",
            f"run {run_id} of {identity['workload']} ended on {identity['host']} after "
            f"{steps} steps",
            run_id=run_id,
            workload=identity["workload"],
            host=identity["host"],
            steps=steps,
            tokens=tokens,
            duration_s=duration,
        )
