"""PyTorch CUDA allocator history and snapshots, for ``run.memory_snapshot()``.

Imports torch only when called. Without PyTorch or without a CUDA device each call says
so in one line on stderr and does nothing (a training script must not die for it).
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

__all__ = ["DEFAULT_MAX_ENTRIES", "record_history", "snapshot_pickle", "stop_history"]

# PyTorch's own example value: the allocator keeps this many alloc/free events (several
# KB each in its memory) for the timeline; the default, sys.maxsize, grows without end.
DEFAULT_MAX_ENTRIES = 100_000


def _say(message: str) -> None:
    print(f"mlprof: {message}", file=sys.stderr)


def _cuda_torch(what: str) -> Any | None:
    """The torch module when it is installed and sees a CUDA device; else None, said once."""
    try:
        import torch
    except ImportError:
        _say(f"{what}: PyTorch is not installed (pip install 'mlprof-exporter[torch]'); skipped")
        return None
    if not torch.cuda.is_available():
        _say(f"{what}: no CUDA device (torch.cuda.is_available() is False); skipped")
        return None
    return torch


def record_history(max_entries: int = DEFAULT_MAX_ENTRIES, cpp_stacks: bool = False) -> bool:
    """Record the CUDA allocator's history with each allocation's stack; False if unable."""
    torch = _cuda_torch("record_memory_history")
    if torch is None:
        return False
    torch.cuda.memory._record_memory_history(
        enabled="all",
        context="all",
        stacks="all" if cpp_stacks else "python",
        max_entries=max_entries,
    )
    return True


def stop_history() -> None:
    """Stop recording (the workload keeps running without the recorder's cost)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(enabled=None)


def snapshot_pickle() -> bytes | None:
    """``torch.cuda.memory._snapshot()`` pickled as ``_dump_snapshot()`` writes it; or None."""
    torch = _cuda_torch("memory_snapshot")
    if torch is None:
        return None
    return pickle.dumps(torch.cuda.memory._snapshot())
