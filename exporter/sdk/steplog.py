"""Buffered append-only step log written by the workload, read by the sidecar."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

__all__ = ["StepLogWriter"]

FLUSH_INTERVAL_S = 1.0  # the sidecar sees a step at most this long after it ends
MAX_BUFFERED_LINES = 10_000  # bounds memory if the flusher thread is starved
MAX_PENDING_BYTES = 64 << 20  # lines kept while the disk refuses writes


class StepLogWriter:
    """Append JSON lines to one file, flushed by a background thread every second.

    ``append`` costs a deque append; the file write happens on the flusher thread, at
    ``close`` and when the buffer grows past ``MAX_BUFFERED_LINES``.
    """

    def __init__(self, path: Path, identity: dict[str, str]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered, O_APPEND: each os.write lands whole at the end, and after a failed
        # write we know exactly which bytes are still to go.
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # Constant fields are serialised once; each line only formats its numbers.
        self.prefix = json.dumps(identity, separators=(",", ":"))[:-1] + ","
        # A deque that is never replaced: the workload's appends and the flusher's
        # poplefts are each atomic, so no line can land in a buffer already written.
        self._buffer: deque[str] = deque()
        self._pending = b""  # taken from the buffer, not yet on disk (a write failed)
        self.dropped_lines = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Extra work for the flusher thread each second (e.g. requested memory profiles).
        self.on_tick: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="mlprof-steplog", daemon=True)
        self._thread.start()

    def append(self, line: str) -> None:
        self._buffer.append(line)
        if len(self._buffer) >= MAX_BUFFERED_LINES:
            with contextlib.suppress(OSError):  # kept; the flusher thread retries each second
                self.flush()

    def flush(self) -> None:
        """Write what is buffered; on OSError the unwritten bytes stay queued."""
        with self._lock:
            if self._fd is None:
                return
            buffer = self._buffer
            count = len(buffer)
            if count:
                self._pending += "".join([buffer.popleft() for _ in range(count)]).encode()
                self._bound_pending()
            if not self._pending:
                # A heartbeat: the sidecar reads a fresh mtime as "the run is alive".
                os.utime(self._fd)
            while self._pending:
                written = os.write(self._fd, self._pending)
                self._pending = self._pending[written:]

    def _bound_pending(self) -> None:
        # A disk that stays full must not grow the workload's memory without end: past
        # the bound the oldest whole lines go, counted, and reported once each time.
        excess = len(self._pending) - MAX_PENDING_BYTES
        if excess <= 0:
            return
        cut = self._pending.find(b"\n", excess) + 1 or len(self._pending)
        lost = self._pending[:cut].count(b"\n")
        self._pending = self._pending[cut:]
        self.dropped_lines += lost
        print(f"mlprof: step log {self.path}: dropped {lost} lines (cannot write)", file=sys.stderr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.flush()
        finally:
            with self._lock:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL_S):
            try:
                self.flush()
            except OSError:
                # A full or vanished disk must not kill training; the next flush retries.
                continue
            for hook in list(self.on_tick):
                try:
                    hook()
                except Exception as exc:  # a failing hook must not stop the step log
                    print(f"mlprof: background task failed: {exc!r}", file=sys.stderr)
