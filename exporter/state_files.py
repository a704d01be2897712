"""The sidecar's own state files: validated on load, a bad one moved aside, never fatal.

State lives in the shared directory (``sidecar/*.json``), which the workload can write
too. A file of the wrong shape must not stop the sidecar from starting: it is moved
aside to ``<name>.bad`` (the previous bad copy is replaced, so this stays bounded),
logged, and the caller starts fresh and counts it.

>>> state = load_state(Path("shared/sidecar/state.json"), StepLogState)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from exporter.regular_files import open_directory, read_regular, replace_file

__all__ = ["BadStateError", "load_state", "save_state", "set_aside"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
# The step-log state holds one entry per file and per run: generous, still bounded.
MAX_STATE_BYTES = 64 << 20


class BadStateError(ValueError):
    """A state file exists but cannot be used; the message says why."""


def load_state(path: Path, model: type[M]) -> M | None:
    """The state in ``path`` validated by ``model``; None when there is none yet.

    Raises BadStateError when the file is unreadable, not JSON or of the wrong shape.
    """
    try:
        data = read_regular(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadStateError(f"cannot read it ({exc.strerror or exc})") from None
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "top level"
        raise BadStateError(f"{where}: {first.get('msg', 'invalid')}") from None
    except RecursionError:
        raise BadStateError("nested too deeply") from None


def set_aside(path: Path, reason: str) -> Path | None:
    """Move a bad state file to ``<name>.bad`` and log why; return where it went."""
    aside = path.with_name(path.name + ".bad")
    try:
        directory = open_directory(path.parent)  # a linked directory: nothing moved there
        try:
            os.replace(path.name, aside.name, src_dir_fd=directory, dst_dir_fd=directory)
        finally:
            os.close(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.error("state file %s is bad (%s) and cannot be moved aside (%s); starting fresh",
                  path, reason, exc.strerror or exc)  # fmt: skip
        return None
    log.error("state file %s is bad (%s): moved to %s; starting fresh", path, reason, aside)
    return aside


def save_state(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (written, synced, renamed).

    The directory is the workload's to write too: no link in it (or it being one) is
    written through, and a FIFO planted under the temporary name is removed, not opened
    (see :func:`~exporter.regular_files.replace_file`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, data)
