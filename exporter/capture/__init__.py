"""Capture engine: profiler targets, remote captures, snapshots and the session store.

See docs/capture.md. Modules: ``targets`` (discovery), ``engine`` (fan-out capture),
``snapshots``, ``store`` and ``session`` (the store's layout and records),
``watcher`` (programmatic sessions), ``processing`` (conversion and push after a
session), ``alerts`` (Alertmanager policy).
"""

from __future__ import annotations

from pathlib import Path

from exporter.config import Settings

__all__ = ["capture_logdir"]

CAPTURES_SUBDIR = "captures"


def capture_logdir(settings: Settings) -> Path:
    """The logdir the profiler server writes into (``MLPROF_CAPTURE_LOGDIR``), absolute."""
    chosen = settings.capture_logdir or settings.shared_dir / CAPTURES_SUBDIR
    return chosen.resolve()
