"""Watches the capture logdir and the store for sessions the engine did not run.

Programmatic sessions (``with run.profile("name"):`` in the workload) land in the
capture logdir with a ``session.json`` the SDK writes last; the watcher moves them into
the store and hands every finished, unprocessed session to the ``on_complete`` hooks
(the same ones the engine calls), so a programmatic session is converted and pushed
like any other. Sessions left unprocessed by a sidecar restart are picked up too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from exporter.capture.fingerprints import FINGERPRINT_KEY, checked_fingerprint
from exporter.capture.session import SESSION_FILE, SessionRecord, check_session_id, utcnow
from exporter.capture.store import PROFILE_DIR, SessionStore
from exporter.regular_files import open_directory, read_regular_at

__all__ = ["SessionWatcher"]

log = logging.getLogger(__name__)

ROOT_KEY = "/"  # refusal key of the staging root itself (no session id holds a slash)


class SessionWatcher:
    """``poll()`` imports finished programmatic sessions and hands over unprocessed ones."""

    def __init__(
        self,
        store: SessionStore,
        logdir: Path,
        running: Callable[[str], bool] = lambda session_id: False,
    ) -> None:
        self.store = store
        self.logdir = logdir
        self.running = running  # the engine's own sessions are its business while running
        self.on_complete: list[Callable[[SessionRecord], object]] = []
        self._settled: set[str] = set()
        self._refused: set[str] = set()
        self._import_errors: dict[str, str] = {}  # session -> the error last logged
        self._orphans_checked = False
        self.imported = 0
        self.import_failures = 0  # attempts the store refused (each retried next poll)

    def poll(self) -> tuple[str, str]:
        if not self._orphans_checked:
            self._fail_orphans()
            self._orphans_checked = True
        imported = self._import_programmatic()
        handed = self._hand_over()
        return "ok", f"{imported} imported, {handed} handed over"

    def _same_dir(self, session_dir: Path) -> bool:
        local = self.store.local_dir(session_dir.name) if self.store.is_local else None
        return local is not None and local.resolve() == session_dir.resolve()

    def _import_programmatic(self) -> int:
        root = self.logdir / PROFILE_DIR
        try:
            # The workload writes the logdir: plugins/ or profile/ made a link to another
            # directory is refused, not listed, imported from or removed in.
            root_fd = open_directory(root, below=self.logdir)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            self._refuse_once(ROOT_KEY, f"{exc}: no programmatic session is imported")
            return 0
        try:
            return self._import_from(root, root_fd)
        finally:
            os.close(root_fd)

    def _import_from(self, root: Path, root_fd: int) -> int:
        count = 0
        with os.scandir(root_fd) as listing:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in listing)
        # Remember refusals only of what is still staged (the set stays bounded).
        names = {name for name, _ in entries}
        self._refused = {k for k in self._refused if k.split("/")[0] in names or k == ROOT_KEY}
        for name, is_dir in entries:
            try:
                check_session_id(name)
            except ValueError:
                continue
            session_dir = root / name
            if not is_dir:  # a link to a directory elsewhere, or a file: never a session
                self._refuse_once(name, f"{session_dir}: not a directory (a symbolic link?); "
                                  "not imported")  # fmt: skip
                continue
            if self.running(name) or self._same_dir(session_dir):
                continue
            try:
                session_fd = open_directory(session_dir, below=self.logdir)
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._refuse_once(name, f"{exc}; not imported")
                continue
            try:
                imported = self._import_one(name, session_dir, session_fd)
            finally:
                os.close(session_fd)
            if imported:
                # fd-relative: a directory swapped for a link meanwhile is not followed.
                shutil.rmtree(name, dir_fd=root_fd, ignore_errors=True)
                count += 1
        self.imported += count
        return count

    def _import_one(self, name: str, session_dir: Path, session_fd: int) -> bool:
        record = _read(session_fd, session_dir / SESSION_FILE)
        if record is None or record.status == "running":
            return False  # an engine capture still staging, or the SDK still writing
        if not self._may_write(name, record):
            return False
        with os.scandir(session_fd) as listing:
            listed = sorted((e.name, e.is_file(follow_symlinks=False)) for e in listing)
        staged = [n for n, _ in listed if n != SESSION_FILE and not n.startswith(".")]
        refused = [n for n, regular in listed if not regular and n in staged]
        if refused:  # links, FIFOs, directories: never copied into the store
            shown = ", ".join(refused[:5])
            self._refuse_once(f"{name}/files", f"session {name}: {len(refused)} entries are "
                              f"not regular files and are not imported: {shown}")  # fmt: skip
        try:
            imported = []
            for file_name in staged:
                if file_name in refused:
                    continue
                self.store.import_file(name, session_dir / file_name, below=self.logdir)
                imported.append(file_name)
            # The workload wrote this record: it names only files of this session.
            present = set(imported) | set(self.store.files(name))
            for target in record.targets:
                target.files = [f for f in target.files if f in present]
            self.store.write_record(record)
        except Exception as exc:  # e.g. a transient gs:// error: retried on the next poll
            self.import_failures += 1
            said = f"{type(exc).__name__}: {exc}"
            # Logged once per condition, not once per poll while a bucket is down.
            if self._import_errors.get(name) != said:
                self._import_errors[name] = said
                log.warning(
                    "cannot import session %s into %s (retried every poll; logged again "
                    "only when the error changes): %s", name, self.store.url, said,
                )  # fmt: skip
            return False
        self._settled.discard(name)
        if self._import_errors.pop(name, None) is not None:
            log.info("session %s imported after the store recovered", name)
        log.info("imported %s session %s", record.trigger, name)
        return True

    def _refuse_once(self, key: str, message: str) -> None:
        if key not in self._refused:
            self._refused.add(key)
            log.warning("%s", message)

    def _may_write(self, name: str, record: SessionRecord) -> bool:
        """Whether the record found under directory ``name`` may become that session's."""
        if record.id != name:
            # The record is written under the directory's name, never under one the
            # workload chose, so it cannot replace another session's record.
            log.warning("session %s: its session.json says id %r; using %r", name, record.id, name)
            record.id = name
        existing = self.store.read_record(name)
        if existing is None or existing.status == "running":
            return True
        if any(t.unimported for t in existing.targets):
            return True  # the engine left these files for us to import (see engine.py)
        if name not in self._refused:
            self._refused.add(name)
            log.warning("session %s already exists in %s; %s is not imported over it",
                        name, self.store.url, self.logdir / PROFILE_DIR / name)  # fmt: skip
        return False

    def _fail_orphans(self) -> None:
        """Sessions left ``running`` by a previous sidecar process can never finish."""
        for session_id in self.store.session_ids():
            record = self.store.read_record(session_id)
            if record is None or record.status != "running" or self.running(session_id):
                continue
            for target in record.targets:
                if target.status == "running":
                    target.status, target.error = "failed", "the sidecar stopped during the capture"
            record.status, record.finished = record.summarize(), utcnow()
            self.store.write_record(record)
            log.warning("session %s was left running by a previous sidecar: %s", session_id,
                        record.status)  # fmt: skip

    def _hand_over(self) -> int:
        count = 0
        present = self.store.session_ids()
        # Sessions deleted by retention are forgotten (the set stays as large as the store).
        self._settled &= set(present)
        for session_id in present:
            if session_id in self._settled or self.running(session_id):
                continue
            record = self.store.read_record(session_id)
            if record is None or record.status == "running":
                continue
            if (
                any(t.unimported for t in record.targets)
                and (self.logdir / PROFILE_DIR / session_id / SESSION_FILE).is_file()
            ):
                continue  # its kept files are imported first (see _import_programmatic)
            self._settled.add(session_id)
            # Unprocessed, or processed but without a report (a restart lost the queued
            # report): the hooks skip what they have done already.
            if record.status != "failed" and (record.processed is None or record.report is None):
                for hook in self.on_complete:
                    hook(record)
                count += 1
        return count


def _read(directory_fd: int, path: Path) -> SessionRecord | None:
    try:
        data = read_regular_at(directory_fd, path.name, path)
        return SessionRecord.model_validate_json(_forged_fingerprint_unknown(data))
    except FileNotFoundError:
        return None
    except (ValidationError, ValueError, OSError, RecursionError) as exc:
        log.warning("%s: not a session record (%s)", path, exc)
        return None


def _forged_fingerprint_unknown(data: bytes) -> bytes | str:
    """The record with a ``config_fingerprint`` that is not one (a number, a path, a
    huge string: the workload wrote it) made unknown: the session loses only that, and
    nothing is stored to be matched against. Raises ValueError as ``json.loads`` does."""
    raw = json.loads(data)
    if not isinstance(raw, dict) or raw.get(FINGERPRINT_KEY) is None:
        return data
    fingerprint = checked_fingerprint(raw[FINGERPRINT_KEY])
    if fingerprint is not None:
        return data
    raw[FINGERPRINT_KEY] = None
    return json.dumps(raw)
