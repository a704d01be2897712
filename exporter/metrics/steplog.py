"""Tail the SDK's step logs with offsets persisted, so a restart loses and repeats nothing.

The consumer's totals are persisted in the same atomic write as the offsets: after a
crash both roll back together and the unpersisted lines are read (and counted) again
exactly once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pydantic import BaseModel, ConfigDict, Field

from exporter import schema
from exporter.regular_files import NotRegularFileError, open_regular
from exporter.state_files import BadStateError, load_state, save_state, set_aside

__all__ = ["MalformedRecord", "StepLogConsumer", "StepLogTailer", "TailStats"]

log = logging.getLogger(__name__)

MAX_READ_BYTES = 32 << 20  # per file per poll: bounds memory after a long outage
MAX_LINE_BYTES = 1 << 20  # a "line" longer than this is garbage, not a slow writer
# A file's identity beyond its inode: ext4 reuses a deleted file's inode at once, and a
# file truncated and rewritten past the old offset within one poll keeps its inode and
# a larger size. The first line holds the first step's wall-clock start (microseconds),
# so its bytes tell one file from the next; 1 KiB covers it and costs one small read.
HEAD_BYTES = 1024


class MalformedRecord(ValueError):  # noqa: N818 - reads better at the raise site
    """A step-log line that parses as JSON but not as a record."""


class StepLogConsumer(Protocol):
    def handle(self, record: dict[str, Any], source: str) -> None:
        """Apply one record read from file ``source``; raise MalformedRecord if invalid."""

    def snapshot(self) -> dict[str, Any]:
        """State to persist with the offsets."""

    def restore(self, state: dict[str, Any]) -> None:
        """Load what ``snapshot`` returned before a restart."""

    def heartbeat(self, source: str, mtime: float) -> None:
        """Note that the workload writing file ``source`` was alive at ``mtime``."""


@dataclass
class _FileState:
    inode: int
    offset: int = 0
    head: str = ""  # digest of the file's first ``head_len`` bytes ("" until read)
    head_len: int = 0
    refused: bool = False  # not a regular file: reported once, then skipped


class _FileEntry(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    inode: int = Field(ge=0)
    offset: int = Field(ge=0)
    head: str = Field("", max_length=64)
    head_len: int = Field(0, ge=0, le=HEAD_BYTES)


class _TailState(BaseModel):
    """``sidecar/state.json``: offsets per file and the consumer's totals."""

    model_config = ConfigDict(extra="ignore")

    files: dict[str, _FileEntry] = Field(default_factory=dict)
    consumer: dict[str, Any] = Field(default_factory=dict)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _head(fh: BinaryIO, length: int) -> str:
    fh.seek(0)
    return _digest(fh.read(length))


@dataclass
class TailStats:
    """What one poll did."""

    records: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    files: int = 0


class StepLogTailer:
    """Read complete new lines from every ``steps/*.jsonl`` and hand them to a consumer.

    >>> tailer = StepLogTailer(Path("shared"), Path("state.json"), consumer)  # doctest: +SKIP
    >>> tailer.poll().records  # doctest: +SKIP
    """

    # json, schema, line_too_long: a line skipped. not_regular_file: a FIFO, device or
    # directory named like a step log, never opened for reading. rewritten: a file
    # truncated or replaced after lines were read from it; what was appended to the old
    # content after the last poll cannot be recovered.
    ERROR_REASONS = ("json", "schema", "line_too_long", "not_regular_file", "rewritten")
    LINE_REASONS = frozenset({"json", "schema", "line_too_long"})

    def __init__(
        self,
        shared_dir: Path,
        state_file: Path,
        consumer: StepLogConsumer,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.shared_dir = shared_dir
        self.steps_dir = shared_dir / schema.STEPS_DIR
        self.state_file = state_file
        self.consumer = consumer
        self.on_error = on_error
        self._files: dict[str, _FileState] = {}
        # Why the state file was set aside at start, if it was (the sidecar counts it).
        self.state_discarded: str | None = None
        self._load_state()

    def _load_state(self) -> None:
        # A bad state file is moved aside and the tail starts over: old steps are counted
        # once more, but refusing to start would lose every new one.
        try:
            state = load_state(self.state_file, _TailState)
            if state is None:
                return
            self.consumer.restore(state.consumer)  # validates everything before applying
        except (BadStateError, ValueError, TypeError) as exc:
            self.state_discarded = str(exc)
            set_aside(self.state_file, str(exc))
            return
        for name, entry in state.files.items():
            self._files[name] = _FileState(entry.inode, entry.offset, entry.head, entry.head_len)

    def _save_state(self) -> None:
        data = {
            "files": {
                n: {"inode": s.inode, "offset": s.offset, "head": s.head, "head_len": s.head_len}
                for n, s in self._files.items()
                if not s.refused
            },
            "consumer": self.consumer.snapshot(),
        }
        save_state(self.state_file, json.dumps(data, separators=(",", ":")).encode())

    def poll(self) -> TailStats:
        """Read what is new in every step log, apply it, and persist offsets."""
        stats = TailStats()
        if not self.steps_dir.is_dir():
            # Missing for now (not created yet, a volume remounting): keep every offset, or
            # the files would be read, and counted, again from zero when they come back.
            return stats
        try:
            paths = sorted(self.steps_dir.glob(f"*{schema.STEP_LOG_SUFFIX}"))
        except OSError:
            return stats
        seen = set()
        changed = False
        for path in paths:
            seen.add(path.name)
            stats.files += 1
            changed |= self._read_file(path, stats)
        for gone in set(self._files) - seen:
            del self._files[gone]
            changed = True
        if changed:
            self._save_state()
        return stats

    def _error(self, stats: TailStats, reason: str, path: Path, detail: str) -> None:
        stats.errors[reason] = stats.errors.get(reason, 0) + 1
        what = "skipped a malformed line" if reason in self.LINE_REASONS else "lines may be lost"
        log.warning("step log %s: %s (%s: %s)", path, what, reason, detail)
        if self.on_error:
            self.on_error(reason)

    def _read_file(self, path: Path, stats: TailStats) -> bool:
        try:
            # No link followed (the log, or steps/ itself): lines from a file elsewhere
            # are not the workload's steps.
            with open_regular(path, below=self.shared_dir) as fh:
                st = os.fstat(fh.fileno())
                state = self._files.get(path.name)
                if state is None or state.refused:  # new, or no longer a FIFO or device
                    state = self._files[path.name] = _FileState(st.st_ino)
                elif self._rewritten(fh, st, state):
                    self._error(stats, "rewritten", path,
                                f"truncated or replaced after {state.offset} bytes were read; "
                                "read again from the start")  # fmt: skip
                    state = self._files[path.name] = _FileState(st.st_ino)
                self.consumer.heartbeat(path.name, st.st_mtime)
                if st.st_size == state.offset:
                    return False
                fh.seek(state.offset)
                chunk = fh.read(min(st.st_size - state.offset, MAX_READ_BYTES))
                head_len = min(HEAD_BYTES, state.offset + len(chunk))
                if head_len > state.head_len:
                    state.head, state.head_len = _head(fh, head_len), head_len
        except FileNotFoundError:
            return False
        except NotRegularFileError as exc:
            return self._refuse(path, stats, str(exc))
        except OSError as exc:
            log.warning("step log %s: cannot read it (%s)", path, exc.strerror or exc)
            return False
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) > MAX_LINE_BYTES:
                self._error(stats, "line_too_long", path, f"{len(chunk)} bytes without newline")
                state.offset += len(chunk)
                return True
            return False  # a partial last line: wait for the rest
        for raw in chunk[:end].split(b"\n"):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                self._error(stats, "json", path, str(exc)[:200])
                continue
            if not isinstance(record, dict):
                self._error(stats, "schema", path, "not a JSON object")
                continue
            try:
                self.consumer.handle(record, path.name)
            except MalformedRecord as exc:
                self._error(stats, "schema", path, str(exc)[:200])
                continue
            stats.records += 1
        state.offset += end + 1
        return True

    @staticmethod
    def _rewritten(fh: BinaryIO, st: os.stat_result, state: _FileState) -> bool:
        """Whether the file is no longer the one ``state`` describes."""
        if state.inode != st.st_ino or st.st_size < state.offset:
            return True
        return bool(state.head_len) and _head(fh, state.head_len) != state.head

    def _refuse(self, path: Path, stats: TailStats, why: str) -> bool:
        """Skip a FIFO/device/directory named like a step log; report it once."""
        try:
            inode = path.stat().st_ino
        except OSError:
            return False
        state = self._files.get(path.name)
        if state is not None and state.refused and state.inode == inode:
            return False
        self._files[path.name] = _FileState(inode, refused=True)
        self._error(stats, "not_regular_file", path, why)
        return False
