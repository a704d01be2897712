"""JAX device memory from the step log's ``memory`` lines, ``source="jax"``.

The SDK samples ``jax.Device.memory_stats()`` once a second on its flusher thread
(:mod:`exporter.sdk.memory_stats`); the step-log consumer hands each ``memory``
line here. Values are gauges: nothing is persisted, a restart shows them again at
the next sample.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from exporter.metrics.accelerator import DeviceSample, DeviceSeries
from exporter.metrics.steplog import MalformedRecord

__all__ = ["JaxMemoryMetrics"]

MAX_DEVICES_PER_LINE = 1024  # bounds the series one malformed line can create


def _bytes(entry: dict[str, Any], key: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedRecord(f"field 'devices[].{key}': expected a number, got {value!r}")
    if value < 0:
        raise MalformedRecord(f"field 'devices[].{key}': must not be negative")
    return float(value)


class JaxMemoryMetrics:
    """Consumer of ``memory`` records; publishes ``accelerator.memory.usage``/``.limit``.

    A device not reported for ``stale_after_s`` (the workload stopped or hung) is
    dropped, and a run's devices go as soon as its ``end`` line is read.

    >>> memory = JaxMemoryMetrics(DeviceSeries("jax", "unknown", 15.0))  # doctest: +SKIP
    >>> accelerator_gauges(meter).add_series(memory.series)  # doctest: +SKIP
    """

    def __init__(self, series: DeviceSeries, clock: Callable[[], float] = time.time) -> None:
        self.series = series
        self._clock = clock
        self.lines = 0  # memory lines applied since start

    def status(self) -> tuple[str, str]:
        """``/readyz``: waiting until the SDK has written a memory line, then ok."""
        if not self.lines:
            # JAX on CPU has no memory_stats(): such a workload never writes one.
            return "waiting", "no device-memory line from the SDK yet (none on CPU)"
        return "ok", f"{self.lines} device-memory lines read"

    def handle(self, record: dict[str, Any], identity: Mapping[str, str]) -> None:
        """Apply one ``memory`` record of the run ``identity`` (run_id, workload, host)."""
        sampled = record.get("time")
        # A line replayed after a long sidecar outage is history, not a gauge value.
        if (
            isinstance(sampled, int | float)
            and not isinstance(sampled, bool)
            and self._clock() - float(sampled) > self.series.stale_after_s
        ):
            return
        devices = record.get("devices")
        if not isinstance(devices, list) or len(devices) > MAX_DEVICES_PER_LINE:
            raise MalformedRecord(
                f"field 'devices': expected a list of at most {MAX_DEVICES_PER_LINE} objects"
            )
        samples = []
        for entry in devices:
            if not isinstance(entry, dict):
                raise MalformedRecord("field 'devices': expected objects")
            chip, platform = entry.get("chip"), entry.get("platform")
            if not isinstance(chip, str | int) or isinstance(chip, bool) or str(chip) == "":
                raise MalformedRecord(f"field 'devices[].chip': expected an id, got {chip!r}")
            if not isinstance(platform, str) or not platform or len(platform) > 32:
                raise MalformedRecord("field 'devices[].platform': expected a platform name")
            samples.append(
                DeviceSample(
                    str(chip),
                    memory_usage=_bytes(entry, "bytes_in_use"),
                    memory_limit=_bytes(entry, "bytes_limit"),
                    accelerator=platform.lower(),
                )
            )
        self.series.update(samples, identity, group=_group(identity))
        self.lines += 1

    def end(self, identity: Mapping[str, str]) -> None:
        """The run ended: its devices' series go now."""
        self.series.forget(_group(identity))


def _group(identity: Mapping[str, str]) -> str:
    return "\x1f".join((identity.get("run_id", ""), identity.get("host", "")))
