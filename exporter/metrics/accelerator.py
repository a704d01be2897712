"""The accelerator instruments shared by every device source, and per-chip last values.

Several sources publish the same instrument (``accelerator.duty_cycle`` comes from
libtpu, NVML and the step-log estimate). OpenTelemetry keeps only the first callback
of an instrument created twice on one meter, so every instrument of the catalogue
(:data:`exporter.metrics.catalog.METRICS`) is created once per meter here and each
source adds its callback.

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
from types import MappingProxyType
from typing import Final, NamedTuple

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from exporter import schema
from exporter.metrics.catalog import METRICS
from exporter.metrics.distribution import Buckets
from exporter.regular_files import read_regular

__all__ = [
    "FIELDS",
    "AcceleratorGauges",
    "DeviceSample",
    "DeviceSeries",
    "HistogramReading",
    "Reading",
    "RunIdentity",
    "accelerator_gauges",
]

Callback = Callable[[CallbackOptions], Iterable[Observation]]

# The four headline fields of a DeviceSample -> their instruments in the catalogue.
FIELDS: Final[dict[str, str]] = {
    "duty_cycle": "accelerator.duty_cycle",
    "tensorcore_utilization": "accelerator.tensorcore.utilization",
    "memory_usage": "accelerator.memory.usage",
    "memory_limit": "accelerator.memory.limit",
}

NO_ATTRIBUTES: Final[Mapping[str, str | None]] = MappingProxyType({})


class Reading(NamedTuple):
    """One value of a catalogue instrument; ``attrs`` add to (None: remove) the chip's."""

    metric: str
    value: float
    attrs: Mapping[str, str | None] = NO_ATTRIBUTES


class HistogramReading(NamedTuple):
    """One cumulative distribution (libtpu's), published as a Prometheus histogram.

    ``total`` is the sum of the samples, kept monotonic (see ``MonotonicTotals``).
    """

    metric: str  # the catalogue instrument of the distribution's percentile gauge
    buckets: Buckets
    total: float
    attrs: Mapping[str, str | None] = NO_ATTRIBUTES


class AcceleratorGauges:
    """Every catalogue instrument (gauges and counters); sources add callbacks to them.

    >>> gauges = accelerator_gauges(meter)  # doctest: +SKIP
    >>> gauges.add("duty_cycle", lambda opts: [Observation(0.5, {"chip": "0"})])  # doctest: +SKIP
    """

    def __init__(self, meter: Meter) -> None:
        self._callbacks: dict[str, list[Callback]] = {name: [] for name in METRICS}
        self._lock = threading.Lock()
        for name, spec in METRICS.items():
            create = (
                meter.create_observable_counter
                if spec.kind == "counter"
                else meter.create_observable_gauge
            )
            create(name, [self._fan_out(name)], unit=spec.unit, description=spec.description)

    def add(self, field_name: str, callback: Callback) -> None:
        """Publish what ``callback`` observes under an instrument (catalogue name or field)."""
        name = FIELDS.get(field_name, field_name)
        if name not in METRICS:
            raise KeyError(f"unknown accelerator metric {field_name!r}; expected one of {FIELDS}")
        with self._lock:
            self._callbacks[name].append(callback)

    def add_series(self, series: DeviceSeries) -> None:
        """Publish every instrument of a source's per-chip store."""
        for name in METRICS:
            self.add(name, series.callback(name))

    def _fan_out(self, name: str) -> Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                callbacks = list(self._callbacks[name])
            out: list[Observation] = []
            for callback in callbacks:
                out.extend(callback(options))
            return out

        return observe


_GAUGES: weakref.WeakKeyDictionary[Meter, AcceleratorGauges] = weakref.WeakKeyDictionary()
_GAUGES_LOCK = threading.Lock()


def accelerator_gauges(meter: Meter) -> AcceleratorGauges:
    """The instruments of ``meter``, created on first use."""
    with _GAUGES_LOCK:
        gauges = _GAUGES.get(meter)
        if gauges is None:
            gauges = _GAUGES[meter] = AcceleratorGauges(meter)
        return gauges


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One chip's values from one collection; None where the source has no value.

    ``chip`` "" is the host itself (libtpu's DCN metrics): its series carry no ``chip``.
    """

    chip: str
    duty_cycle: float | None = None
    tensorcore_utilization: float | None = None
    memory_usage: float | None = None
    memory_limit: float | None = None
    accelerator: str | None = None  # overrides the store's default (JAX reports its platform)
    readings: tuple[Reading | HistogramReading, ...] = ()  # every other catalogue instrument


_Observations = dict[str, list[Observation]]
# (metric, attributes, cumulative buckets, sum) of one chip's distributions.
_Histograms = list[tuple[str, dict[str, str], Buckets, float]]


class DeviceSeries:
    """Last values per chip of one source, written by collection, read by scrapes.

    Observations are built when values arrive, so a scrape only filters by age.

    >>> series = DeviceSeries("libtpu", "tpu", stale_after_s=15)
    >>> series.update([DeviceSample("0", duty_cycle=0.5)], {"host": "h"})
    >>> [o.value for o in series.observe("accelerator.duty_cycle")]
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
        # (group, chip) -> (last seen, {instrument: [Observation, ...]})
        self._chips: dict[tuple[str, str], tuple[float, _Observations]] = {}
        self._histograms: dict[tuple[str, str], _Histograms] = {}  # same keys as _chips

    def update(
        self, samples: Iterable[DeviceSample], identity: Mapping[str, str], group: str = ""
    ) -> None:
        """Store the newest values of the chips in ``samples`` (others keep theirs until stale).

        ``group`` separates chips of different origins that share a store (for the JAX
        source: one group per run and host).
        """
        now = self._clock()
        fresh: dict[tuple[str, str], tuple[float, _Observations]] = {}
        fresh_histograms: dict[tuple[str, str], _Histograms] = {}
        for sample in samples:
            attrs = {
                **identity,
                "accelerator": sample.accelerator or self.accelerator,
                "source": self.source,
            }
            if sample.chip:
                attrs["chip"] = sample.chip
            observations: _Observations = {}
            histograms: _Histograms = []
            for field_name, name in FIELDS.items():
                value = getattr(sample, field_name)
                if value is not None:
                    observations[name] = [Observation(value, attrs)]
            for reading in sample.readings:
                merged = attrs
                if reading.attrs:
                    merged = {**attrs, **reading.attrs}  # type: ignore[dict-item]
                    if None in reading.attrs.values():  # None removes an attribute (rare)
                        merged = {k: v for k, v in merged.items() if v is not None}
                if isinstance(reading, HistogramReading):
                    histograms.append((reading.metric, merged, reading.buckets, reading.total))
                    continue
                found = observations.get(reading.metric)
                if found is None:
                    found = observations[reading.metric] = []
                found.append(Observation(reading.value, merged))
            fresh[(group, sample.chip)] = (now, observations)
            fresh_histograms[(group, sample.chip)] = histograms
        with self._lock:
            self._chips.update(fresh)
            self._histograms.update(fresh_histograms)
            self._expire(now)

    def forget(self, group: str) -> None:
        """Drop every chip of ``group`` now (its run ended)."""
        with self._lock:
            self._chips = {key: v for key, v in self._chips.items() if key[0] != group}
            self._histograms = {k: v for k, v in self._histograms.items() if k[0] != group}

    def observe(self, name: str) -> list[Observation]:
        """This instrument's observations of every chip seen recently."""
        name = FIELDS.get(name, name)
        now = self._clock()
        with self._lock:
            if any(now - seen > self.stale_after_s for seen, _ in self._chips.values()):
                self._expire(now)
            out: list[Observation] = []
            for _, observations in self._chips.values():
                found = observations.get(name)
                if found:
                    out.extend(found)
            return out

    def histograms(self) -> _Histograms:
        """Every recently seen chip's distributions: (metric, attributes, buckets, sum)."""
        now = self._clock()
        with self._lock:
            if any(now - seen > self.stale_after_s for seen, _ in self._chips.values()):
                self._expire(now)
            return [h for found in self._histograms.values() for h in found]

    def callback(self, name: str) -> Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return self.observe(name)

        return observe

    def _expire(self, now: float) -> None:
        stale = [k for k, (seen, _) in self._chips.items() if now - seen > self.stale_after_s]
        for key in stale:
            del self._chips[key]
            self._histograms.pop(key, None)


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
