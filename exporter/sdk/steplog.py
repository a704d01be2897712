"""Buffered append-only step log written by the workload, read by the sidecar."""

from __future__ import annotations

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


class StepLogWriter:
    """Append JSON lines to one file, flushed by a background thread every second.

    ``append`` costs a deque append; the file write happens on the flusher thread, at
    ``close`` and when the buffer grows past ``MAX_BUFFERED_LINES``.
    """

    def __init__(self, path: Path, identity: dict[str, str]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        # Constant fields are serialised once; each line only formats its numbers.
        self.prefix = json.dumps(identity, separators=(",", ":"))[:-1] + ","
        # A deque that is never replaced: the workload's appends and the flusher's
        # poplefts are each atomic, so no line can land in a buffer already written.
        self._buffer: deque[str] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Extra work for the flusher thread each second (e.g. requested memory profiles).
        self.on_tick: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="mlprof-steplog", daemon=True)
        self._thread.start()

    def append(self, line: str) -> None:
        self._buffer.append(line)
        if len(self._buffer) >= MAX_BUFFERED_LINES:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            buffer = self._buffer
            lines = [buffer.popleft() for _ in range(len(buffer))]
            if lines:
                self._file.write("".join(lines))
                self._file.flush()
            else:
                # A heartbeat: the sidecar reads a fresh mtime as "the run is alive".
                os.utime(self._file.fileno())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
        with self._lock:
            self._file.close()

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
