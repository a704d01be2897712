"""The captures a report compares as replicates: a session's own captures, its baseline's.

An alert-triggered session may take several captures one after another
(``MLPROF_ALERT_CAPTURES``; :func:`exporter.capture.engine.capture_rounds` names them).
Its report then compares capture by capture, so that the comparison measures the noise
between captures instead of standing in fixed floors for it
(``noise.between_runs`` in its JSON):

* the head is each of the session's captures (every target's file of one round);
* the base is the baseline's own captures when it took several, else the baseline and
  the newest other finished sessions of its run (of its workload when it has no run)
  that were not started by an alert and came before the session, up to as many as the
  head has.

A session of one capture, or one whose baseline is a single capture with no other
session to stand beside it, is compared as it always was: one side each.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.engine import capture_rounds
from exporter.capture.session import SESSION_FILE, SessionRecord
from exporter.profiles.capture_files import is_capture_name

__all__ = ["ReplicatePlan", "plan_replicates", "replicate_specs"]

LocalSession = Callable[[str, list[str]], AbstractContextManager[Path]]


@dataclass(frozen=True)
class ReplicatePlan:
    """What a report compares: the session's captures and its baseline's."""

    head: list[list[str]]  # per capture of the session: its files (one per target)
    base: list[list[str]] = field(default_factory=list)  # the baseline's, when several
    # Further sessions of the baseline's run, each one base replicate (newest first).
    base_sessions: list[tuple[str, list[str]]] = field(default_factory=list)


def _captures(record: SessionRecord) -> list[str]:
    return [n for t in record.targets for n in t.files if is_capture_name(n)]


def plan_replicates(
    record: SessionRecord, baseline_id: str, baselines: BaselineStore
) -> ReplicatePlan | None:
    """The replicates of ``record``'s comparison with ``baseline_id``; None when the
    session took one capture or the base side would be one (compared as one side each)."""
    head = capture_rounds(record)
    if len(head) < 2:
        return None
    store = baselines.store
    base_record = store.read_record(baseline_id)
    if base_record is None:
        return None
    own = capture_rounds(base_record)
    if len(own) >= 2:
        return ReplicatePlan(head, own)
    workload = baselines.workload_of(base_record)
    kin = [
        r
        for r in store.records()
        if r.id not in (record.id, baseline_id)
        and r.finished_ok
        and r.trigger != "alert"
        and r.created < record.created
        and _captures(r)
        and (
            r.in_run(base_record.run_id)
            if base_record.run_id
            else workload is not None and baselines.workload_of(r) == workload
        )
    ]
    kin.sort(key=lambda r: (r.created, r.id), reverse=True)
    if not kin:
        # One base capture against several: Student's t between captures then has
        # 1 + N - 2 degrees of freedom, and work that grew is beyond its reach (an input
        # phase grown to 99 % of the step went unnamed in tests/e2e/test_alert_to_capture.py),
        # where one side each keeps the rank test across steps and its floors.
        return None
    return ReplicatePlan(head, [], [(r.id, _captures(r)) for r in kin[: len(head) - 1]])


@contextlib.contextmanager
def replicate_specs(
    plan: ReplicatePlan | None,
    session_dir: Path,
    base_dir: Path | None,
    local: LocalSession,
) -> Iterator[tuple[list[str], list[str]]]:
    """(head specs, base specs) of ``plan`` as the analysis child reads them, each a
    capture file or a directory of one capture's files; ``([], [str(base_dir)])``
    without a plan, ``([], [])`` without a baseline. ``local(session_id, names)`` gives
    a session's directory (a copy of a remote one)."""
    if base_dir is None:
        yield [], []
        return
    if plan is None:
        yield [], [str(base_dir)]
        return
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlprof-reps-")))
        head = _round_specs(session_dir, plan.head, scratch / "head")
        if plan.base:
            base = _round_specs(base_dir, plan.base, scratch / "base")
        else:
            base = [str(base_dir)]
            for session_id, names in plan.base_sessions:
                base.append(str(stack.enter_context(local(session_id, names))))
        yield head, base


def _round_specs(directory: Path, rounds: list[list[str]], scratch: Path) -> list[str]:
    """Each capture of a session as one spec: its file, or (several targets) a directory
    holding its files and the session's record, which names each file's host.

    Only regular files: a session directory may be written by others, and a link under
    a capture's name is no capture (as :func:`find_captures` refuses it).
    """
    specs = []
    for index, names in enumerate(rounds):
        files = [n for n in names if _regular(directory / n)]
        if len(files) == 1:
            specs.append(str(directory / files[0]))
        elif files:
            into = scratch / str(index)
            into.mkdir(parents=True)
            record = [SESSION_FILE] if _regular(directory / SESSION_FILE) else []
            for name in [*files, *record]:
                try:  # a hard link where the file system allows, else a copy
                    os.link(directory / name, into / name, follow_symlinks=False)
                except OSError:
                    shutil.copyfile(directory / name, into / name, follow_symlinks=False)
            specs.append(str(into))
    return specs


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
