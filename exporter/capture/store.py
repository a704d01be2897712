"""Session store: an fsspec URL in XProf's logdir layout, the store being the record.

Layout (``xprof --logdir <store>`` opens it as is)::

    plugins/profile/<session_id>/<host>_<port>.xplane.pb   one capture per target
    plugins/profile/<session_id>/session.json              the SessionRecord

``file://`` (or a plain path) is the default, ``memory://`` serves tests, ``gs://`` and
``s3://`` work through the ``gcp``/``aws`` extras (gcsfs, s3fs). Credentials and
endpoints come from each library's standard variables: ``GOOGLE_APPLICATION_CREDENTIALS``
(or the metadata server) and ``STORAGE_EMULATOR_HOST`` for gcsfs; ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` and ``AWS_ENDPOINT_URL`` for s3fs.

>>> store = SessionStore("memory://doc")
>>> store.session_dir("s1")
'/doc/plugins/profile/s1'
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import posixpath
import shutil
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from exporter.capture.session import SESSION_FILE, SessionRecord, check_session_id
from exporter.errors import ConfigError
from exporter.regular_files import open_directory, open_regular, replace_file_at

__all__ = ["PROFILE_DIR", "SessionStore"]

log = logging.getLogger(__name__)

PROFILE_DIR: Final = "plugins/profile"
COPY_CHUNK_BYTES: Final = 1 << 20  # imports copy captures (tens of MB) a MiB at a time


class SessionStore:
    """Sessions under ``<url>/plugins/profile``; every id is checked before use."""

    def __init__(self, url: str | os.PathLike[str]) -> None:
        text = os.fspath(url)
        try:
            fs, root = fsspec.core.url_to_fs(text)
        except (ImportError, ValueError) as exc:
            raise ConfigError(
                f"MLPROF_STORE={text!r}: cannot open this store ({exc}); gs:// needs "
                "mlprof-exporter[gcp], s3:// needs mlprof-exporter[aws]"
            ) from None
        self.url = text
        self.is_local = isinstance(fs, LocalFileSystem)
        self.root = os.path.realpath(root) if self.is_local else str(root).rstrip("/")
        if not self.is_local:
            _settle_bucket_type(fs, self.root)
            fs = _FailuresAsOSError(fs)
        self.fs: Any = fs
        self.profile_root = posixpath.join(self.root, PROFILE_DIR)
        # Re-entrant: update_record holds it around read, change and write_record.
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"SessionStore({self.url!r})"

    # -- paths -------------------------------------------------------------------
    def session_dir(self, session_id: str) -> str:
        """The directory of a session; raises ValueError for an id that could escape."""
        check_session_id(session_id)
        path = posixpath.join(self.profile_root, session_id)
        if self.is_local:
            resolved = os.path.realpath(path)
            if Path(resolved).parent != Path(os.path.realpath(self.profile_root)):
                raise ValueError(f"session {session_id!r}: resolves outside the store")
        return path

    def local_dir(self, session_id: str) -> Path | None:
        """The session directory as a local path, when the store is local."""
        return Path(self.session_dir(session_id)) if self.is_local else None

    def local_copy(self, session_id: str) -> Path | None:
        """The session as a local directory: itself on a local store, else a copy.

        A remote session is downloaded once per process into a temporary directory that
        is removed at exit: the CLI and the analysis jobs are one command each, and what
        they read (captures, ``analysis.json``) is then read exactly as from a local
        store. None when the store has no such session; OSError when the bucket fails.
        """
        local = self.local_dir(session_id)
        if local is not None:
            return local if local.is_dir() else None
        key = (self.url, session_id)
        with _COPIES_LOCK:
            known = _COPIES.get(key)
            if known is not None:
                return known
            names = [n for n in self.files(session_id) if _is_plain_name(n)]
            if not names:
                return None
            # Named as the session (reports and messages show the directory's name).
            parent = tempfile.mkdtemp(dir=_copies_root())
            target = Path(parent) / session_id
            target.mkdir()
            directory = self.session_dir(session_id)
            try:
                for name in names:
                    self.fs.get_file(posixpath.join(directory, name), str(target / name))
            except BaseException:
                shutil.rmtree(parent, ignore_errors=True)  # never half a session kept
                raise
            _COPIES[key] = target
            return target

    def local_copy_file(self, session_id: str, name: str) -> Path | None:
        """A file of :meth:`local_copy`; ValueError for a name that is not plain."""
        _check_file_name(name)  # names come from session.json, which a workload may write
        directory = self.local_copy(session_id)
        return None if directory is None else directory / name

    # -- records -----------------------------------------------------------------
    def write_record(self, record: SessionRecord) -> None:
        """Write ``session.json`` (atomically on a local store)."""
        directory = self.session_dir(record.id)
        data = record.model_dump_json(indent=2).encode() + b"\n"
        with self._lock:
            self.fs.makedirs(directory, exist_ok=True)
            if self.is_local:
                _replace_local(directory, SESSION_FILE, data)  # never half a record
            else:
                self.fs.pipe_file(posixpath.join(directory, SESSION_FILE), data)

    def read_record(self, session_id: str) -> SessionRecord | None:
        """The record of a session, or None when there is none (or it cannot be parsed)."""
        try:
            path = posixpath.join(self.session_dir(session_id), SESSION_FILE)
        except ValueError:
            return None
        try:
            data = self.fs.cat_file(path)
        except (FileNotFoundError, OSError):
            return None
        try:
            return SessionRecord.model_validate_json(data)
        except ValidationError as exc:
            log.warning("%s: not a session record (%s)", path, exc.errors()[0]["msg"])
            return None

    def update_record(
        self, session_id: str, change: Callable[[SessionRecord], None]
    ) -> SessionRecord | None:
        """Read, ``change`` and write a record as one step; None when there is none.

        Hooks of one session (flame graphs, the report) edit its record from their own
        threads: each sees the other's edit instead of writing back a stale copy.
        """
        with self._lock:
            record = self.read_record(session_id)
            if record is None:
                return None
            change(record)
            self.write_record(record)
            return record

    def session_ids(self) -> list[str]:
        """Ids of every session directory in the store, sorted."""
        try:
            entries = self.fs.ls(self.profile_root, detail=False)
        except (FileNotFoundError, OSError):
            return []
        ids = []
        for entry in entries:
            name = posixpath.basename(str(entry).rstrip("/"))
            with contextlib.suppress(ValueError):
                ids.append(check_session_id(name))
        return sorted(ids)

    def records(self) -> list[SessionRecord]:
        """Every readable record, oldest first."""
        found = [r for r in map(self.read_record, self.session_ids()) if r is not None]
        return sorted(found, key=lambda r: (r.created, r.id))

    # -- files -------------------------------------------------------------------
    def files(self, session_id: str) -> dict[str, int]:
        """Names and sizes of a session's files."""
        try:
            entries = self.fs.ls(self.session_dir(session_id), detail=True)
        except (FileNotFoundError, OSError):
            return {}
        return {
            posixpath.basename(str(e["name"]).rstrip("/")): int(e.get("size") or 0)
            for e in entries
            if e.get("type") == "file"
        }

    def import_file(self, session_id: str, source: Path, *, below: Path | None = None) -> int:
        """Copy a local capture file into the session, then remove it; return its size.

        The file is the workload's (its profiler or SDK wrote it): only a regular file is
        imported, opened once without following a link (nor any directory link under
        ``below``, the trusted logdir) and copied from that descriptor, so what lands in
        the store is never a link and never a file from elsewhere. NotRegularFileError
        (an OSError) otherwise.
        """
        directory = self.session_dir(session_id)
        target = posixpath.join(directory, source.name)
        _check_file_name(source.name)
        with open_regular(source, follow_symlinks=False, below=below) as handle:
            st = os.fstat(handle.fileno())
            if self.is_local:
                with contextlib.suppress(OSError):
                    there = Path(target).lstat()
                    if (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino):
                        return st.st_size  # the profiler server wrote straight into the store
                Path(directory).mkdir(parents=True, exist_ok=True)
                _replace_local(directory, source.name, handle)
            else:
                self.fs.makedirs(directory, exist_ok=True)
                with self.fs.open(target, "wb") as out:
                    shutil.copyfileobj(handle, out, COPY_CHUNK_BYTES)
        if below is None:
            source.unlink()
        else:
            parent = open_directory(source.parent, below=below)
            try:
                os.unlink(source.name, dir_fd=parent)
            finally:
                os.close(parent)
        return st.st_size

    def write_file(self, session_id: str, name: str, data: bytes) -> None:
        """Write a derived file (e.g. a flame graph) into the session directory.

        On a local store the file is written beside and renamed into place: a link left
        under ``name`` is replaced, never written through.
        """
        _check_file_name(name)
        directory = self.session_dir(session_id)
        self.fs.makedirs(directory, exist_ok=True)
        if self.is_local:
            _replace_local(directory, name, data)
        else:
            self.fs.pipe_file(posixpath.join(directory, name), data)

    @contextlib.contextmanager
    def local_file(self, session_id: str, name: str) -> Iterator[Path]:
        """A local path of a session file (a temporary copy for remote stores)."""
        _check_file_name(name)  # names come from session.json, which a workload may write
        path = posixpath.join(self.session_dir(session_id), name)
        if self.is_local:
            yield Path(path)
            return
        with tempfile.TemporaryDirectory(prefix="mlprof-session-") as tmp:
            local = Path(tmp) / name
            self.fs.get_file(path, str(local))
            yield local

    def delete(self, session_id: str) -> None:
        directory = self.session_dir(session_id)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(directory, recursive=True)

    # -- retention ---------------------------------------------------------------
    def enforce_retention(
        self, max_count: int, max_bytes: int, keep: Collection[str] = ()
    ) -> list[str]:
        """Delete finished sessions beyond ``max_count``/``max_bytes`` (0 = no limit).

        Sessions that failed go first (a burst of refused requests must not push out
        the history), then the oldest. Never deleted: running sessions, finished ones
        not yet processed (converted and pushed), the newest session, and ``keep`` (the
        sessions a baseline mark names). Returns the deleted ids.
        """
        if not max_count and not max_bytes:
            return []
        records = self.records()
        sizes = {r.id: sum(self.files(r.id).values()) for r in records}
        count, total = len(records), sum(sizes.values())
        deleted = []
        candidates = sorted(records[:-1], key=lambda r: r.finished_ok)  # stable: oldest first
        for record in candidates:
            over_count = max_count and count > max_count
            over_bytes = max_bytes and total > max_bytes
            if not (over_count or over_bytes):
                break
            if record.status == "running" or record.id in keep:
                continue
            if record.finished_ok and record.processed is None:
                continue  # its flame graphs are not made yet (conversion is queued)
            self.delete(record.id)
            deleted.append(record.id)
            count -= 1
            total -= sizes[record.id]
        if deleted:
            log.info("retention: deleted sessions %s", ", ".join(deleted))
        return deleted


class _FailuresAsOSError:
    """A remote filesystem whose calls fail with OSError, whatever the client raised.

    gcsfs raises OSError subclasses (aiohttp's connection errors) or its HttpError, s3fs
    botocore's EndpointConnectionError (not an OSError): the store and its callers catch
    OSError for "the bucket failed" (kept for a retry, counted, reported in one line), so
    every client's failure reads the same. Errors of the call itself (ValueError,
    TypeError, ...) and attributes pass through as they are.
    """

    _PASSED: Final = (OSError, ValueError, TypeError, KeyError, NotImplementedError)

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fs, name)
        if name.startswith("_") or not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except self._PASSED:
                raise
            except Exception as exc:
                raise OSError(f"{type(exc).__name__}: {exc}") from exc

        return call

    def __repr__(self) -> str:
        return repr(self._fs)


_COPIES: dict[tuple[str, str], Path] = {}
_COPIES_LOCK = threading.Lock()
_COPIES_DIR: list[str] = []


def _copies_root() -> str:
    if not _COPIES_DIR:
        root = tempfile.mkdtemp(prefix="mlprof-sessions-")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _COPIES_DIR.append(root)
    return _COPIES_DIR[0]


def _settle_bucket_type(fs: Any, root: str) -> None:
    """Look a GCS bucket's type up once, so gcsfs does not retry (and warn) on every call.

    gcsfs's ExtendedGcsFileSystem (the default since 2026.x) asks the Storage Control API
    for the bucket's layout before each open and listing, and caches only an answer it
    could read: where it cannot (no permission for that API, or an emulator, which has
    none) it logs ``Could not determine bucket type ... falling back`` each time, about
    once a second in the sidecar. Here the lookup is made once; an unreadable layout is
    pinned as the plain layout gcsfs falls back to anyway, so its warning appears at most
    once per process. An emulator (``STORAGE_EMULATOR_HOST``) is plain without asking.
    Attributes of gcsfs's own (``_storage_layout_cache``, ``_sync_lookup_bucket_type``):
    other filesystems and other gcsfs versions are left as they are.
    """
    cache = getattr(fs, "_storage_layout_cache", None)
    lookup = getattr(fs, "_sync_lookup_bucket_type", None)
    if not isinstance(cache, dict) or lookup is None:
        return
    try:
        from gcsfs.extended_gcsfs import BucketType  # type: ignore[import-untyped]
    except ImportError:
        return
    bucket = root.split("/", 1)[0]
    if not bucket or bucket in cache:
        return
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        cache[bucket] = BucketType.NON_HIERARCHICAL
        return
    try:
        found = lookup(bucket)
    except Exception as exc:  # the store's own calls report an unreachable bucket
        log.debug("gs://%s: bucket type not read (%s)", bucket, exc)
        found = BucketType.UNKNOWN
    if found == BucketType.UNKNOWN:
        log.info("gs://%s: bucket layout unknown; used as a plain (flat) bucket", bucket)
        found = BucketType.NON_HIERARCHICAL
    cache[bucket] = found


def _is_plain_name(name: str) -> bool:
    try:
        _check_file_name(name)
    except ValueError:
        return False
    return True


def _replace_local(directory: str, name: str, data: bytes | BinaryIO) -> None:
    """Put ``data`` (bytes or a file to copy) under ``name`` in a local session directory."""
    fd = open_directory(Path(directory))
    try:
        replace_file_at(fd, name, data, sync=False)
    finally:
        os.close(fd)


def _check_file_name(name: str) -> str:
    """A file name inside a session directory: one path component, no leading dot."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or Path(name).name != name:
        raise ValueError(f"file name {name!r}: expected a plain name inside the session directory")
    return name
