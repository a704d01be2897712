"""Reading files a workload wrote: regular files only, never blocking, bounded in size.

The shared directory is written by another process (the workload, or anyone who can
write there). A FIFO opened for reading blocks until a writer appears, a character
device can stream forever, and a check before ``open()`` races with a rename: so files
are opened non-blocking and checked on the open descriptor (``fstat``) before a byte
is read.

>>> read_regular(Path("shared/run.json"), MAX_JSON_BYTES)  # doctest: +SKIP
b'{"run_id": ...}'
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, Final

__all__ = ["MAX_JSON_BYTES", "NotRegularFileError", "is_regular", "open_regular", "read_regular"]

# run.json, session.json and state files are a few KiB; a megabyte is garbage, not data.
MAX_JSON_BYTES: Final = 4 << 20


class NotRegularFileError(OSError):
    """The path is a FIFO, device, socket or directory: not something to read."""


def open_regular(path: Path, *, follow_symlinks: bool = True) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file; never blocks on a FIFO.

    With ``follow_symlinks=False`` a symbolic link is refused too: a workload must not
    point the sidecar at a file outside the shared directory.
    Raises FileNotFoundError when it is missing, NotRegularFileError when it is not a
    regular file, and OSError for anything else the system refuses.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularFileError(f"{path}: not a regular file (a symbolic link)") from None
        raise
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


def read_regular(path: Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of regular file ``path``; OSError if larger than ``max_bytes``."""
    with open_regular(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"{path}: larger than {max_bytes} bytes")
    return data


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
