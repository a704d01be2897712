"""Shared fixtures. Every test gets its own directories; nothing touches ./mlprof-data."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _clean_mlprof_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests see only the MLPROF_ variables they set themselves."""
    for name in list(os.environ):
        if name.startswith("MLPROF_"):
            monkeypatch.delenv(name)
    yield


def _install_steps_shim() -> None:
    """THROWAWAY until the profiles branch lands ``exporter.profiles.steps``."""
    import importlib.util
    import sys

    if importlib.util.find_spec("exporter.profiles.steps") is None:
        from tests import steps_shim

        sys.modules["exporter.profiles.steps"] = steps_shim


_install_steps_shim()
