"""The ``accelerator.*`` gauges shared by every device source, and per-chip last values.

Several sources publish the same instrument (``accelerator.duty_cycle`` comes from
libtpu, NVML and the step-log estimate). OpenTelemetry keeps only the first callback
of an instrument created twice on one meter, so the gauges are created once per meter
here and each source adds its callback.

Sources collect in a worker thread and store the result in a :class:`DeviceSeries`;
a scrape only reads that store (it never waits for hardware), and a chip not seen
for ``stale_after_s`` stops being published.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from exporter import schema
from exporter.regular_files import read_regular

__all__ = [
    "FIELDS",
    "AcceleratorGauges",
    "DeviceSample",
    "DeviceSeries",
    "RunIdentity",
    "accelerator_gauges",
]

Callback = Callable[[CallbackOptions], Iterable[Observation]]

# field -> (OpenTelemetry name, unit, description); units follow UCUM as the OTel
# semantic conventions ask ("1" for ratios, "By" for bytes).
FIELDS: Final[dict[str, tuple[str, str, str]]] = {
    "duty_cycle": (
        "accelerator.duty_cycle",
        "1",
        "Fraction of time the accelerator executed work (0..1).",
    ),
    "tensorcore_utilization": (
        "accelerator.tensorcore.utilization",
        "1",
        "Tensor-core (TPU) or SM (GPU) utilisation (0..1).",
    ),
    "memory_usage": ("accelerator.memory.usage", "By", "Device memory in use."),
    "memory_limit": ("accelerator.memory.limit", "By", "Device memory capacity."),
}


class AcceleratorGauges:
    """The four ``accelerator.*`` observable gauges; sources add callbacks to them.

    >>> gauges = accelerator_gauges(meter)  # doctest: +SKIP
    >>> gauges.add("duty_cycle", lambda opts: [Observation(0.5, {"chip": "0"})])  # doctest: +SKIP
    """

    def __init__(self, meter: Meter) -> None:
        self._callbacks: dict[str, list[Callback]] = {name: [] for name in FIELDS}
        self._lock = threading.Lock()
        for field_name, (name, unit, description) in FIELDS.items():
            meter.create_observable_gauge(
                name, [self._fan_out(field_name)], unit=unit, description=description
            )

    def add(self, field_name: str, callback: Callback) -> None:
        """Publish what ``callback`` observes under the gauge of ``field_name``."""
        if field_name not in FIELDS:
            raise KeyError(f"unknown accelerator field {field_name!r}; expected one of {FIELDS}")
        with self._lock:
            self._callbacks[field_name].append(callback)

    def add_series(self, series: DeviceSeries) -> None:
        """Publish every field of a source's per-chip store."""
        for field_name in FIELDS:
            self.add(field_name, series.callback(field_name))

    def _fan_out(self, field_name: str) -> Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                callbacks = list(self._callbacks[field_name])
            out: list[Observation] = []
            for callback in callbacks:
                out.extend(callback(options))
            return out

        return observe


_GAUGES: weakref.WeakKeyDictionary[Meter, AcceleratorGauges] = weakref.WeakKeyDictionary()
_GAUGES_LOCK = threading.Lock()


def accelerator_gauges(meter: Meter) -> AcceleratorGauges:
    """The gauges of ``meter``, created on first use."""
    with _GAUGES_LOCK:
        gauges = _GAUGES.get(meter)
        if gauges is None:
            gauges = _GAUGES[meter] = AcceleratorGauges(meter)
        return gauges


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One chip's values from one collection; None where the source has no value."""

    chip: str
    duty_cycle: float | None = None
    tensorcore_utilization: float | None = None
    memory_usage: float | None = None
    memory_limit: float | None = None
    accelerator: str | None = None  # overrides the store's default (JAX reports its platform)


class DeviceSeries:
    """Last values per chip of one source, written by collection, read by scrapes.

    Observations are built when values arrive, so a scrape only filters by age.

    >>> series = DeviceSeries("libtpu", "tpu", stale_after_s=15)
    >>> series.update([DeviceSample("0", duty_cycle=0.5)], {"host": "h"})
    >>> [o.value for o in series.observe("duty_cycle")]
    [0.5]
    """

    def __init__(
        self,
        source: str,
        accelerator: str,
        stale_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.accelerator = accelerator
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Lock()
        # (group, chip) -> (last seen, {field: Observation})
        self._chips: dict[tuple[str, str], tuple[float, dict[str, Observation]]] = {}

    def update(
        self, samples: Iterable[DeviceSample], identity: Mapping[str, str], group: str = ""
    ) -> None:
        """Store the newest values of the chips in ``samples`` (others keep theirs until stale).

        ``group`` separates chips of different origins that share a store (for the JAX
        source: one group per run and host).
        """
        now = self._clock()
        fresh: dict[tuple[str, str], tuple[float, dict[str, Observation]]] = {}
        for sample in samples:
            attrs = {
                **identity,
                "accelerator": sample.accelerator or self.accelerator,
                "source": self.source,
                "chip": sample.chip,
            }
            observations = {
                name: Observation(value, attrs)
                for name in FIELDS
                if (value := getattr(sample, name)) is not None
            }
            fresh[(group, sample.chip)] = (now, observations)
        with self._lock:
            self._chips.update(fresh)
            self._expire(now)

    def forget(self, group: str) -> None:
        """Drop every chip of ``group`` now (its run ended)."""
        with self._lock:
            self._chips = {key: v for key, v in self._chips.items() if key[0] != group}

    def observe(self, field_name: str) -> list[Observation]:
        """This field's observations of every chip seen recently."""
        now = self._clock()
        with self._lock:
            if any(now - seen > self.stale_after_s for seen, _ in self._chips.values()):
                self._expire(now)
            return [obs[field_name] for _, obs in self._chips.values() if field_name in obs]

    def callback(self, field_name: str) -> Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return self.observe(field_name)

        return observe

    def _expire(self, now: float) -> None:
        stale = [k for k, (seen, _) in self._chips.items() if now - seen > self.stale_after_s]
        for key in stale:
            del self._chips[key]


class RunIdentity:
    """``run_id``, ``workload`` and ``host`` of the run in the shared dir, for device series.

    Reads ``run.json`` again only when its modification time changes. Without a run
    the series carry just ``host`` (this machine's name).
    """

    def __init__(self, shared_dir: Path, hostname: str | None = None) -> None:
        self.path = shared_dir / schema.RUN_FILE
        self.hostname = hostname or socket.gethostname()
        self._mtime: float | None = None
        self._identity: dict[str, str] = {"host": self.hostname}
        self._lock = threading.Lock()  # sources collect in different worker threads

    def current(self) -> dict[str, str]:
        """The identity attributes to put on device series now."""
        with self._lock:
            return self._current()

    def _current(self) -> dict[str, str]:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            self._mtime, self._identity = None, {"host": self.hostname}
            return dict(self._identity)
        if mtime != self._mtime:
            try:
                info = json.loads(read_regular(self.path))  # never blocks on a FIFO
            except (OSError, ValueError, RecursionError):
                return dict(self._identity)  # half-replaced: keep the last good one
            if not isinstance(info, dict):
                return dict(self._identity)
            identity = {"host": str(info.get("host") or self.hostname)}
            if info.get("run_id"):
                identity["run_id"] = str(info["run_id"])
            if info.get("name"):
                identity["workload"] = str(info["name"])
            self._mtime, self._identity = mtime, identity
        return dict(self._identity)
