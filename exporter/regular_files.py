"""Reading files a workload wrote: regular files only, never blocking, bounded in size.

The shared directory is written by another process (the workload, or anyone who can
write there). A FIFO opened for reading blocks until a writer appears, a character
device can stream forever, and a check before ``open()`` races with a rename: so files
are opened non-blocking and checked on the open descriptor (``fstat``) before a byte
is read.

A symbolic link planted there must not make the sidecar read, write or delete a file
elsewhere: readers refuse links (``O_NOFOLLOW``, and with ``below=`` every directory under
the trusted root too), and :func:`replace_file` writes a new file and renames it into
place, so a link under the target's name is replaced, never written through.

>>> read_regular(Path("shared/run.json"), MAX_JSON_BYTES)  # doctest: +SKIP
b'{"run_id": ...}'
"""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Final

__all__ = [
    "MAX_JSON_BYTES",
    "FileTooLargeError",
    "NotRegularFileError",
    "WatchedDirectory",
    "is_regular",
    "open_directory",
    "open_regular",
    "open_regular_at",
    "read_regular",
    "read_regular_at",
    "read_tail",
    "remove_file",
    "replace_file",
    "replace_file_at",
]

# run.json, session.json and state files are a few KiB; a megabyte is garbage, not data.
MAX_JSON_BYTES: Final = 4 << 20


class NotRegularFileError(OSError):
    """The path is a FIFO, device, socket or directory: not something to read."""


class FileTooLargeError(OSError):
    """The file is larger than the reader's bound (counted apart from a failing read)."""


def open_directory(path: Path, *, below: Path | None = None) -> int:
    """A descriptor of directory ``path``, no symbolic link followed (close it yourself).

    Without ``below`` only ``path``'s last component must not be a link; with it, ``path``
    must lie under ``below`` (trusted: the configured shared directory, which may itself
    be a link) and no component after it may be one. NotRegularFileError for a link or
    a non-directory, FileNotFoundError when missing.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    if below is None:
        return _open_dir_at(path, str(path), flags, None)
    try:
        parts = path.relative_to(below).parts
    except ValueError:
        raise NotRegularFileError(f"{path}: not under {below}") from None
    fd = os.open(below, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            if part in ("", ".", ".."):
                raise NotRegularFileError(f"{path}: {part!r} in a path under {below}")
            shown = str(below.joinpath(*parts[: index + 1]))
            inner = _open_dir_at(part, shown, flags, fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


class WatchedDirectory:
    """A directory a workload fills, opened afresh at each poll with :func:`open_directory`.

    A refusal (a link, not a directory, no permission) is logged once on the caller's
    logger, not at every poll, until its reason changes or the directory opens again.
    """

    def __init__(self, path: Path, *, below: Path, what: str, log: logging.Logger) -> None:
        self.path = path
        self.below = below
        self.what = what  # "memory profiles": what a refusal leaves unread
        self.log = log
        self.refused: str | None = None  # why the directory is not read now

    def open(self) -> int | None:
        """A descriptor (close it yourself); None when missing (nothing yet) or refused."""
        try:
            dir_fd = open_directory(self.path, below=self.below)
        except FileNotFoundError:
            return None
        except OSError as exc:
            reason = str(exc) if isinstance(exc, NotRegularFileError) else f"{self.path}: {exc}"
            if reason != self.refused:
                self.log.warning("not reading %s: %s", self.what, reason)
                self.refused = reason
            return None
        self.refused = None
        return dir_fd


def _open_dir_at(name: str | Path, shown: str, flags: int, dir_fd: int | None) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # Linux says ENOTDIR for a link
            try:  # for the message only: the open has already refused it
                link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
            except OSError:
                link = exc.errno == errno.ELOOP
            what = "a symbolic link, not a directory" if link else "not a directory"
            raise NotRegularFileError(f"{shown}: {what}") from None
        raise


@contextmanager
def _parent_fd(path: Path, below: Path | None) -> Iterator[int | None]:
    if below is None:
        yield None
        return
    fd = open_directory(path.parent, below=below)
    try:
        yield fd
    finally:
        os.close(fd)


def open_regular(
    path: Path, *, follow_symlinks: bool = True, below: Path | None = None
) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file; never blocks on a FIFO.

    With ``follow_symlinks=False`` a symbolic link is refused too: a workload must not
    point the sidecar at a file outside the shared directory. ``below`` (implies no
    following) refuses a link in any directory between that trusted root and the file.
    Raises FileNotFoundError when it is missing, NotRegularFileError when it is not a
    regular file, and OSError for anything else the system refuses.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks or below is not None:
        flags |= os.O_NOFOLLOW
    with _parent_fd(path, below) as dir_fd:
        name = path.name if dir_fd is not None else path
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP and flags & os.O_NOFOLLOW:
                raise NotRegularFileError(f"{path}: not a regular file (a symbolic link)") from None
            raise
    return _regular_file(fd, path)


def open_regular_at(dir_fd: int, name: str, shown: Path) -> BinaryIO:
    """Open entry ``name`` of an open directory as :func:`open_regular`, never a link."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(f"{shown}: not a regular file (a symbolic link)") from None
        raise
    return _regular_file(fd, shown)


def _regular_file(fd: int, path: Path) -> BinaryIO:
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{path}: not a regular file ({_kind(mode)})")
        # Regular files never block; clear the flag so reads behave as usual.
        os.set_blocking(fd, True)
        return io.open(fd, "rb", closefd=True)  # noqa: UP020 - from a descriptor
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: Path,
    max_bytes: int = MAX_JSON_BYTES,
    *,
    follow_symlinks: bool = False,
    below: Path | None = None,
) -> bytes:
    """The bytes of regular file ``path``; OSError if larger than ``max_bytes``.

    A symbolic link is refused unless ``follow_symlinks`` (every caller reads files a
    workload wrote); ``below`` as for :func:`open_regular`.
    """
    with open_regular(path, follow_symlinks=follow_symlinks, below=below) as fh:
        return _read_capped(fh, path, max_bytes)


def read_regular_at(dir_fd: int, name: str, shown: Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of regular file ``name`` in an open directory; never a link."""
    with open_regular_at(dir_fd, name, shown) as fh:
        return _read_capped(fh, shown, max_bytes)


def _read_capped(fh: BinaryIO, path: Path, max_bytes: int) -> bytes:
    # Sized from the file, not the cap: read(n) allocates n bytes up front.
    size = os.fstat(fh.fileno()).st_size
    if size > max_bytes:  # refused before a byte is read
        raise FileTooLargeError(f"{path}: {size} bytes, larger than {max_bytes} bytes")
    data = fh.read(size + 1)
    if len(data) > size:  # grew while read: the rest, still within the cap
        data += fh.read(max_bytes + 1 - len(data))
        if len(data) > max_bytes:
            raise FileTooLargeError(f"{path}: larger than {max_bytes} bytes")
    return data


def read_tail(path: Path, max_bytes: int, *, below: Path | None = None) -> bytes:
    """The last ``max_bytes`` of regular file ``path`` (all of it when smaller), from the
    first whole line on: what a reader of a log's newest lines needs, bounded whatever
    the file's size. No link is followed (none under ``below`` either)."""
    with open_regular(path, follow_symlinks=False, below=below) as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - max_bytes)
        fh.seek(start)
        data = fh.read(max_bytes)
    if start:  # the first line is cut: it starts before the window
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    return data


def replace_file(
    path: Path, data: bytes | BinaryIO, *, below: Path | None = None, sync: bool = True
) -> None:
    """Replace ``path`` with ``data`` (bytes, or an open file to copy) atomically, never
    writing through a link.

    The bytes go to a new file beside it (``O_EXCL|O_NOFOLLOW``, after removing any
    leftover of that name: a FIFO or link planted there is removed, not opened), which
    is then renamed over ``path``: a link under ``path``'s name is replaced, its target
    untouched. The directory is opened without following a link (all of them under
    ``below`` when given). OSError, NotRegularFileError included, when it cannot be.
    """
    if below is not None:
        directory = open_directory(path.parent, below=below)
    else:
        directory = open_directory(path.parent)
    try:
        replace_file_at(directory, path.name, data, sync=sync)
    finally:
        os.close(directory)


def replace_file_at(dir_fd: int, name: str, data: bytes | BinaryIO, *, sync: bool = True) -> None:
    """:func:`replace_file` for entry ``name`` of an open directory; ``data`` may be an
    open file, copied from where it stands (a MiB at a time)."""
    # One name per thread: concurrent writers never share (or remove) a temporary file.
    tmp = f".{name}.{os.getpid()}-{threading.get_ident()}.tmp"
    with suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            if isinstance(data, bytes):
                out.write(data)
            else:
                shutil.copyfileobj(data, out, 1 << 20)
            out.flush()
            if sync:
                os.fsync(out.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def remove_file(path: Path) -> None:
    """Remove entry ``path`` (a file or link, not what it points to); a linked parent
    directory is refused (NotRegularFileError), a missing entry is no error."""
    try:
        directory = open_directory(path.parent)
    except FileNotFoundError:
        return
    try:
        with suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=directory)
    finally:
        os.close(directory)


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file now (for code that must hand on a path).

    Prefer :func:`open_regular`: between this check and an ``open()`` the file can be
    replaced.
    """
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a file"
