"""The directory a watcher polls (``memory/``, ``torch_traces/``): one shared opener.

Both watchers refuse a linked or unreadable directory and say so once, on their own
logger, until the reason changes or the directory opens again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from exporter import schema
from exporter.capture.store import SessionStore
from exporter.pipeline.memory_watcher import MemoryProfileWatcher
from exporter.pipeline.torch_watcher import TorchTraceWatcher
from exporter.regular_files import WatchedDirectory

log = logging.getLogger("tests.watched")


def test_a_linked_directory_is_refused_once_until_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    watched = WatchedDirectory(shared / "d", below=shared, what="things", log=log)
    assert watched.open() is None and watched.refused is None  # missing: nothing yet
    (shared / "d").symlink_to(elsewhere, target_is_directory=True)
    with caplog.at_level("WARNING", logger="tests.watched"):
        assert watched.open() is None and watched.open() is None
        assert watched.refused is not None and "symbolic link" in watched.refused
        (shared / "d").unlink()
        (shared / "d").write_bytes(b"")  # a new reason: said again
        assert watched.open() is None
        (shared / "d").unlink()
        (shared / "d").mkdir()
        fd = watched.open()
        assert fd is not None and watched.refused is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "not reading things" in lines[0] and "symbolic link" in lines[0]
    assert "not a directory" in lines[1] and "symbolic link" not in lines[1]
    os.close(fd)


@pytest.mark.parametrize("kind", ["memory", "torch"])
def test_each_watcher_says_a_linked_directory_once_on_its_own_logger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name = schema.MEMORY_DIR if kind == "memory" else schema.TORCH_TRACES_DIR
    (shared / name).symlink_to(elsewhere, target_is_directory=True)
    watcher: MemoryProfileWatcher | TorchTraceWatcher
    if kind == "memory":
        watcher = MemoryProfileWatcher(shared, lambda graph, labels: None, keep=1)
    else:
        watcher = TorchTraceWatcher(shared, SessionStore(tmp_path / "logdir"))
    logger = f"exporter.pipeline.{kind}_watcher"
    with caplog.at_level("WARNING", logger=logger):
        assert watcher.poll() == [] and watcher.poll() == []
    lines = [r.getMessage() for r in caplog.records if r.name == logger]
    assert len(lines) == 1 and "symbolic link" in lines[0], lines
    assert watcher.refused is not None
