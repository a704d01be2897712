"""Shared fixtures. Every test gets its own directories; nothing touches ./mlprof-data."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from exporter import heap

# The suite's own process is long-running, and CliRunner runs mlprof's commands in it:
# they must not switch its allocator (exporter/heap.py is for short-lived converting
# processes only). tests/unit/test_heap.py checks each command in a fresh interpreter.
heap._applied = False


@pytest.fixture(autouse=True)
def _clean_mlprof_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests see only the MLPROF_ variables they set themselves."""
    for name in list(os.environ):
        if name.startswith("MLPROF_"):
            monkeypatch.delenv(name)
    yield


# Real JAX CPU captures shared by the comparison and analysis tests (session-scoped).
from tests.analysis_captures import analysis_captures  # noqa: E402, F401
