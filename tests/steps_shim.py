"""THROWAWAY: ``exporter.profiles.steps`` until the profiles branch lands it.

Installed by ``tests/conftest.py`` only when the real module is missing. Windows are
the Steps line of device planes, else host events carrying ``step_num``; a window's
graph is the capture clipped to the window, converted by the real readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.xplane import (
    Capture,
    device_flamegraph,
    host_flamegraph,
    parse_xspace,
)
from exporter.proto import xplane_pb2


@dataclass(frozen=True, slots=True)
class StepWindow:
    start_ns: int
    end_ns: int
    step: int | None


def _space(capture: Capture) -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    space.ParseFromString(capture.read(0, capture.size))
    return space


def step_windows(capture: Capture) -> tuple[list[StepWindow], str]:
    space = _space(capture)
    windows: list[StepWindow] = []
    for plane in space.planes:
        if plane.name.startswith("/device:"):
            for line in plane.lines:
                if line.name == "Steps":
                    for e in line.events:
                        start = line.timestamp_ns + e.offset_ps // 1000
                        windows.append(StepWindow(start, start + e.duration_ps // 1000, None))
    if windows:
        return windows, "device_steps"
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        step_id = next((k for k, m in plane.stat_metadata.items() if m.name == "step_num"), None)
        for line in plane.lines:
            for e in line.events:
                for stat in e.stats:
                    if stat.metadata_id == step_id:
                        start = line.timestamp_ns + e.offset_ps // 1000
                        value = stat.int64_value or stat.uint64_value
                        windows.append(StepWindow(start, start + e.duration_ps // 1000, value))
    return windows, ("host_step_annotations" if windows else "none")


def windowed_flamegraphs(
    capture: Capture, kind: Literal["device", "host"], windows: Sequence[StepWindow]
) -> list[FlameGraph]:
    space = _space(capture)
    out = []
    for window in windows:
        clipped = xplane_pb2.XSpace()
        clipped.CopyFrom(space)
        for plane in clipped.planes:
            for line in plane.lines:
                kept = []
                for e in line.events:
                    start_ps = (line.timestamp_ns * 1000) + e.offset_ps
                    end_ps = start_ps + e.duration_ps
                    lo, hi = (
                        max(start_ps, window.start_ns * 1000),
                        min(end_ps, window.end_ns * 1000),
                    )
                    if hi <= lo:
                        continue
                    copy = xplane_pb2.XEvent()
                    copy.CopyFrom(e)
                    copy.offset_ps = lo - line.timestamp_ns * 1000
                    copy.duration_ps = hi - lo
                    kept.append(copy)
                del line.events[:]
                line.events.extend(kept)
        sub = parse_xspace(clipped.SerializeToString(), capture.source)
        graph = device_flamegraph(sub) if kind == "device" else host_flamegraph(sub)
        if graph is None:
            graph = FlameGraph(
                sample_type="device_time" if kind == "device" else "wall", unit="nanoseconds"
            )
        out.append(graph)
    return out
