"""Which files are XProf captures: one XSpace (``.xplane.pb``) or XProf's chunked
captures (``.xplane.riegeli``, :mod:`exporter.profiles.riegeli`).

Every place that finds captures by name (sessions, store records, the analysis and
the MCP tools) asks here, so a new kind of capture file is added in one place.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

__all__ = [
    "CAPTURES_NAMED",
    "CAPTURE_SUFFIXES",
    "CHUNKED_SUFFIX",
    "XSPACE_SUFFIX",
    "capture_bytes",
    "capture_stem",
    "find_captures",
    "find_regular",
    "is_capture_name",
]

XSPACE_SUFFIX: Final = ".xplane.pb"
CHUNKED_SUFFIX: Final = ".xplane.riegeli"
CAPTURE_SUFFIXES: Final = (XSPACE_SUFFIX, CHUNKED_SUFFIX)
CAPTURES_NAMED: Final = "*.xplane.pb or *.xplane.riegeli"  # for messages


def is_capture_name(name: str) -> bool:
    """Whether a file of this name is an XProf capture."""
    return name.endswith(CAPTURE_SUFFIXES)


def capture_stem(name: str) -> str:
    """The name without its capture suffix (``host.xplane.riegeli`` -> ``host``)."""
    for suffix in CAPTURE_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def find_captures(directory: Path) -> list[Path]:
    """The capture files under ``directory``, sorted: regular files only.

    A session directory is the store's, which a workload (its profiler server, an SDK
    session) or another tenant of a bucket may write: a link under a capture's name (to
    a file outside the store) and a FIFO (whose reader would block) are no captures, and
    no linked directory is descended into. Every door that reads a session's captures
    (CLI, API, MCP, the report child) finds them here, so each gets this refusal.
    """
    return find_regular(directory, CAPTURE_SUFFIXES)


def find_regular(directory: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The regular files named ``*<suffix>`` under ``directory``, sorted; no link
    followed, no linked directory walked (see :func:`find_captures`)."""
    found = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        dirs.sort()
        for name in files:
            if not name.endswith(suffixes):
                continue
            path = Path(root, name)
            try:
                regular = stat.S_ISREG(os.lstat(path).st_mode)
            except OSError:
                continue  # gone meanwhile
            if regular:
                found.append(path)
    return sorted(found)


def capture_bytes(path: Path) -> int:
    """The capture's size as one XSpace: the file's size, or a chunked capture's records.

    What a reader of the whole XSpace (XProf's converters) holds in proportion to; a
    ``.xplane.riegeli`` is brotli-compressed, so its file size understates that several
    times (:func:`exporter.profiles.riegeli.records_bytes` reads it from chunk headers).
    """
    if path.name.endswith(CHUNKED_SUFFIX):
        from exporter.profiles.riegeli import records_bytes

        return records_bytes(path)
    return path.stat().st_size
