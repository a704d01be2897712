"""Device memory in use / limit / peak from ``jax.Device.memory_stats()``, into the step log.

Runs on the step log's flusher thread (once a second), never on ``Run.step``. JAX is
never imported here: sampling starts only once the workload imported JAX and its
backends are initialised, so the sampler cannot pick or start a backend itself.
On CPU ``memory_stats()`` returns None and nothing is written.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporter import schema

__all__ = ["MemoryStatsSampler", "jax_local_devices"]

MIN_INTERVAL_S = 1.0  # memory_stats() is cheap, but once a second is enough for a gauge
_KEYS = ("bytes_in_use", "bytes_limit", "peak_bytes_in_use")


def jax_local_devices() -> Sequence[Any]:
    """This process's JAX devices, or none when JAX is not imported or not initialised."""
    jax = sys.modules.get("jax")
    if jax is None or getattr(getattr(jax, "__spec__", None), "_initializing", False):
        # Absent, or being imported by the workload right now (sys.modules holds it from
        # the start of its import): importing JAX's internals from this thread then would
        # hand one of the two threads a partially initialised module.
        return ()
    try:
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            return ()
    except (ImportError, AttributeError):
        pass  # a JAX without the check: the workload imported it, devices are fair game
    devices: Sequence[Any] = jax.local_devices()
    return devices


class MemoryStatsSampler:
    """Builds one ``memory`` step-log line from every local device's memory stats.

    ``devices`` returns objects with ``id``, ``platform`` and ``memory_stats()``
    (JAX devices by default).

    >>> sampler = MemoryStatsSampler('{"kind":"memory",', writer.append)  # doctest: +SKIP
    >>> writer.on_tick.append(sampler.tick)  # doctest: +SKIP
    """

    def __init__(
        self,
        prefix: str,
        emit: Callable[[str], None],
        devices: Callable[[], Sequence[Any]] = jax_local_devices,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.emit = emit
        self.devices = devices
        self._clock = clock
        self._last = float("-inf")
        self.enabled = True

    def line(self) -> str | None:
        """The step-log line for the devices' stats now, or None when none has stats."""
        entries = []
        for device in self.devices():
            stats = device.memory_stats()
            if not stats:
                continue
            entry: dict[str, Any] = {"chip": str(device.id), "platform": str(device.platform)}
            for key in _KEYS:
                value = stats.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    entry[key] = value
            if "bytes_in_use" in entry:
                entries.append(entry)
        if not entries:
            return None
        devices = json.dumps(entries, separators=(",", ":"))
        return f'{self.prefix}"time":{time.time():.6f},"devices":{devices}}}\n'

    def tick(self) -> None:
        """Append a line at most once per ``MIN_INTERVAL_S``; switch off after a failure."""
        now = self._clock()
        if not self.enabled or now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        try:
            line = self.line()
        except Exception as exc:  # a JAX oddity must not cost the workload its step log
            self.enabled = False
            print(f"mlprof: device memory sampling off: {exc!r}", file=sys.stderr)
            return
        if line is not None:
            self.emit(line)

    @classmethod
    def for_writer_prefix(
        cls,
        writer_prefix: str,
        emit: Callable[[str], None],
        devices: Callable[[], Sequence[Any]] = jax_local_devices,
    ) -> MemoryStatsSampler:
        """A sampler whose lines carry the step log's identity (``writer.prefix``)."""
        return cls(f'{{"kind":"{schema.KIND_MEMORY}",' + writer_prefix[1:], emit, devices)
