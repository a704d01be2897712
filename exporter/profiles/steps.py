"""Step windows of an XProf capture, and flame graphs per window (per training step).

The comparison engine treats each step as one sample of every frame's time. These are
the names it codes against:

``StepWindow(start_ns, end_ns, step)``
    One step, ``[start_ns, end_ns)`` in nanoseconds since the epoch; ``step`` is the
    step number when the capture gives one, else None.

``step_windows(capture) -> (windows, source)``
    The capture's steps ordered by start and made disjoint (a window that begins
    before the previous one ends starts at that end), with where they came from:

    - ``"device_steps"``: the ``Steps`` line of the device planes (TPU captures). The
      step number is the event's ``group_id`` stat (what XProf reads), else its
      ``step_num`` stat or numeric name; one step on several chips is one window from
      its earliest start to its latest end.
    - ``"host_step_annotations"``: ``/host:CPU`` events with a ``step_num`` stat, which
      ``jax.profiler.StepTraceAnnotation("train", step_num=N)`` writes (JAX also adds
      ``_r=1``); the same step on several threads is one window.
    - ``"none"`` with ``[]`` when the capture has no step markers.

``windowed_flamegraphs(capture, kind, windows, total=False) -> list[FlameGraph]``
    One graph per window, built by the same reader as ``device_flamegraph`` /
    ``host_flamegraph`` (same frames, labels, identity and nesting). Each event's self
    time is split across the windows by how much of it lies inside each, so summing the
    windows' graphs gives the capture's graph restricted to the windows (exactly, in
    whole nanoseconds per frame). With ``total`` that sum comes last, built in the same
    pass (windows that cover the capture give its whole graph, identical to
    ``device_flamegraph`` / ``host_flamegraph``'s). Cost O(events + windows + output).
    Windows must be disjoint; empty graphs come back for a kind the capture has no
    planes of.

``whole_and_windowed_flamegraphs(capture, kind, windows) -> (whole, list[FlameGraph])``
    The capture's whole graph and each window's, from one pass (what a comparison reads
    of each capture): the gaps between the windows are windows too, left out of the list.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from exporter.ascii_digits import parse_ascii_int
from exporter.errors import InputError
from exporter.profiles.event_stats import (
    KIND_BYTES,
    KIND_DOUBLE,
    KIND_NONE,
    KIND_REF,
    KIND_STR,
    KIND_UINT64,
    StatEvents,
    read_stat_events,
)
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.xplane import (
    STEPS,
    Capture,
    device_graphs,
    graph_template,
    host_graphs,
    line_headers,
    read_line,
)
from exporter.profiles.xspace import compiled_core

__all__ = [
    "StepSource",
    "StepWindow",
    "host_step_names",
    "step_windows",
    "whole_and_windowed_flamegraphs",
    "windowed_flamegraphs",
]

StepSource = Literal["device_steps", "host_step_annotations", "none"]
_PS_PER_NS = 1000
_INT64 = 1 << 63  # windows are int64 ns
_FAR_NS = 1 << 62  # before and after any capture: the edges of the tiles around windows
_STEP_STATS = ("group_id", "step_num")  # device Steps events: XProf reads group_id


@dataclass(frozen=True, slots=True)
class StepWindow:
    """One step: ``[start_ns, end_ns)`` in ns since the epoch, and its number if known."""

    start_ns: int
    end_ns: int
    step: int | None


def _disjoint(spans: dict[object, tuple[int, int, int | None]]) -> list[StepWindow]:
    """Windows ordered by start; each starts no earlier than the previous one ends."""
    out: list[StepWindow] = []
    for first, end, step in sorted(spans.values(), key=lambda s: (s[0], s[1])):
        start = max(first, out[-1].end_ns) if out else first
        if end > start:
            out.append(StepWindow(start, end, step))
    return out


def _number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return parse_ascii_int(value, signed=True)
    return None


def _span_ns(base_ns: int, offset_ps: int, duration_ps: int) -> tuple[int, int]:
    # Whole nanoseconds that cover the event: its start rounded down, its end up.
    return base_ns + offset_ps // _PS_PER_NS, base_ns - (-(offset_ps + duration_ps) // _PS_PER_NS)


def _device_steps(capture: Capture) -> dict[object, tuple[int, int, int | None]]:
    spans: dict[object, tuple[int, int, int | None]] = {}
    for plane_number, ref in enumerate(capture.device_planes):
        plane = capture.plane(ref)
        stat_names = {m.id: m.name for m in plane.stat_metadata.values()}
        for header in line_headers(capture, plane):
            if header.name != STEPS:
                continue
            base = capture.line_start_ns(header.timestamp_ns)
            for index, event in enumerate(read_line(capture, plane, header.index).events):
                if event.duration_ps <= 0:
                    continue
                found = {stat_names.get(s.metadata_id): s for s in event.stats}
                step = None
                for name in _STEP_STATS:
                    if name in found:
                        kind = found[name].WhichOneof("value")  # None: a stat with no value
                        step = _number(getattr(found[name], kind)) if kind else None
                        break
                if step is None:
                    meta = plane.event_metadata.get(event.metadata_id)
                    step = _number(meta.name) if meta is not None else None
                start, end = _span_ns(base, event.offset_ps, event.duration_ps)
                # Unnumbered steps cannot be matched across chips: keep each chip's own.
                key: object = step if step is not None else (plane_number, index)
                old = spans.get(key)
                spans[key] = (
                    (min(old[0], start), max(old[1], end), step) if old else (start, end, step)
                )
    if any(isinstance(k, tuple) for k in spans):  # unnumbered: the first chip's steps only
        first = min(k[0] for k in spans if isinstance(k, tuple))
        spans = {k: v for k, v in spans.items() if not isinstance(k, tuple) or k[0] == first}
    return spans


def _host_step_events(capture: Capture) -> Iterator[tuple[Any, int, int, int, int, int, object]]:
    """(plane, line index, line start ns, metadata id, offset ps, duration ps, step_num
    value) of every host step annotation: the twin, an event at a time through protobuf
    (``MLPROF_DECODER=python``); :func:`_host_step_columns` gives the same rows."""
    for ref in capture.host_planes:
        plane = capture.plane(ref)
        step_ids = {m.id for m in plane.stat_metadata.values() if m.name == "step_num"}
        if not step_ids:
            continue
        for header in line_headers(capture, plane):
            base = capture.line_start_ns(header.timestamp_ns)
            for event in read_line(capture, plane, header.index).events:
                if not event.stats or event.duration_ps <= 0:
                    continue
                stats = reversed(event.stats)  # a repeated step_num: its last
                stat = next((st for st in stats if st.metadata_id in step_ids), None)
                if stat is not None:
                    value = getattr(stat, stat.WhichOneof("value") or "int64_value")
                    yield (plane, header.index, base, event.metadata_id, event.offset_ps,
                           event.duration_ps, value)  # fmt: skip


def _step_value(kind: int, bits: int, strings: list[str]) -> object:
    """A step_num stat's value as protobuf reads it, from its column (event_stats)."""
    if kind == KIND_DOUBLE:
        return struct.unpack("<d", struct.pack("<q", bits))[0]
    if kind in (KIND_UINT64, KIND_REF):  # unsigned fields: their int64 bits past 2**63
        return bits + (1 << 64) if bits < 0 else bits
    if kind == KIND_STR:
        return strings[bits]
    if kind == KIND_BYTES:
        return b""  # not a number, as any bytes value
    return bits  # int64, or a stat without a value (0, as protobuf's default)


def _step_rows(pieces: Iterator[StatEvents]) -> list[tuple[int, int, int, object]]:
    """(metadata id, offset ps, duration ps, step_num value) of a line's lasting events
    that carry a step_num stat (column 0 of ``pieces``)."""
    out = []
    for piece in pieces:
        kinds, bits = piece.kinds[0], piece.values[0]
        for i in np.flatnonzero((kinds != KIND_NONE) & (piece.durations > 0)).tolist():
            value = _step_value(int(kinds[i]), int(bits[i]), piece.strings)
            out.append((int(piece.ids[i]), int(piece.offsets[i]), int(piece.durations[i]), value))
    return out


def _host_step_columns(capture: Capture) -> Iterator[tuple[Any, int, int, int, int, int, object]]:
    """:func:`_host_step_events`' rows from the compiled core's columns: a line's events
    are read with their step_num stat in one pass, and only the step annotations (a few
    in tens of thousands of a Python-traced capture's events) reach Python. An event
    with two step_num stats gives its last, here and in the twin (as the GPU readers
    take a repeated stat's last: one answer whichever decoder runs)."""
    for ref in capture.host_planes:
        plane = capture.plane(ref)
        step_ids = {m.id for m in plane.stat_metadata.values() if m.name == "step_num"}
        if not step_ids:
            continue
        columns = dict.fromkeys(step_ids, 0)
        for header in line_headers(capture, plane):
            base = capture.line_start_ns(header.timestamp_ns)
            for row in read_stat_events(capture, plane, header.index, columns, 1, _step_rows):
                yield (plane, header.index, base, *row)


def _host_steps(
    capture: Capture, names: set[str] | None = None
) -> dict[object, tuple[int, int, int | None]]:
    """Host step spans; the step events' names go into ``names`` in the same pass."""
    spans: dict[object, tuple[int, int, int | None]] = {}
    rows = _host_step_columns if compiled_core() is not None else _host_step_events
    for plane, line, base, meta_id, offset_ps, duration_ps, value in rows(capture):
        if names is not None and (meta := plane.event_metadata.get(meta_id)):
            names.add(meta.name)
        step = _number(value)
        start, end = _span_ns(base, offset_ps, duration_ps)
        key: object = step if step is not None else (line, start)
        old = spans.get(key)
        spans[key] = (min(old[0], start), max(old[1], end), step) if old else (start, end, step)
    return spans


def host_step_names(capture: Capture) -> set[str]:
    """Names of the host events that mark steps (``StepTraceAnnotation``'s ``train``)."""
    names: set[str] = set()
    _host_steps(capture, names)
    return names


def step_windows(
    capture: Capture, names: set[str] | None = None
) -> tuple[list[StepWindow], StepSource]:
    """The capture's steps (ordered, disjoint) and their source; see the module doc.

    ``names``, when given, receives the host step annotations' names (read in the same
    pass when the steps are the host's; a TPU's device steps need a pass over the host
    planes, which are small there).
    """
    device = _device_steps(capture)
    if device:
        if names is not None:
            names |= host_step_names(capture)
        return _checked(capture, _disjoint(device)), "device_steps"
    host = _host_steps(capture, names)
    if host:
        return _checked(capture, _disjoint(host)), "host_step_annotations"
    return [], "none"


def _checked(capture: Capture, windows: list[StepWindow]) -> list[StepWindow]:
    if windows and (windows[0].start_ns < -_INT64 or windows[-1].end_ns >= _INT64):
        raise InputError(f"{capture.source}: corrupt XProf capture (a step ends past 2**63 ns)")
    return windows


def windowed_flamegraphs(
    capture: Capture,
    kind: Literal["device", "host"],
    windows: Sequence[StepWindow],
    total: bool = False,
    keep: Sequence[bool] | None = None,
) -> list[FlameGraph]:
    """One flame graph per window: each event's self time split by time overlap.

    ``keep``: graphs of the windows it marks only. ``total``: one more graph last, the
    sum of all the windows (kept or not), stamped with the capture's time range (its
    whole graph when the windows cover it), read in the same pass.
    """
    if kind not in ("device", "host"):
        raise ValueError(f"kind {kind!r}: expected 'device' or 'host'")
    if keep is not None and len(keep) != len(windows):
        raise ValueError(f"keep has {len(keep)} marks for {len(windows)} windows")
    kept = list(windows) if keep is None else [w for w, k in zip(windows, keep, strict=True) if k]
    if not windows:
        return [graph_template(capture, kind)] if total else []
    spans = np.array([(w.start_ns, w.end_ns) for w in windows], np.int64)
    if (spans[:, 1] < spans[:, 0]).any() or (spans[1:, 0] < spans[:-1, 1]).any():
        raise ValueError("windows must be ordered by start and must not overlap")
    build = device_graphs if kind == "device" else host_graphs
    graphs = build(capture, spans, total, None if keep is None else np.asarray(keep, bool))
    if graphs is None:
        template = graph_template(capture, kind)
        graphs = [template.copy() for _ in range(len(kept) + total)]
    for graph, window in zip(graphs, kept, strict=False):  # the sum keeps the capture's
        graph.time_nanos = window.start_ns
        graph.duration_nanos = window.end_ns - window.start_ns
    return graphs


def whole_and_windowed_flamegraphs(
    capture: Capture, kind: Literal["device", "host"], windows: Sequence[StepWindow]
) -> tuple[FlameGraph, list[FlameGraph]]:
    """The capture's whole graph and one graph per window, from one pass over it.

    The windows and the time before, between and after them tile the capture; the
    tiles' sum is the whole graph (:func:`windowed_flamegraphs` with ``total``), and the
    tiles between the windows count in it without a graph of their own (``keep``). A
    window's graph is the one :func:`windowed_flamegraphs` gives for the windows alone,
    but for rounding: each frame's picoseconds become nanoseconds as running sums over
    all the tiles, so a frame's value in a window may differ from that by 1 ns.
    """
    tiles: list[StepWindow] = []
    keep: list[bool] = []
    edge = -_FAR_NS
    for window in windows:
        if window.start_ns > edge:
            tiles.append(StepWindow(edge, window.start_ns, None))
            keep.append(False)
        tiles.append(window)
        keep.append(True)
        edge = window.end_ns
    tiles.append(StepWindow(edge, _FAR_NS, None))
    keep.append(False)
    *graphs, whole = windowed_flamegraphs(capture, kind, tiles, total=True, keep=keep)
    return whole, graphs
