"""Baselines: which earlier session a capture is compared against.

A mark is a small JSON file in the session store, ``baselines/<workload>.json`` (or
``baselines/run/<run_id>.json`` for one run), written by ``mlprof baseline set`` or
``PUT /api/v1/baselines/{workload}``. Names are checked like session ids (one path
component of ``A-Z a-z 0-9 . _ -``), so a mark can never be written outside the store.

Without a mark, the baseline of a session is the newest earlier finished session of
the same workload that an alert did not start (an alert-started capture shows the
problem, not the good state).
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from exporter.capture.session import SessionRecord, check_session_id
from exporter.capture.store import MAX_MARK_BYTES, MAX_REPORT_BYTES, SessionStore

__all__ = ["BASELINES_DIR", "Baseline", "BaselineStore", "check_name"]

BASELINES_DIR = "baselines"
RUNS_SUBDIR = "run"


def check_name(value: str, what: str = "workload") -> str:
    """``value`` if it is a safe mark name; ValueError saying what is expected."""
    try:
        return check_session_id(value)
    except ValueError:
        raise ValueError(
            f"{what} {value!r}: expected 1-128 characters of A-Z a-z 0-9 . _ -, starting "
            "with a letter or digit, without '..' or path separators"
        ) from None


# Earlier runs a session's step time is judged against (their reports' median step).
HISTORY_RUNS = 10
# Earlier runs whose captures give each frame's spread (each is read: its side cache,
# else its capture). Two more than the 8 a one-capture comparison needs before the runs
# judge its frames (noise.MIN_HISTORY_ALONE; docs/analysis.md, "Each frame's own
# history"), so that a run that cannot be read, or holds no steps, does not send its
# reports back to the fixed floors.
HISTORY_SIDES = 10
REPORT = "analysis.json"


@dataclass(frozen=True)
class Baseline:
    """The session a capture is compared against, and why that one."""

    session_id: str
    reason: str  # "marked for workload W" | "marked for run R" | "newest earlier ..."


class BaselineStore:
    """Baseline marks in the session store; ``choose`` picks a session's baseline.

    ``workload_of`` names a record's workload and ``config_of`` its configuration's
    fingerprint (the sidecar reads both from the run's identity in the shared dir when
    the record has none).
    """

    def __init__(
        self,
        store: SessionStore,
        workload_of: Callable[[SessionRecord], str | None] = lambda record: record.workload,
        config_of: Callable[[SessionRecord], str | None] = lambda r: r.config_fingerprint,
    ) -> None:
        self.store = store
        self.workload_of = workload_of
        self.config_of = config_of
        self.root = posixpath.join(store.root, BASELINES_DIR)

    def _path(self, name: str, run: bool = False) -> str:
        check_name(name, "run id" if run else "workload")
        parts = [self.root, RUNS_SUBDIR, f"{name}.json"] if run else [self.root, f"{name}.json"]
        return posixpath.join(*parts)

    def set(
        self, name: str, session_id: str, *, run: bool = False, by: str = "cli"
    ) -> dict[str, Any]:
        """Mark ``session_id`` as the baseline of a workload (or of a run)."""
        check_session_id(session_id)
        if self.store.read_record(session_id) is None:
            raise LookupError(f"no session {session_id!r} in the store {self.store.url}")
        mark = {
            "workload" if not run else "run_id": name,
            "session_id": session_id,
            "set_by": by,
            "set_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path = self._path(name, run)
        self.store.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.store.fs.pipe_file(path, json.dumps(mark, indent=2).encode() + b"\n")
        return mark

    def get(self, name: str, *, run: bool = False) -> dict[str, Any] | None:
        """The mark of a workload (or run), or None (a bad mark is set aside: logged
        once, counted; marks are the bucket's, anyone's who may write there)."""
        path = self._path(name, run)
        try:
            data = self.store.read_json(path, MAX_MARK_BYTES, "baseline mark")
        except OSError:
            return None
        if data is None or not isinstance(data.get("session_id"), str):
            return None
        return data

    def marks(self, *, strict: bool = False) -> list[dict[str, Any]]:
        """Every workload's mark; ``strict``: a failing bucket is an OSError, not []."""
        try:
            entries = self.store.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        except OSError:
            if strict:
                raise
            return []
        found = []
        for entry in sorted(entries):
            name = posixpath.basename(str(entry))
            if name.endswith(".json"):
                try:
                    mark = self.get(name[: -len(".json")])
                except ValueError:
                    continue
                if mark is not None:
                    found.append(mark)
        return found

    def pinned(self) -> frozenset[str]:
        """Every session a mark names (of a workload or of a run): retention keeps them."""
        found = {m["session_id"] for m in self.marks()}
        try:
            runs = self.store.fs.ls(posixpath.join(self.root, RUNS_SUBDIR), detail=False)
        except (FileNotFoundError, OSError):
            runs = []
        for entry in runs:
            name = posixpath.basename(str(entry))
            if name.endswith(".json"):
                try:
                    mark = self.get(name[: -len(".json")], run=True)
                except ValueError:
                    continue
                if mark is not None:
                    found.add(mark["session_id"])
        return frozenset(found)

    def choose(self, record: SessionRecord) -> Baseline | None:
        """The baseline of ``record``: the run's mark, the workload's, else the newest
        earlier finished session of the same workload not started by an alert."""
        for name, run in ((record.run_id, True), (self.workload_of(record), False)):
            if not name:
                continue
            try:
                mark = self.get(name, run=run)
            except ValueError:
                continue
            usable = mark is not None and mark["session_id"] != record.id
            if usable and self.store.read_record(mark["session_id"]) is not None:  # type: ignore[index]
                kind = "run" if run else "workload"
                return Baseline(mark["session_id"], f"marked as the baseline of {kind} {name}")  # type: ignore[index]
        workload = self.workload_of(record)
        earlier = self._earlier(record)
        if not earlier:
            return None
        newest = max(earlier, key=lambda r: (r.created, r.id))
        return Baseline(
            newest.id, f"newest earlier session of workload {workload} not started by an alert"
        )

    def history(
        self, record: SessionRecord, limit: int = HISTORY_RUNS, exclude: Collection[str] = ()
    ) -> list[float]:
        """Median step times (ns) of the workload's earlier runs, from their reports.

        The newest ``limit`` earlier finished sessions of ``record``'s workload that an
        alert did not start and whose report gives a median step: the spread a
        comparison judges the step time against (``compare_sides(history=...)``). Read
        from each ``analysis.json``, never by decoding a capture again. ``exclude``: the
        sessions compared (the baseline is no earlier run of its own comparison).
        """
        earlier = [r for r in self._same_workload_newest(record) if r.id not in exclude]
        medians: list[float] = []
        for r in earlier:
            if len(medians) >= limit:
                break
            try:
                path = posixpath.join(self.store.session_dir(r.id), REPORT)
                report = self.store.read_json(path, MAX_REPORT_BYTES, "analysis report")
                median = report["facts"]["steps"]["median_ms"]  # type: ignore[index]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # no report yet, one without steps, or one set aside
            if isinstance(median, int | float) and median > 0:
                medians.append(float(median) * 1e6)
        return medians

    def history_sessions(
        self, record: SessionRecord, limit: int = HISTORY_SIDES, exclude: Collection[str] = ()
    ) -> list[str]:
        """The newest ``limit`` earlier sessions of ``record``'s workload (the same name
        and configuration) not started by an alert, but those in ``exclude`` (the
        sessions compared): the runs whose captures give each frame's between-run spread
        (``compare_sides(history_sides=...)``)."""
        earlier = [r.id for r in self._same_workload_newest(record) if r.id not in exclude]
        return earlier[:limit]

    def _same_workload_newest(self, record: SessionRecord) -> list[SessionRecord]:
        """Earlier sessions of the same workload and configuration, newest first."""
        config = self.config_of(record)
        same = [r for r in self._earlier(record) if self.config_of(r) == config]
        return sorted(same, key=lambda r: (r.created, r.id), reverse=True)

    def _earlier(self, record: SessionRecord) -> list[SessionRecord]:
        """Finished sessions of ``record``'s workload before it, not started by an alert,
        of its kind: a torch.profiler trace and an XProf capture share no frames. (The
        baseline may differ in configuration, the history not: ``history_sessions``.)"""
        workload = self.workload_of(record)
        if not workload:
            return []
        return [
            r
            for r in self.store.records()
            if r.id != record.id
            and r.finished_ok
            and r.trigger != "alert"
            and r.created < record.created
            and r.kind == record.kind
            and self.workload_of(r) == workload
        ]
