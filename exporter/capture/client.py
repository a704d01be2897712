"""The profiler client: XProf's own remote-capture calls (what XProf's capture page makes).

The calls are ctypes functions that block for the capture's duration and release the
GIL while they do, so the engine runs each one in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

from exporter.errors import ConfigError

__all__ = ["ProfilerClient", "XprofClient"]


class ProfilerClient(Protocol):
    """Remote capture on a profiler server; errors are raised as RuntimeError."""

    def trace(
        self, address: str, logdir: str, duration_ms: int, options: Mapping[str, Any]
    ) -> None: ...

    def start_continuous(self, address: str, options: Mapping[str, Any]) -> None: ...

    def get_snapshot(self, address: str, logdir: str) -> None: ...

    def stop_continuous(self, address: str) -> None: ...


class XprofClient:
    """``xprof.convert._pywrap_profiler_plugin`` (extra ``mlprof-exporter[capture]``)."""

    def __init__(self) -> None:
        try:
            from xprof.convert import _pywrap_profiler_plugin
        except ImportError as exc:
            raise ConfigError(
                f"remote capture needs XProf's profiler client ({exc}): "
                "pip install 'mlprof-exporter[capture]'"
            ) from None
        self._plugin: Any = _pywrap_profiler_plugin

    def trace(
        self, address: str, logdir: str, duration_ms: int, options: Mapping[str, Any]
    ) -> None:
        # worker_list "" (this address only), include_dataset_ops True, one attempt:
        # a busy server answers at once and is reported, not retried.
        self._plugin.trace(address, os.fspath(logdir), "", True, duration_ms, 1, dict(options))

    def start_continuous(self, address: str, options: Mapping[str, Any]) -> None:
        self._plugin.start_continuous_profiling(address, dict(options))

    def get_snapshot(self, address: str, logdir: str) -> None:
        self._plugin.get_snapshot(address, os.fspath(logdir))

    def stop_continuous(self, address: str) -> None:
        self._plugin.stop_continuous_profiling(address)
