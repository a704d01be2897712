"""Tail the SDK's step logs with offsets persisted, so a restart loses and repeats nothing.

The consumer's totals are persisted in the same atomic write as the offsets: after a
crash both roll back together and the unpersisted lines are read (and counted) again
exactly once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from exporter import schema

__all__ = ["MalformedRecord", "StepLogConsumer", "StepLogTailer", "TailStats"]

log = logging.getLogger(__name__)

MAX_READ_BYTES = 32 << 20  # per file per poll: bounds memory after a long outage
MAX_LINE_BYTES = 1 << 20  # a "line" longer than this is garbage, not a slow writer


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

    ERROR_REASONS = ("json", "schema", "line_too_long")

    def __init__(
        self,
        shared_dir: Path,
        state_file: Path,
        consumer: StepLogConsumer,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.steps_dir = shared_dir / schema.STEPS_DIR
        self.state_file = state_file
        self.consumer = consumer
        self.on_error = on_error
        self._files: dict[str, _FileState] = {}
        self._load_state()

    def _load_state(self) -> None:
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Starting over re-counts old steps once; refusing to start would lose new ones.
            log.warning(
                "step-log state %s unreadable (%s); starting from scratch", self.state_file, exc
            )
            return
        for name, entry in data.get("files", {}).items():
            self._files[name] = _FileState(int(entry["inode"]), int(entry["offset"]))
        self.consumer.restore(data.get("consumer", {}))

    def _save_state(self) -> None:
        data = {
            "files": {n: {"inode": s.inode, "offset": s.offset} for n, s in self._files.items()},
            "consumer": self.consumer.snapshot(),
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as out:
            json.dump(data, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.state_file)

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
        log.warning("step log %s: skipped a malformed line (%s: %s)", path, reason, detail)
        if self.on_error:
            self.on_error(reason)

    def _read_file(self, path: Path, stats: TailStats) -> bool:
        try:
            with path.open("rb") as fh:
                st = os.fstat(fh.fileno())
                state = self._files.get(path.name)
                if state is None or state.inode != st.st_ino or st.st_size < state.offset:
                    # New, replaced or truncated: read it from the start.
                    state = self._files[path.name] = _FileState(st.st_ino)
                self.consumer.heartbeat(path.name, st.st_mtime)
                if st.st_size == state.offset:
                    return False
                fh.seek(state.offset)
                chunk = fh.read(min(st.st_size - state.offset, MAX_READ_BYTES))
        except FileNotFoundError:
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
            except ValueError as exc:
                self._error(stats, "json", path, str(exc))
                continue
            if not isinstance(record, dict):
                self._error(stats, "schema", path, "not a JSON object")
                continue
            try:
                self.consumer.handle(record, path.name)
            except MalformedRecord as exc:
                self._error(stats, "schema", path, str(exc))
                continue
            stats.records += 1
        state.offset += end + 1
        return True
