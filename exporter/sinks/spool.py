"""A bounded on-disk spool of payloads that could not be sent yet.

One file per payload, written atomically (temp file + rename) and named by time and
sequence so that a restart finds them in order; a push in flight is marked, and a
restart sets such a payload aside rather than send it twice. When a new payload would exceed
``max_bytes`` the oldest ones are evicted and reported to the caller, never dropped
silently; eviction happens only once the new payload is on disk, so a failed write
(disk full, I/O error) leaves the spool as it was.

>>> import tempfile, pathlib
>>> spool = Spool(pathlib.Path(tempfile.mkdtemp()), max_bytes=1024)
>>> spool.put(b"payload").stored
True
>>> [spool.read(item) for item in spool.items()]
[b'payload']
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Spool", "SpoolItem", "SpoolPut"]

SUFFIX = ".spool"
# Beside a payload while its push is in flight (``.sending-<name>.mark``).
SENDING_PREFIX = ".sending-"
SENDING_SUFFIX = ".mark"


@dataclass(frozen=True, order=True)
class SpoolItem:
    """One spooled payload (ordered oldest first)."""

    name: str
    size: int = field(compare=False)


@dataclass(frozen=True)
class SpoolPut:
    """What ``put`` did: whether the payload was kept and what was evicted for it."""

    stored: bool
    evicted: list[SpoolItem] = field(default_factory=list)
    reason: str = ""


class Spool:
    """Payloads waiting in ``directory``, at most ``max_bytes`` in all; thread-safe."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("spool max_bytes must be >= 0")
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._seq = itertools.count()
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob(".tmp-*"):
            stale.unlink(missing_ok=True)  # a write interrupted by a crash
        self._items: dict[str, SpoolItem] = {}
        for path in directory.glob(f"*{SUFFIX}"):
            try:
                self._items[path.name] = SpoolItem(path.name, path.stat().st_size)
            except FileNotFoundError:
                continue
        # A payload whose push was in flight when the process was killed: the server may
        # have it already, and sent again it would count twice (Pyroscope adds profiles).
        # It is set aside, not resent: the caller reports these (at most once).
        self.in_doubt: list[SpoolItem] = []
        for marker in directory.glob(f"{SENDING_PREFIX}*{SENDING_SUFFIX}"):
            name = marker.name.removeprefix(SENDING_PREFIX).removesuffix(SENDING_SUFFIX)
            item = self._items.pop(name, None)
            if item is not None:
                (directory / name).unlink(missing_ok=True)
                self.in_doubt.append(item)
            marker.unlink(missing_ok=True)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(item.size for item in self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def items(self) -> list[SpoolItem]:
        """Spooled payloads, oldest first."""
        with self._lock:
            return sorted(self._items.values())

    def put(self, payload: bytes) -> SpoolPut:
        """Store ``payload``, evicting the oldest payloads to stay within ``max_bytes``.

        Nothing is evicted when the payload cannot be written (``stored`` is False).
        """
        size = len(payload)
        if size > self.max_bytes:
            return SpoolPut(
                False, reason=f"payload of {size} bytes exceeds the spool limit {self.max_bytes}"
            )
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}{SUFFIX}"
        tmp = self.directory / f".tmp-{name}"
        with self._lock:
            # Write and sync first: a failed write must cost nothing already spooled.
            try:
                with tmp.open("wb") as out:
                    out.write(payload)
                    out.flush()
                    os.fsync(out.fileno())
                tmp.replace(self.directory / name)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                return SpoolPut(False, reason=f"cannot write spool file: {exc}")
            # Only now make room, oldest first (the new payload is the newest item).
            evicted: list[SpoolItem] = []
            used = sum(item.size for item in self._items.values())
            for item in sorted(self._items.values()):
                if used + size <= self.max_bytes:
                    break
                (self.directory / item.name).unlink(missing_ok=True)
                del self._items[item.name]
                used -= item.size
                evicted.append(item)
            self._items[name] = SpoolItem(name, size)
        return SpoolPut(True, evicted)

    def read(self, item: SpoolItem) -> bytes:
        """The payload of ``item``."""
        return (self.directory / item.name).read_bytes()

    def remove(self, item: SpoolItem) -> None:
        """Forget ``item`` (sent, or rejected for good)."""
        with self._lock:
            (self.directory / item.name).unlink(missing_ok=True)
            self._marker(item).unlink(missing_ok=True)
            self._items.pop(item.name, None)

    def sending(self, item: SpoolItem) -> None:
        """Note that ``item``'s push is in flight (a restart then sets it aside)."""
        self._marker(item).touch()

    def not_sent(self, item: SpoolItem) -> None:
        """The push of ``item`` failed before the server took it: it is sent again later."""
        self._marker(item).unlink(missing_ok=True)

    def _marker(self, item: SpoolItem) -> Path:
        return self.directory / f"{SENDING_PREFIX}{item.name}{SENDING_SUFFIX}"
