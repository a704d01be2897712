"""Session store: an fsspec URL in XProf's logdir layout, the store being the record.

Layout (``xprof --logdir <store>`` opens it as is)::

    plugins/profile/<session_id>/<host>_<port>.xplane.pb   one capture per target
    plugins/profile/<session_id>/session.json              the SessionRecord

``file://`` (or a plain path) is the default, ``memory://`` serves tests, ``gs://`` and
``s3://`` work through the ``gcp``/``aws`` extras (gcsfs, s3fs). Credentials and
endpoints come from each library's standard variables: ``GOOGLE_APPLICATION_CREDENTIALS``
(or the metadata server) and ``STORAGE_EMULATOR_HOST`` for gcsfs; ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` and ``AWS_ENDPOINT_URL`` for s3fs.

A store is shared: another tenant of the bucket, or a workload that may write there,
can put any object under its prefix. So every object is read with a size bound
(``MAX_*_BYTES``; a local store's files also as regular files, no link followed), its
JSON through the bounded parser (:mod:`exporter.json_limits`), and a record whose id is
not its directory's is set aside (logged once, counted in :attr:`SessionStore.refused`),
never written back under the id it claims. A remote store's listings and small reads
are bounded in time (:data:`STORE_CALL_TIMEOUT_S`), and its endpoint is checked with one
TCP connect before the first call (and again after a failure), so a store that cannot
be reached fails in seconds with one line (:class:`StoreUnreachableError`), not after
the client's own minute of retries.

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
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final
from urllib.parse import urlsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from exporter.capture.session import SESSION_FILE, SessionRecord, check_session_id
from exporter.errors import ConfigError, UnavailableError
from exporter.json_limits import JSONInputError, load_json_object
from exporter.profiles.capture_files import is_capture_name
from exporter.regular_files import (
    MAX_JSON_BYTES,
    FileTooLargeError,
    NotRegularFileError,
    open_directory,
    open_regular,
    read_regular,
    replace_file_at,
)
from exporter.schema import TORCH_TRACE_SUFFIXES

__all__ = [
    "MAX_ERROR_BYTES",
    "MAX_MARK_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_REPORT_BYTES",
    "PROFILE_DIR",
    "STORE_CALL_TIMEOUT_S",
    "SessionStore",
    "StoreUnreachableError",
]

log = logging.getLogger(__name__)

PROFILE_DIR: Final = "plugins/profile"
COPY_CHUNK_BYTES: Final = 1 << 20  # imports copy captures (tens of MB) a MiB at a time
# Bounds of the objects read whole into memory. A record is a few KiB, a baseline mark
# and an analysis error a few hundred bytes; a report (analysis.json, summary.html) is
# a few hundred KiB to a few MiB. Past these, the object is not one: refused, counted.
MAX_RECORD_BYTES: Final = MAX_JSON_BYTES
MAX_MARK_BYTES: Final = 64 << 10
MAX_ERROR_BYTES: Final = 1 << 20
MAX_REPORT_BYTES: Final = 32 << 20
# A listing or small read of a remote store that takes longer is an outage: gcsfs
# retries a failing call six times with backoff (67 s seen on a 503), which a request
# (GET /api/v1/baselines) or a readiness probe must not wait out.
STORE_CALL_TIMEOUT_S: Final = 15.0
# Writes of at most this many bytes (records, marks, errors) are bounded the same way.
SMALL_WRITE_BYTES: Final = 1 << 20
# Threads that run those bounded calls (hung calls hold one each until the client's
# own retries end; beyond this many, calls wait and time out).
STORE_CALL_THREADS: Final = 16
# The endpoint's TCP connect, before the first call and after a failure: DNS and
# refused connections answer in milliseconds; a black-holed address in this long.
CONNECT_TIMEOUT_S: Final = 3.0
# After the endpoint was found unreachable, calls fail at once for this long.
UNREACHABLE_RECHECK_S: Final = 5.0
# What the commands read from a session (the CLI and MCP copy only these from a bucket):
# captures, their side caches (exporter.analysis.sides.cache.SUFFIX), device-memory
# profiles, the record and the report. Each with its bound (captures: streamed to disk).
_SIDE_CACHE_SUFFIX: Final = ".sides.json.gz"
_SIDE_CACHE_MAX_BYTES: Final = 32 << 20  # exporter.analysis.sides.cache.MAX_FILE_BYTES
_PPROF_SUFFIXES: Final = (".pprof.gz", ".pprof")
_PPROF_MAX_BYTES: Final = 64 << 20
REPORT_FILE: Final = "analysis.json"


class StoreUnreachableError(OSError):
    """The store's endpoint cannot be reached or did not answer in time (one line)."""


class SessionStore:
    """Sessions under ``<url>/plugins/profile``; every id is checked before use."""

    def __init__(self, url: str | os.PathLike[str]) -> None:
        text = os.fspath(url)
        try:
            fs, root = fsspec.core.url_to_fs(text, **_client_options(text))
        except (ImportError, ValueError) as exc:
            raise ConfigError(
                f"MLPROF_STORE={text!r}: cannot open this store ({exc}); gs:// needs "
                "mlprof-exporter[gcp], s3:// needs mlprof-exporter[aws]"
            ) from None
        self.url = text
        self.is_local = isinstance(fs, LocalFileSystem)
        self.root = os.path.realpath(root) if self.is_local else str(root).rstrip("/")
        # Objects set aside, each counted once, by reason (too_large, not_regular,
        # invalid, id_mismatch): the sidecar exports mlprof_store_objects_refused_total.
        self.refused: Counter[str] = Counter()
        self._said: set[str] = set()  # what was logged as set aside (once each)
        self._said_lock = threading.Lock()
        if not self.is_local:
            fs = _BoundedRemote(fs)
            _settle_bucket_type(fs, self.root)
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
        store. Only the files a command reads are copied (:func:`_copied_bound`), each
        within its bound and streamed to disk: another object beside them (a 1 GiB
        ``junk.bin``) is never downloaded. None when the store has no such session;
        OSError (StoreUnreachableError included) when the bucket fails.
        """
        local = self.local_dir(session_id)
        if local is not None:
            return local if local.is_dir() else None
        key = (self.url, session_id)
        with _COPIES_LOCK:
            known = _COPIES.get(key)
            if known is not None:
                return known
            directory = self.session_dir(session_id)
            try:
                listed = self._listing(directory)
            except FileNotFoundError:
                return None
            if not listed:
                return None
            names = []
            for name, size in sorted(listed.items()):
                bound = _copied_bound(name)
                if bound is None:
                    continue  # not read by any command
                if size > bound:
                    detail = f"{size} bytes, over the {bound} bytes a copy may take"
                    self._set_aside(f"{directory}/{name}", "too_large", detail)
                    continue
                names.append(name)
            # Named as the session (reports and messages show the directory's name).
            parent = tempfile.mkdtemp(dir=_copies_root())
            target = Path(parent) / session_id
            target.mkdir()
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
        """The record of a session, or None when there is none or it is set aside.

        Set aside (logged once, counted in :attr:`refused`): a record over
        MAX_RECORD_BYTES, not a regular file, not a record, or one whose id is not its
        directory's. Such a record is never returned, so nothing writes it back under
        the id it claims (another session's, or one that is no session id at all).
        """
        try:
            path = posixpath.join(self.session_dir(session_id), SESSION_FILE)
        except ValueError:
            return None
        try:
            data = self.read_object(path, MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        except (FileTooLargeError, NotRegularFileError) as exc:
            self._set_aside(path, _reason(exc), str(exc))
            return None
        except OSError:
            return None  # the bucket failed: the next poll reads it again
        try:
            # pydantic's parser (jiter) is bounded as json_limits is: nesting past its
            # limit and lone surrogates are a ValidationError, never a RecursionError.
            record = SessionRecord.model_validate_json(data)
        except ValidationError as exc:
            self._set_aside(path, "invalid", f"not a session record ({exc.errors()[0]['msg']})")
            return None
        if record.id != session_id:
            self._set_aside(
                path, "id_mismatch", f"its id {record.id[:200]!r} is not its directory's"
            )
            return None
        return record

    def read_object(self, path: str, max_bytes: int) -> bytes:
        """The bytes of object ``path`` of this store, at most ``max_bytes``.

        FileTooLargeError past the bound (nothing beyond it is read); on a local store
        the file is opened as a regular file, no link followed under the store's root
        (NotRegularFileError). FileNotFoundError when missing, OSError when it fails.
        """
        if self.is_local:
            return read_regular(Path(path), max_bytes, below=Path(self.root))
        # One ranged read: a larger object costs max_bytes + 1, never its size.
        data = bytes(self.fs.cat_file(path, start=0, end=max_bytes + 1))
        if len(data) > max_bytes:
            raise FileTooLargeError(f"{path}: larger than {max_bytes} bytes")
        return data

    def read_json(self, path: str, max_bytes: int, what: str) -> dict[str, Any] | None:
        """Object ``path`` as a JSON object, None when missing; bounded in size and
        depth. A bad one is set aside (logged once, counted) and gives None too; the
        bucket's own failure is an OSError."""
        try:
            return load_json_object(self.read_object(path, max_bytes), what)
        except FileNotFoundError:
            return None
        except (FileTooLargeError, NotRegularFileError, JSONInputError) as exc:
            self._set_aside(path, _reason(exc), str(exc))
            return None

    @contextlib.contextmanager
    def open_object(self, path: str, max_bytes: int) -> Iterator[BinaryIO]:
        """Object ``path`` open for reading in chunks (to stream it), bounded as
        :meth:`read_object`: FileTooLargeError past ``max_bytes``, before a byte is read."""
        if self.is_local:
            with open_regular(path=Path(path), below=Path(self.root)) as handle:
                size = os.fstat(handle.fileno()).st_size
                if size > max_bytes:
                    raise FileTooLargeError(f"{path}: {size} bytes, over {max_bytes} bytes")
                yield handle
            return
        size = int(self.fs.info(path).get("size") or 0)
        if size > max_bytes:
            raise FileTooLargeError(f"{path}: {size} bytes, over {max_bytes} bytes")
        with self.fs.open(path, "rb", block_size=COPY_CHUNK_BYTES) as handle:
            yield handle

    def refuse(self, path: str, exc: Exception) -> None:
        """Count and log (once) an object a caller of :meth:`open_object` refused."""
        self._set_aside(path, _reason(exc), str(exc))

    def _set_aside(self, path: str, reason: str, detail: str) -> None:
        """Log and count an object once (a loop that reads it every poll says it once)."""
        key = f"{path}\0{reason}"
        with self._said_lock:
            if key in self._said:
                return
            if len(self._said) > 10_000:  # bounded, whatever a bucket holds
                self._said.clear()
            self._said.add(key)
            self.refused[reason] += 1
        detail = detail.removeprefix(f"{path}: ")  # the path is said once
        log.warning("%s: set aside, not read (%s): %s", path, reason, detail[:300])

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

    def session_ids(self, *, strict: bool = False) -> list[str]:
        """Ids of every session directory in the store, sorted.

        A failing bucket lists as empty (the sidecar's loops retry on the next poll);
        ``strict`` (a command run once, e.g. ``mlprof analyze run:<id>``) raises the
        OSError instead, so it says "cannot reach ...", not "no sessions".
        """
        try:
            entries = self.fs.ls(self.profile_root, detail=False)
        except FileNotFoundError:
            return []
        except OSError:
            if strict:
                raise
            return []
        ids = []
        for entry in entries:
            name = posixpath.basename(str(entry).rstrip("/"))
            with contextlib.suppress(ValueError):
                ids.append(check_session_id(name))
        return sorted(ids)

    def records(self, *, strict: bool = False) -> list[SessionRecord]:
        """Every readable record, oldest first (``strict`` as for :meth:`session_ids`)."""
        ids = self.session_ids(strict=strict)
        found = [r for r in map(self.read_record, ids) if r is not None]
        return sorted(found, key=lambda r: (r.created, r.id))

    def listed(self) -> list[SessionRecord]:
        """Every record, for an answer someone asked for (a command, a request): a store
        that does not answer is an InputError naming it, never "no sessions"."""
        try:
            return self.records(strict=True)
        except OSError as exc:
            raise UnavailableError(f"cannot list the sessions of {self.url}: {exc}") from None

    def run_sessions(self, run_id: str) -> list[SessionRecord]:
        """The finished sessions of run ``run_id``, oldest first (as :meth:`listed`)."""
        return [r for r in self.listed() if r.finished_ok and r.in_run(run_id)]

    def probe(self) -> tuple[str, str]:
        """Whether the store answers a listing now, as /readyz shows it: ("ok", "") or
        ("error", the one-line cause). Bounded in time (a remote store's calls are)."""
        try:
            self.fs.ls(self.profile_root, detail=False)
        except FileNotFoundError:
            pass  # an empty store answers
        except OSError as exc:
            said = str(exc) if self.url in str(exc) else f"{self.url}: {exc}"
            return "error", said[:500]
        return "ok", ""

    # -- files -------------------------------------------------------------------
    def files(self, session_id: str) -> dict[str, int]:
        """Names and sizes of a session's files ({} when the bucket fails)."""
        try:
            return self._listing(self.session_dir(session_id))
        except (FileNotFoundError, OSError):
            return {}

    def session_files(self, session_id: str) -> dict[str, int]:
        """:meth:`files`, but a failing bucket is an OSError (a request says 503), not {}."""
        try:
            return self._listing(self.session_dir(session_id))
        except FileNotFoundError:
            return {}

    def _listing(self, directory: str) -> dict[str, int]:
        """Plain-named regular files of ``directory`` and their sizes (OSError passed on).

        On a local store a link is no file of the session (``ls`` would give its
        target's type and size); nor, anywhere, a name that is not plain.
        """
        entries = self.fs.ls(directory, detail=True)
        found = {}
        for entry in entries:
            name = posixpath.basename(str(entry["name"]).rstrip("/"))
            if entry.get("type") != "file" or entry.get("islink") or not _is_plain_name(name):
                continue
            found[name] = int(entry.get("size") or 0)
        return found

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
        """A local path of a session file (a temporary copy for remote stores).

        On a local store the file itself, if it is a regular file (a link or a FIFO
        left under a capture's name is refused: NotRegularFileError); the readers it is
        handed to open it by name, so a swap after this check is theirs to meet.
        """
        _check_file_name(name)  # names come from session.json, which a workload may write
        path = posixpath.join(self.session_dir(session_id), name)
        if self.is_local:
            with open_regular(Path(path), below=Path(self.root)):
                pass
            yield Path(path)
            return
        with tempfile.TemporaryDirectory(prefix="mlprof-session-") as tmp:
            local = Path(tmp) / name
            self.fs.get_file(path, str(local))  # streamed to disk by the client
            yield local

    def copy_file(self, session_id: str, name: str, target: Path) -> None:
        """Copy a session file to local path ``target``, streamed (never whole in memory);
        on a local store only a regular file, no link followed (NotRegularFileError)."""
        _check_file_name(name)
        path = posixpath.join(self.session_dir(session_id), name)
        if not self.is_local:
            self.fs.get_file(path, str(target))
            return
        with open_regular(Path(path), below=Path(self.root)) as handle, target.open("wb") as out:
            shutil.copyfileobj(handle, out, COPY_CHUNK_BYTES)

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


class _BoundedRemote:
    """A remote filesystem whose calls fail with OSError, in bounded time.

    gcsfs raises OSError subclasses (aiohttp's connection errors) or its HttpError, s3fs
    botocore's EndpointConnectionError (not an OSError): the store and its callers catch
    OSError for "the bucket failed" (kept for a retry, counted, reported in one line), so
    every client's failure reads the same. Errors of the call itself (ValueError,
    TypeError, ...) and attributes pass through as they are.

    Bounded: the endpoint is checked with one TCP connect before the first call and
    after any failure (:func:`_check_endpoint`), so an unreachable store fails at once
    with :class:`StoreUnreachableError`; listings and small reads (``_BOUNDED_CALLS``)
    give up after ``timeout_s`` (the client's call goes on in a daemon thread until its
    own retries end; nothing waits for it). Transfers of captures are not bounded here:
    their size sets their time.
    """

    _PASSED: Final = (OSError, ValueError, TypeError, KeyError, NotImplementedError)
    _BOUNDED_CALLS: Final = frozenset({"ls", "info", "cat_file", "cat", "exists", "isdir",
                                       "isfile", "find", "glob", "makedirs"})  # fmt: skip

    def __init__(self, fs: Any, timeout_s: float = STORE_CALL_TIMEOUT_S) -> None:
        self._fs = fs
        self.timeout_s = timeout_s
        self.endpoint = _endpoint_of(fs)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fs, name)
        if name.startswith("_") or not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.endpoint is not None:
                self.endpoint.check()
            # A small write (a record, a mark: on the path of POST /api/v1/captures) is
            # bounded too; a report or a capture takes the time its size needs.
            data = args[1] if name == "pipe_file" and len(args) > 1 else None
            small = isinstance(data, bytes | bytearray) and len(data) <= SMALL_WRITE_BYTES
            try:
                if name in self._BOUNDED_CALLS or small:
                    return _within(self.timeout_s, value, args, kwargs, name)
                return value(*args, **kwargs)
            except FileNotFoundError:
                raise
            except StoreUnreachableError as exc:
                if self.endpoint is None:
                    raise
                self.endpoint.suspect()
                if self.endpoint.credentials_hint and "credentials" not in str(exc):
                    # gcsfs retries a 401 as it does a 503: without credentials, say so.
                    raise StoreUnreachableError(
                        f"{exc}; {self.endpoint.credentials_hint}"
                    ) from None
                raise
            except self._PASSED:
                if self.endpoint is not None:
                    self.endpoint.suspect()
                raise
            except Exception as exc:
                if self.endpoint is not None:
                    self.endpoint.suspect()
                raise OSError(f"{type(exc).__name__}: {exc}") from exc

        return call

    def __repr__(self) -> str:
        return repr(self._fs)


def _within(timeout_s: float, func: Callable[..., Any], args: Any, kwargs: Any, name: str) -> Any:
    """``func(*args, **kwargs)``, or StoreUnreachableError after ``timeout_s``."""
    call = _POOL.submit(functools.partial(func, *args, **kwargs))
    if not call.done.wait(timeout_s):
        call.abandoned = True  # still queued: never started; running: its result is dropped
        raise StoreUnreachableError(f"the store did not answer ({name}) within {timeout_s:g} s")
    if call.error is not None:
        raise call.error
    return call.result


class _Call:
    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func
        self.done = threading.Event()
        self.abandoned = False
        self.result: Any = None
        self.error: BaseException | None = None


class _CallPool:
    """Daemon threads for bounded store calls, started as needed up to ``size``.

    Daemon: a call that never returns keeps no process (a CLI that gave up) from
    exiting. Reused: a thread per call cost 116 us, a listing of 3,000 records as many
    calls. When every thread is stuck in a hung call, new calls wait in the queue and
    time out as theirs would.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._tasks: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, func: Callable[[], Any]) -> _Call:
        call = _Call(func)
        with self._lock:
            if not self._idle and self._threads < self._size:
                self._threads += 1
                name = f"mlprof-store-{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        self._tasks.put(call)
        return call

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._tasks.get()
            with self._lock:
                self._idle -= 1
            if call.abandoned:
                continue
            try:
                call.result = call.func()
            except BaseException as exc:  # handed to the caller
                call.error = exc
            call.done.set()


_POOL: Final = _CallPool(STORE_CALL_THREADS)


class _Endpoint:
    """The host a remote store's client connects to, checked with one TCP connect."""

    def __init__(self, host: str, port: int, hint: str, credentials_hint: str = "") -> None:
        self.host, self.port, self.hint = host, port, hint
        self.credentials_hint = credentials_hint  # what to set when none were found
        self._lock = threading.Lock()
        self._verified = False
        self._failed: tuple[float, str] | None = None  # (when, the one-line cause)

    def suspect(self) -> None:
        """A call failed: connect again before the next one."""
        self._verified = False

    def check(self) -> None:
        """StoreUnreachableError when the endpoint does not take a TCP connection."""
        if self._verified:
            return
        with self._lock:
            if self._verified:
                return
            now = time.monotonic()
            if self._failed is not None and now - self._failed[0] < UNREACHABLE_RECHECK_S:
                raise StoreUnreachableError(self._failed[1])
            try:
                with socket.create_connection((self.host, self.port), CONNECT_TIMEOUT_S):
                    pass
            except OSError as exc:
                cause = exc.strerror or str(exc) or type(exc).__name__
                if isinstance(exc, TimeoutError | socket.timeout):
                    cause = f"no answer within {CONNECT_TIMEOUT_S:g} s"
                # Without the store's URL: every message that shows it names the store.
                message = f"cannot reach {self.host}:{self.port} ({cause}); {self.hint}"
                self._failed = (now, message)
                raise StoreUnreachableError(message) from None
            self._verified, self._failed = True, None


def _endpoint_of(fs: Any) -> _Endpoint | None:
    """Where gcsfs or s3fs connects (emulator or cloud), with what a user may set."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("gs", "gcs"):
        location = str(getattr(fs, "_location", "") or "https://storage.googleapis.com")
        hint = "check the network, or set STORAGE_EMULATOR_HOST for an emulator"
        credentials = ""
        if getattr(getattr(fs, "credentials", None), "method", None) == "anon" and not (
            os.environ.get("STORAGE_EMULATOR_HOST")
        ):
            credentials = (
                "no Google credentials were found (set GOOGLE_APPLICATION_CREDENTIALS, or "
                "run on a machine with a service account)"
            )
            hint += f"; {credentials}"
    elif protocol in ("s3", "s3a"):
        location = (
            getattr(fs, "endpoint_url", None)
            or fs.client_kwargs.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or "https://s3.amazonaws.com"
        )
        hint = "check the network, or set AWS_ENDPOINT_URL for another S3 endpoint"
        credentials = ""
    else:
        return None
    if "://" not in location:
        location = f"http://{location}"
    parts = urlsplit(location)
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _Endpoint(parts.hostname, port, hint, credentials)


def _client_options(url: str) -> dict[str, Any]:
    """Options for the client of ``url``: gcsfs without credentials is told so at once.

    gcsfs tries each way of finding credentials in turn; off Google Cloud its "cloud"
    one asks the metadata server with retries, 15 s before it settles for anonymous
    access. google.auth's own search (environment, gcloud, metadata server) answers in
    about a second: when it finds none, gcsfs is given anonymous access directly.
    """
    if not url.startswith(("gs://", "gcs://")) or os.environ.get("STORAGE_EMULATOR_HOST"):
        return {}
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        return {}  # no gcsfs either: url_to_fs says what to install
    try:
        google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError:
        if Path("~/.gcs_tokens").expanduser().exists():
            return {}  # gcsfs's own token cache ("cache"): gcsfs reads it itself
        return {"token": "anon"}
    except Exception:  # any other failure: leave the search to gcsfs
        return {}
    return {}


def _reason(exc: Exception) -> str:
    if isinstance(exc, FileTooLargeError):
        return "too_large"
    if isinstance(exc, NotRegularFileError):
        return "not_regular"
    return "invalid"


def _copied_bound(name: str) -> int | None:
    """The bound of a session file a command reads, None for one no command reads."""
    if not _is_plain_name(name):
        return None
    if is_capture_name(name):
        return 1 << 62  # streamed to disk; the analysis children bound what they decode
    if name.endswith(TORCH_TRACE_SUFFIXES):  # a torch.profiler trace (torch_watcher.py)
        from exporter.profiles.torch_trace import MAX_TRACE_BYTES  # numpy: only when asked

        return MAX_TRACE_BYTES  # its reader's bound: a larger one is refused unread
    if name.endswith(_SIDE_CACHE_SUFFIX) and is_capture_name(name[: -len(_SIDE_CACHE_SUFFIX)]):
        return _SIDE_CACHE_MAX_BYTES
    if name.endswith(_PPROF_SUFFIXES):
        return _PPROF_MAX_BYTES
    if name == SESSION_FILE:
        return MAX_RECORD_BYTES
    if name == REPORT_FILE:
        return MAX_REPORT_BYTES
    return None


_COPIES: dict[tuple[str, str], Path] = {}
_COPIES_LOCK = threading.Lock()
_COPIES_DIR: list[str] = []


def _copies_root() -> str:
    if not _COPIES_DIR:
        root = tempfile.mkdtemp(prefix="mlprof-sessions-")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _COPIES_DIR.append(root)
    return _COPIES_DIR[0]


def _settle_bucket_type(remote: _BoundedRemote, root: str) -> None:
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
    fs, endpoint = remote._fs, remote.endpoint
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
        if endpoint is not None:  # unreachable: no minute of the lookup's retries
            endpoint.check()
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
