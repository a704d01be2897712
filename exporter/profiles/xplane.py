"""XProf captures (``*.xplane.pb``) -> device-time and host-time flame graphs.

Reads the XSpace with the project's own schema (no JAX, no xprof). Device time stacks
program > framework name scope > op category > HLO op from the ``XLA Ops`` line of each
``/device:TPU:N`` / ``/device:GPU:N`` plane; host time stacks ``/host:CPU`` events by
time containment per thread, Python-tracer events becoming Python frames.

Speed: events are touched once each, reading three integer fields into lists; grouping
and containment then run in numpy, and labels are computed once per event metadata id.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO

import numpy as np
from google.protobuf.internal import wire_format
from google.protobuf.internal.decoder import _DecodeVarint as _decode_varint
from google.protobuf.message import DecodeError

from exporter.errors import InputError
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.frames import FrameLabel, label_native, parse_python_tracer
from exporter.proto import xplane_pb2

__all__ = [
    "DEVICE_PLANE_RE",
    "HOST_PLANE",
    "Capture",
    "PlaneRef",
    "device_flamegraph",
    "host_flamegraph",
    "load_capture",
    "parse_xspace",
]

DEVICE_PLANE_RE = re.compile(r"^/device:(TPU|GPU):\d+$")
HOST_PLANE = "/host:CPU"
XLA_OPS = "XLA Ops"
XLA_MODULES = "XLA Modules"
STEPS = "Steps"
# Lines on a device plane that are not op executions (derived or summary lines).
_NON_OP_LINES = frozenset({XLA_MODULES, STEPS, "XLA TraceMe", "Framework Ops",
                           "Framework Name Scope", "Source code", "Host Offload Ops",
                           "SparseCore Steps", "Sparse Core Ops"})  # fmt: skip
_PS_PER_NS = 1000
_THREAD_ID_SUFFIX = re.compile(r"/-?\d+$")
_PROGRAM_ID_SUFFIX = re.compile(r"\(-?\d+\)$")
UNKNOWN_PROGRAM = "<unknown program>"


Plane = xplane_pb2.XPlaneByLine
Reader = Callable[[int, int], bytes]  # (offset, length) -> bytes


@dataclass(frozen=True, slots=True)
class PlaneRef:
    """Where one plane's bytes are in the capture."""

    name: str
    start: int
    end: int


def _scan(read: Reader, start: int, end: int, source: str) -> list[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in ``[start, end)``.

    Only the framing (tag and length varints, decoded by protobuf's own decoder) is read
    here, so a capture is never held whole: each plane is read and parsed by protobuf
    when a conversion needs it.
    """
    fields: list[tuple[int, int, int]] = []
    pos = start
    while pos < end:
        head = read(pos, min(20, end - pos))
        try:
            tag, used = _decode_varint(head, 0)
            number, wire_type = wire_format.UnpackTag(tag)
            length, used = _decode_varint(head, used)
        except (IndexError, ValueError):
            raise InputError(
                f"{source}: truncated or corrupt XProf capture (bad field header at byte {pos})"
            ) from None
        if wire_type != 2 or number < 1:
            raise InputError(
                f"{source}: not an XProf capture (field {number} at byte {pos} has wire "
                f"type {wire_type}, expected an XSpace)"
            )
        body = pos + used
        if body + length > end:
            raise InputError(
                f"{source}: truncated XProf capture (a field at byte {pos} needs "
                f"{body + length - end} more bytes than the file has)"
            )
        fields.append((number, body, body + length))
        pos = body + length
    return fields


@dataclass
class Capture:
    """An XProf capture opened for conversion; planes are parsed when needed.

    ``source`` (the file or session) is named in every error; ``events_read`` counts
    the events the conversions have read so far.
    """

    source: str
    size: int
    read: Reader
    planes: list[PlaneRef] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)
    events_read: int = 0
    steps: int = 0  # events on a device plane's Steps line (set by device_flamegraph)
    handle: BinaryIO | None = None  # the open file planes are read from, if any

    def close(self) -> None:
        """Close the file (a capture from bytes has none)."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_space(cls, space: xplane_pb2.XSpace, source: str = "<memory>") -> Capture:
        """A capture from an in-memory XSpace (e.g. a synthetic one)."""
        return parse_xspace(space.SerializeToString(), source)

    @property
    def device_planes(self) -> list[PlaneRef]:
        return [p for p in self.planes if DEVICE_PLANE_RE.match(p.name)]

    @property
    def host_planes(self) -> list[PlaneRef]:
        return [p for p in self.planes if p.name == HOST_PLANE]

    @property
    def plane_names(self) -> list[str]:
        return [p.name for p in self.planes]

    def plane(self, ref: PlaneRef) -> Plane:
        """Parse one plane (its lines stay serialized)."""
        plane = Plane()
        try:
            plane.ParseFromString(self.read(ref.start, ref.end - ref.start))
        except DecodeError:
            raise InputError(
                f"{self.source}: corrupt XProf capture (plane {ref.name!r} does not parse)"
            ) from None
        return plane

    def time_range(self) -> tuple[int, int]:
        """(start ns since epoch, duration ns) from ``Task Environment``, else the lines.

        Without a Task Environment plane the range spans the device and host lines'
        own timestamps and durations; with none of those either, it is (now, 0): a
        profile stamped 0 would be outside Pyroscope's ingestion window.
        """
        for ref in self.planes:
            if ref.name != "Task Environment":
                continue
            plane = self.plane(ref)
            names = {m.id: m.name for m in plane.stat_metadata.values()}
            values = {names.get(s.metadata_id): _stat_int(s) for s in plane.stats}
            start, stop = values.get("profile_start_time"), values.get("profile_stop_time")
            if start:
                return start, max(0, (stop or start) - start)
        return self._lines_range() or (time.time_ns(), 0)

    def _lines_range(self) -> tuple[int, int] | None:
        first, last = 0, 0
        for ref in (*self.device_planes, *self.host_planes):
            plane = self.plane(ref)
            for raw in plane.lines:
                header = xplane_pb2.XLineHeader()
                try:
                    header.ParseFromString(raw)
                except DecodeError:
                    continue  # the conversion itself names a corrupt line
                if header.timestamp_ns <= 0:
                    continue
                stop = header.timestamp_ns + max(0, header.duration_ps) // _PS_PER_NS
                first = min(first or header.timestamp_ns, header.timestamp_ns)
                last = max(last, stop)
        return (first, last - first) if first else None


def _open(read: Reader, size: int, source: str) -> Capture:
    capture = Capture(source, size, read)
    for number, start, end in _scan(read, 0, size, source):
        if number == 1:
            header = xplane_pb2.XPlaneHeader()
            try:
                header.ParseFromString(read(start, end - start))
            except DecodeError:
                raise InputError(
                    f"{source}: corrupt XProf capture (plane at byte {start} does not parse)"
                ) from None
            capture.planes.append(PlaneRef(header.name, start, end))
        elif number == 4:
            capture.hostnames.append(read(start, end - start).decode("utf-8", "replace"))
    if not capture.planes:
        raise InputError(f"{source}: not an XProf capture (no planes in the XSpace)")
    return capture


@dataclass(frozen=True, slots=True)
class _LineHeader:
    index: int
    id: int
    name: str
    display_name: str


def _headers(capture: Capture, plane: Plane) -> list[_LineHeader]:
    out = []
    for index, raw in enumerate(plane.lines):
        header = xplane_pb2.XLineHeader()
        try:
            header.ParseFromString(raw)  # events are skipped (unknown, freed with `header`)
        except DecodeError:
            raise InputError(
                f"{capture.source}: corrupt XProf capture (line {index} of plane "
                f"{plane.name!r} does not parse)"
            ) from None
        out.append(_LineHeader(index, header.id, header.name, header.display_name))
    return out


def _line(capture: Capture, plane: Plane, index: int) -> xplane_pb2.XLine:
    line = xplane_pb2.XLine()
    try:
        line.ParseFromString(plane.lines[index])
    except DecodeError:
        raise InputError(
            f"{capture.source}: corrupt XProf capture (line {index} of plane "
            f"{plane.name!r} does not parse)"
        ) from None
    capture.events_read += len(line.events)
    return line


def parse_xspace(data: bytes, source: str) -> Capture:
    """Open XSpace bytes; InputError naming ``source`` when they are not a capture."""
    if not data:
        raise InputError(f"{source}: empty, expected an XProf capture (.xplane.pb)")
    view = memoryview(data)
    return _open(lambda start, length: bytes(view[start : start + length]), len(data), source)


def load_capture(path: Path) -> Capture:
    """Open an ``.xplane.pb`` file; its planes are read from disk when needed."""
    try:
        size = path.stat().st_size
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read capture ({exc.strerror or exc})") from None
    if not size:
        handle.close()
        raise InputError(f"{path}: empty file, expected an XProf capture (.xplane.pb)")
    fd = handle.fileno()

    def read(start: int, length: int) -> bytes:
        data = os.pread(fd, length, start)
        if len(data) != length:
            raise InputError(f"{path}: file changed or was truncated while reading")
        return data

    try:
        capture = _open(read, size, str(path))
    except BaseException:
        handle.close()
        raise
    capture.handle = handle  # planes are read from it when a conversion needs them
    return capture


# -- stats ---------------------------------------------------------------------------
def _stat_int(stat: xplane_pb2.XStat) -> int:
    kind = stat.WhichOneof("value")
    if kind in ("int64_value", "uint64_value", "ref_value"):
        return int(getattr(stat, kind))
    if kind == "double_value":
        return int(stat.double_value)
    if kind == "str_value" and stat.str_value.lstrip("-").isdigit():
        return int(stat.str_value)
    return 0


def _stat_values(plane: Plane, stats: Iterable[xplane_pb2.XStat]) -> dict[str, str | int | float]:
    names = plane.stat_metadata
    out: dict[str, str | int | float] = {}
    for stat in stats:
        meta = names.get(stat.metadata_id)
        if meta is None:
            continue
        kind = stat.WhichOneof("value")
        if kind == "ref_value":
            ref = names.get(stat.ref_value)
            out[meta.name] = ref.name if ref is not None else ""
        elif kind == "bytes_value":
            continue
        elif kind is not None:
            out[meta.name] = getattr(stat, kind)
    return out


_ID_DUR = np.dtype([("id", "<i8"), ("dur", "<i8")])
_ID_DUR_OFF = np.dtype([("id", "<i8"), ("dur", "<i8"), ("off", "<i8")])
_GET_ID_DUR = attrgetter("metadata_id", "duration_ps")
_GET_ID_DUR_OFF = attrgetter("metadata_id", "duration_ps", "offset_ps")


def _columns(events: Sequence[xplane_pb2.XEvent], offsets: bool) -> tuple[np.ndarray, ...]:
    """metadata ids, durations (ps) [, offsets (ps)] as int64 arrays.

    One pass: ``attrgetter`` reads the fields in C and ``np.fromiter`` packs them into a
    structured array, so no list of Python ints is ever built (24 bytes per event).
    """
    n = len(events)
    if not offsets:
        pairs = np.fromiter(map(_GET_ID_DUR, events), _ID_DUR, n)
        return pairs["id"], pairs["dur"]
    rows = np.fromiter(map(_GET_ID_DUR_OFF, events), _ID_DUR_OFF, n)
    return rows["id"], rows["dur"], rows["off"]


# -- device time ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _OpInfo:
    path: tuple[str, ...]  # framework name scope, op category, HLO op
    program_id: int | None


def _op_info(plane: Plane, meta_id: int) -> _OpInfo:
    meta = plane.event_metadata.get(meta_id)
    if meta is None:
        return _OpInfo((f"<op {meta_id}>",), None)
    stats = _stat_values(plane, meta.stats)
    op = meta.name or meta.display_name or f"<op {meta_id}>"
    category = str(stats.get("hlo_category") or "uncategorized")
    scope = str(stats.get("tf_op") or stats.get("name_scope") or "")
    scope_frames = tuple(part for part in scope.split("/") if part)
    program = stats.get("program_id")
    program_id = int(program) if isinstance(program, int | float) else None
    return _OpInfo((*scope_frames, category, op), program_id)


def _program_name(name: str) -> str:
    # "jit_train_step(5371820118934960219)": the id changes per compile; the name does not.
    return _PROGRAM_ID_SUFFIX.sub("", name) or name


def _device_plane_graph(capture: Capture, ref: PlaneRef, graph: FlameGraph) -> None:
    """Add one device plane's op time to ``graph``."""
    plane = capture.plane(ref)
    headers = _headers(capture, plane)
    by_name = {h.name: h.index for h in headers}
    if XLA_OPS in by_name:
        op_lines = [by_name[XLA_OPS]]
    else:  # e.g. GPU captures without derived lines: every stream line holds kernels
        op_lines = [h.index for h in headers if h.name not in _NON_OP_LINES]
    if STEPS in by_name:
        steps = _line(capture, plane, by_name[STEPS])
        capture.steps = max(capture.steps, sum(1 for e in steps.events if e.duration_ps > 0))
        del steps
    modules = _line(capture, plane, by_name[XLA_MODULES]) if XLA_MODULES in by_name else None
    module_names: dict[int, str] = {}  # program_id -> program name
    module_meta_names: dict[int, str] = {}  # module event metadata id -> program name
    if modules is not None:
        for meta_id in {e.metadata_id for e in modules.events}:
            meta = plane.event_metadata.get(meta_id)
            if meta is None:
                continue
            name = _program_name(meta.name or meta.display_name)
            module_meta_names[meta_id] = name
            pid = _stat_values(plane, meta.stats).get("program_id")
            if pid is None:
                match = re.search(r"\((-?\d+)\)$", meta.name)
                pid = int(match.group(1)) if match else None
            if isinstance(pid, int | float):
                module_names[int(pid)] = name

    infos: dict[int, _OpInfo] = {}
    for line_index in op_lines:
        line = _line(capture, plane, line_index)
        ids, durs = _columns(line.events, offsets=False)
        if not len(ids):
            continue
        uniq_ops = np.unique(ids)
        for meta_id in uniq_ops.tolist():
            if meta_id not in infos:
                infos[meta_id] = _op_info(plane, meta_id)
        # Ops whose metadata names their program need no time containment; the others
        # are placed in the XLA Modules event that contains their start.
        need_offsets = modules is not None and any(
            infos[m].program_id not in module_names for m in uniq_ops.tolist()
        )
        offsets = (
            np.fromiter((e.offset_ps for e in line.events), np.int64, len(ids))
            if need_offsets
            else None
        )
        del line  # hold one parsed line at a time, and not while aggregating
        if offsets is not None and modules is not None:
            m_ids, m_durs, m_offs = _columns(modules.events, offsets=True)
            order = np.argsort(m_offs, kind="stable")
            m_starts, m_ends, m_ids = m_offs[order], (m_offs + m_durs)[order], m_ids[order]
            slot = np.searchsorted(m_starts, offsets, side="right") - 1
            inside = (slot >= 0) & (offsets < m_ends[np.maximum(slot, 0)])
            program_meta = np.where(inside, m_ids[np.maximum(slot, 0)], -1)
            del offsets, slot, inside
        else:
            program_meta = np.full(len(ids), -1, np.int64)
        # Group by (program module metadata id, op metadata id) and sum durations.
        op_index = np.searchsorted(uniq_ops, ids)
        uniq_prog, prog_index = np.unique(program_meta, return_inverse=True)
        key = prog_index.astype(np.int64) * len(uniq_ops) + op_index
        sums = np.bincount(key, weights=durs, minlength=len(uniq_prog) * len(uniq_ops))
        # bincount sums in float64: exact below 2**53 ps (~104 days of device time).
        for flat in np.flatnonzero(sums):
            prog_meta = int(uniq_prog[flat // len(uniq_ops)])
            meta_id = int(uniq_ops[flat % len(uniq_ops)])
            info = infos.get(meta_id) or _op_info(plane, meta_id)
            if prog_meta >= 0:
                program = module_meta_names.get(prog_meta, UNKNOWN_PROGRAM)
            elif info.program_id is not None and info.program_id in module_names:
                program = module_names[info.program_id]
            else:
                program = UNKNOWN_PROGRAM
            graph.add((program, *info.path), round(float(sums[flat]) / _PS_PER_NS))
        del ids, durs, program_meta


def device_flamegraph(capture: Capture) -> FlameGraph | None:
    """Device time (ns) over all device planes; None when the capture has none."""
    planes = capture.device_planes
    if not planes:
        return None
    start, duration = capture.time_range()
    graph = FlameGraph(
        sample_type="device_time",
        unit="nanoseconds",
        profile_name="device",
        time_nanos=start,
        duration_nanos=duration,
    )
    for ref in planes:
        _device_plane_graph(capture, ref, graph)
    return graph


# -- host time -----------------------------------------------------------------------
def _host_label(plane: Plane, meta_id: int) -> FrameLabel:
    meta = plane.event_metadata.get(meta_id)
    if meta is None:
        return FrameLabel(f"<event {meta_id}>")
    name = meta.name or meta.display_name
    python = parse_python_tracer(name)
    if python is not None:
        return python
    return label_native(name) if name else FrameLabel(f"<event {meta_id}>")


def _thread_name(line: xplane_pb2.XLine) -> str:
    # Pool threads are "tf_XLAEigen/-2284334949033183961": one frame per pool, not thread.
    name = line.display_name or line.name or f"thread {line.id}"
    return _THREAD_ID_SUFFIX.sub("", name) or name


def _chunked(*columns: np.ndarray, size: int = 1 << 16) -> Iterator[tuple[int, ...]]:
    """Rows of int64 columns as Python ints, converted a chunk at a time (bounded memory)."""
    for begin in range(0, len(columns[0]), size):
        yield from zip(*(c[begin : begin + size].tolist() for c in columns), strict=True)


def _host_line(
    plane: Plane,
    line: xplane_pb2.XLine,
    graph: FlameGraph,
    labels: dict[int, FrameLabel],
) -> None:
    ids, durs, offs = _columns(line.events, offsets=True)
    keep = durs > 0  # instant markers carry no time
    ids, durs, offs = ids[keep], durs[keep], offs[keep]
    if not len(ids):
        return
    order = np.lexsort((-durs, offs))  # by start; on ties the longer (outer) event first
    sorted_starts = offs[order]
    sorted_ends = (offs + durs)[order]
    sorted_metas = ids[order]
    stride = int(ids.max()) + 1
    del ids, durs, offs, order
    # A trie keyed by parent node * stride + metadata id; node 0 is the thread.
    parent_of: list[int] = [-1]
    meta_of: list[int] = [-1]
    self_ps: list[int] = [0]
    index: dict[int, int] = {}
    # Open events, innermost last: their end, trie node, and the end of their latest
    # child (children are kept disjoint so that no self value goes negative).
    open_ends: list[int] = [1 << 62]
    open_nodes: list[int] = [0]
    child_cursor: list[int] = [-(1 << 62)]
    for event_start, end, meta in _chunked(sorted_starts, sorted_ends, sorted_metas):
        start = event_start
        # Close what ended, and what does not contain this event (overlap, not nesting).
        while len(open_ends) > 1 and (open_ends[-1] <= start or open_ends[-1] < end):
            open_ends.pop()
            open_nodes.pop()
            child_cursor.pop()
        parent = open_nodes[-1]
        if child_cursor[-1] > start:
            start = child_cursor[-1]  # clip the part a sibling already covers
            if end <= start:
                continue
        child_cursor[-1] = end
        key = parent * stride + meta
        node = index.get(key)
        if node is None:
            node = index[key] = len(parent_of)
            parent_of.append(parent)
            meta_of.append(meta)
            self_ps.append(0)
        self_ps[node] += end - start
        self_ps[parent] -= end - start
        open_ends.append(end)
        open_nodes.append(node)
        child_cursor.append(start)
    thread = graph.root.child(_thread_name(line))
    frames = [thread]
    for node in range(1, len(parent_of)):
        meta_id = meta_of[node]
        label = labels.get(meta_id)
        if label is None:
            label = labels[meta_id] = _host_label(plane, meta_id)
        frame = frames[parent_of[node]].child(label.name, label.file, label.line)
        frames.append(frame)
        frame.self_value += round(self_ps[node] / _PS_PER_NS)


def host_flamegraph(capture: Capture) -> FlameGraph | None:
    """Host wall time (ns) stacked per thread; None when there are no host events."""
    planes = capture.host_planes
    if not planes:
        return None
    start, duration = capture.time_range()
    graph = FlameGraph(
        sample_type="wall",
        unit="nanoseconds",
        profile_name="wall",
        time_nanos=start,
        duration_nanos=duration,
    )
    for ref in planes:
        plane = capture.plane(ref)
        labels: dict[int, FrameLabel] = {}
        for index in range(len(plane.lines)):
            _host_line(plane, _line(capture, plane, index), graph, labels)
    graph.recompute_totals()
    return graph if graph.root.total > 0 else None
