"""GPU kernels of a capture (``facts.gpu_kernels``): per-kernel counts, time and launch
configuration, and the device time lost waiting for kernel launches.

**Kernels.** A kernel is a lasting event on a stream line of a ``/device:GPU:N`` plane
that carries ``kernel_details`` (CUPTI's launch configuration), as XProf's
``GpuEventStats::IsKernel`` decides; a memcpy or memset (``memcpy_details``) is not.
A plane whose stat table has no ``kernel_details`` at all (hand-made captures, tracers
that do not record it) counts every lasting event without ``memcpy_details`` as a
kernel, with no launch configuration (``kernel_basis`` says which). Derived lines
(``XLA Ops``, ``Steps``, XProf's ids from ``0xdeadbeef``) are not streams.

Kernels are aggregated as XProf's ``kernel_stats`` aggregates them, by name and launch
configuration (grid, block, registers, static and dynamic shared memory; occupancy is
the first occurrence's, as there), and, where the events say, by the HLO module and op
they ran for (``hlo_module``, ``hlo_op``): XProf keys the third part by the framework
op it finds in the capture's HLO protos instead, so its rows are ours summed over
module and op. Each event's duration is its picoseconds divided down to whole
nanoseconds, as XProf's ``DurationNs``, so counts, totals, minima and maxima agree
exactly (``tests/unit/test_gpu_kernels.py``).

**Launch overhead.** On each stream, kernels in start order; the gap before a kernel is
the time from the latest end of the kernels before it to its start. Its launch call is
the host event of the same ``correlation_id`` on a host plane (``cuLaunchKernel``,
``cudaLaunchKernel``, ``hipLaunchKernel``, graph launches, ...). Within a gap, the time
from the later of (the stream going idle, the call's start) to the kernel's start is
spent waiting for the launch; the time before the call starts, for the host to begin
it. ``launch_overhead_ms`` is the launch-wait time during which *no* kernel ran on any
stream of the device (device idle, not one stream idle while another works), summed
over devices; its share is of the devices' kernel span (first kernel start to last
kernel end on each device), or of the step cycles when the capture has steps.
A kernel's launch latency is its start minus its call's start.

Reading: each stream line's events come with their ``kernel_details``, ``hlo_module``,
``hlo_op``, ``correlation_id`` and memcpy stats as columns
(:mod:`exporter.profiles.event_stats`: the compiled core reads them in the pass that
reads the events, through windows of the line; the pure-Python twin through protobuf),
and the rows, sums and gaps are numpy over those columns: Python runs once per distinct
(kernel, configuration, module, op), not per event. What is kept of a line is four
int64 columns of its kernels until the line is reduced; across lines, one aggregate per
distinct kernel and, per device, the merged busy intervals and launch waits.
``bench/gpu_capture_speed.py`` measures it against XProf's ``kernel_stats``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np

from exporter.analysis.facts.intervals import union
from exporter.ascii_digits import parse_ascii_int
from exporter.profiles.event_stats import (
    StatEvents,
    StatTexts,
    first_seen,
    int_column,
    read_stat_events,
)
from exporter.profiles.nesting import FAR, dense_index
from exporter.profiles.xspace import compiled_core

try:  # the per-kernel passes compiled (_kernel_streams.c), where they were built
    from exporter.analysis.facts import _kernel_streams  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - an install without a compiler
    _kernel_streams = None

if TYPE_CHECKING:
    from exporter.profiles.event_stats import LineTap
    from exporter.profiles.xspace import Capture, LineHeader, Plane, PlaneRef

__all__ = [
    "GPU_PLANE_RE",
    "LAUNCH_API_RE",
    "TOP_KERNELS",
    "CaptureKernels",
    "LaunchConfig",
    "gpu_kernel_facts",
    "kernel_tap",
    "parse_kernel_details",
    "read_kernels",
]

GPU_PLANE_RE: Final = re.compile(r"^/device:GPU:\d+$")
# CUDA driver and runtime launch calls (cuLaunchKernel, cuLaunchKernelEx,
# cudaLaunchKernel, cudaLaunchKernelExC_v11060, cuLaunchCooperativeKernel,
# cu(da)GraphLaunch) and their HIP twins, as XLA's CUPTI / roctracer collectors name
# the host events; not cudaLaunchHostFunc (a host callback, no kernel).
LAUNCH_API_RE: Final = re.compile(r"^(cu|cuda|hip)(Ext)?(Module)?(Graph)?Launch(?!HostFunc)\w*$")
TOP_KERNELS: Final = 20  # kernel rows in the report (by total time); XProf keeps 1000
TOP_LATENCY: Final = 5  # kernels named for their launch latency
# XProf's derived lines (XLA Ops, Steps, ...) have ids from kThreadIdDerivedMin
# (0xdeadbeef, tsl/profiler/utils/xplane_schema.h); they repeat the kernels' time.
_DERIVED_LINE_MIN: Final = 0xDEADBEEF
_DERIVED_LINE_MAX: Final = _DERIVED_LINE_MIN + 0xFF
_NOT_STREAMS: Final = frozenset(
    {"XLA Ops", "XLA Modules", "Steps", "XLA TraceMe", "Framework Ops", "Framework Name Scope",
     "Source code", "Launch Stats", "TensorFlow Ops", "TensorFlow Name Scope"}
)  # fmt: skip
# The stat columns a stream line is read with (event_stats.read_stat_events).
_DETAILS, _MODULE, _OP, _CORRELATION, _COPY = range(5)
_WIDTH: Final = 5
_OWN_COLUMNS: Final = tuple(range(_WIDTH))  # a line read for the kernels alone
_MAX_DETAILS: Final = 1024  # a longer kernel_details string is not CUPTI's: not parsed
_UINT32: Final = 1 << 32
_INT64_MAX: Final = (1 << 63) - 1
_PS_PER_NS: Final = 1000


def _passes() -> Any | None:
    """The compiled per-kernel passes while the compiled core is in use (they follow
    ``MLPROF_DECODER`` / ``use_decoder`` as it does), else None: the numpy twins."""
    return _kernel_streams if compiled_core() is not None else None


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """A kernel's launch configuration, parsed as XProf's ``ParseKernelLaunchParams``:
    unknown or malformed tokens are skipped, dimensions default to 1,1,1."""

    registers_per_thread: int = 0
    static_shared_memory_bytes: int = 0
    dynamic_shared_memory_bytes: int = 0
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    occupancy_pct: float | None = None

    @property
    def key(self) -> tuple[object, ...]:
        """What XProf aggregates by (not occupancy)."""
        return (self.registers_per_thread, self.static_shared_memory_bytes,
                self.dynamic_shared_memory_bytes, self.grid, self.block)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "registers_per_thread": self.registers_per_thread,
            "static_shared_memory_bytes": self.static_shared_memory_bytes,
            "dynamic_shared_memory_bytes": self.dynamic_shared_memory_bytes,
            "grid": list(self.grid),
            "block": list(self.block),
            "threads_per_block": self.block[0] * self.block[1] * self.block[2],
            "occupancy_pct": self.occupancy_pct,
        }


def _uint32(text: str) -> int | None:
    value = parse_ascii_int(text)  # not isdigit(): '²' is a digit to it, not to int()
    return value if value is not None and value < _UINT32 else None


def parse_kernel_details(details: str) -> LaunchConfig | None:
    """``regs:32 static_shared:0 dynamic_shared:0 grid:1,1,1 block:256,1,1 occ_pct:50``
    as a :class:`LaunchConfig`; None for an empty or oversized string."""
    if not details or len(details) > _MAX_DETAILS:
        return None
    ints = {"regs": 0, "static_shared": 0, "dynamic_shared": 0}
    dims = {"grid": (1, 1, 1), "block": (1, 1, 1)}
    occupancy = None
    for token in re.split(r"[ \n]", details):
        parts = token.split(":")
        if len(parts) != 2:
            continue
        key, value = parts
        if key in ints and (number := _uint32(value)) is not None:
            ints[key] = number
        elif key in dims:
            xyz = [_uint32(v) for v in value.split(",")]
            if len(xyz) == 3 and all(v is not None for v in xyz):
                dims[key] = (int(xyz[0] or 0), int(xyz[1] or 0), int(xyz[2] or 0))
        elif key == "occ_pct":
            try:
                pct = float(value)
            except ValueError:
                continue
            if math.isfinite(pct):  # NaN and inf are not a share
                occupancy = pct
    return LaunchConfig(ints["regs"], ints["static_shared"], ints["dynamic_shared"],
                        dims["grid"], dims["block"], occupancy)  # fmt: skip


@dataclass
class _Kernel:
    """One aggregated kernel row (durations in whole ns, as XProf's)."""

    name: str
    config: LaunchConfig | None
    module: str
    op: str
    occurrences: int = 0
    total_ns: int = 0
    min_ns: int = 0
    max_ns: int = 0
    latency_count: int = 0
    latency_total_ns: int = 0
    latency_max_ns: int = 0

    def add(self, count: int, total: int, low: int, high: int) -> None:
        self.min_ns = low if not self.occurrences else min(self.min_ns, low)
        self.max_ns = high if not self.occurrences else max(self.max_ns, high)
        self.occurrences += count
        self.total_ns += total

    def add_latency(self, count: int, total: int, high: int) -> None:
        self.latency_max_ns = high if not self.latency_count else max(self.latency_max_ns, high)
        self.latency_count += count
        self.latency_total_ns += total


@dataclass
class _Device:
    """One GPU plane's kernel intervals and launch waits (absolute ns)."""

    name: str
    busy: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    launch: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    first_ns: int | None = None
    last_ns: int | None = None
    streams: int = 0


@dataclass
class CaptureKernels:
    """What one capture file's GPU planes give (combined over files by
    :func:`gpu_kernel_facts`)."""

    kernels: dict[tuple[object, ...], _Kernel] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    gaps_ns: list[np.ndarray] = field(default_factory=list)  # every positive gap
    launch_gaps_ns: list[np.ndarray] = field(default_factory=list)  # call begun before
    launches: int = 0  # launch calls found on host planes
    correlated: int = 0  # kernels whose launch call was found
    basis: set[str] = field(default_factory=set)
    skipped: int = 0  # events left out (corrupt times)
    cycle_ns: int = 0  # step cycles' time (per device) inside which overhead is counted
    cycles: int = 0


def _is_stream(line_id: int, name: str) -> bool:
    return not (_DERIVED_LINE_MIN <= line_id <= _DERIVED_LINE_MAX) and name not in _NOT_STREAMS


def _stat_text(stat: Any, names: dict[int, str]) -> str:
    return names.get(stat.ref_value, "") if stat.ref_value else stat.str_value


def _stat_int(stat: Any) -> int:
    kind = stat.WhichOneof("value")
    if kind in ("int64_value", "uint64_value"):
        return int(getattr(stat, kind))
    if kind == "str_value":
        value = parse_ascii_int(stat.str_value)
        return -1 if value is None else value
    return -1


_Stats = tuple[str, str, str, bool, int]  # details, module, op, is a copy, correlation id
_NO_STATS: Final[_Stats] = ("", "", "", False, -1)


@dataclass(frozen=True, slots=True)
class _KernelStatIds:
    """A plane's stat ids of what a kernel row needs (-1: the plane has no such stat)."""

    details: int
    module: int
    op: int
    correlation: int
    copies: set[int]

    def read(self, stats: Iterable[Any], names: dict[int, str], start: _Stats) -> _Stats:
        """``start`` updated by ``stats`` (an event's own stats win over its metadata's)."""
        d, m, o, copy, corr = start
        for stat in stats:
            sid = stat.metadata_id
            if sid == self.details:
                d = _stat_text(stat, names)
            elif sid == self.module:
                m = _stat_text(stat, names)
            elif sid == self.op:
                o = _stat_text(stat, names)
            elif sid == self.correlation:
                corr = _stat_int(stat)
            elif sid in self.copies:
                copy = True
        return d, m, o, copy, corr


def _launch_calls(capture: Capture) -> _Calls:
    """The launch calls on host planes: correlation ids and start ns.

    Only planes whose event metadata names a launch call are read (a ``/host:CPU``
    plane of TraceMes is skipped without reading its lines). A call's correlation id is
    its last stat named ``correlation_id`` (as a kernel's), read with the events.
    """
    from exporter.profiles.xspace import line_headers

    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for ref in capture.planes:
        if not ref.name.startswith("/host:") or ref.name == "/host:metadata":
            continue
        plane = capture.plane(ref)
        calls = np.asarray(sorted(m for m, meta in plane.event_metadata.items()
                                  if LAUNCH_API_RE.match(meta.name or meta.display_name)),
                           np.int64)  # fmt: skip
        corr = {m.id: 0 for m in plane.stat_metadata.values() if m.name == "correlation_id"}
        if not len(calls) or not corr:
            continue
        for header in line_headers(capture, plane):
            base_ns = capture.line_start_ns(header.timestamp_ns)

            def found(
                pieces: Iterable[StatEvents], calls: np.ndarray = calls, base_ns: int = base_ns
            ) -> list[tuple[np.ndarray, np.ndarray]]:
                return [_launch_piece(piece, calls, base_ns) for piece in pieces]

            parts += read_stat_events(capture, plane, header.index, corr, 1, found)
    if not parts:
        return _Calls.of(np.zeros(0, np.int64), np.zeros(0, np.int64))
    ids, starts = (np.concatenate(c) for c in zip(*parts, strict=True))
    return _Calls.of(ids, starts)


def _launch_piece(
    piece: StatEvents, calls: np.ndarray, base_ns: int
) -> tuple[np.ndarray, np.ndarray]:
    """A host line's piece's launch calls (``calls``: their metadata ids, sorted):
    correlation ids and start ns, in one compiled pass where it is built."""
    core = _passes()
    if core is None:
        return _launch_piece_numpy(piece, calls, base_ns)
    strings = _string_ids(piece.strings)
    found = core.launch_calls(piece.ids, piece.offsets, piece.durations, piece.kinds[0],
                              piece.values[0], strings, calls, base_ns)  # fmt: skip
    return np.frombuffer(found[0], np.int64), np.frombuffer(found[1], np.int64)


def _string_ids(strings: Sequence[str]) -> np.ndarray:
    """The correlation id each str_value reads as (:func:`int_column`'s), -1 none."""
    parsed = (parse_ascii_int(text) for text in strings)
    return np.asarray([-1 if v is None or v > _INT64_MAX else v for v in parsed], np.int64)


def _launch_piece_numpy(
    piece: StatEvents, calls: np.ndarray, base_ns: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_launch_piece`'s twin."""
    off, dur, ids = piece.offsets, piece.durations, int_column(piece, 0)
    keep = np.isin(piece.ids, calls) & (dur >= 0) & (off > -FAR) & (off < FAR)
    keep &= (dur <= FAR) & (ids >= 0)
    if not keep.all():  # a line of launch calls only (CUPTI's) keeps every event
        ids, off = ids[keep], off[keep]
    return ids, base_ns + off // _PS_PER_NS


def _call_table(ids: np.ndarray) -> np.ndarray | None:
    """Index of each launch call by correlation id (``ids`` sorted; -1: none), or None
    where the ids are sparse, negative or repeated (then a binary search finds them).
    CUPTI numbers launches 1, 2, 3...: a table finds a kernel's call in O(1), where the
    search of 500 k calls took most of the link."""
    if not len(ids) or ids[0] < 0 or ids[-1] > 4 * len(ids) + 1024:
        return None
    if (ids[1:] == ids[:-1]).any():
        return None
    table = np.full(int(ids[-1]) + 1, -1, np.int64)
    table[ids] = np.arange(len(ids))
    return table


class _Calls(NamedTuple):  # cheaper to define than a dataclass (the import is on the cold path)
    """The launch calls of a capture: correlation ids (sorted), start ns, and the
    :func:`_call_table` of the ids where they are dense."""

    ids: np.ndarray
    starts: np.ndarray
    table: np.ndarray | None

    @classmethod
    def of(cls, ids: np.ndarray, starts: np.ndarray) -> _Calls:
        if (ids[1:] < ids[:-1]).any():  # CUPTI numbers calls in order: mostly sorted
            order = np.argsort(ids, kind="stable")
            ids, starts = ids[order], starts[order]
        return cls(ids, starts, _call_table(ids))

    def find(self, corrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per correlation id, the index of its launch call (the first of equal ids)
        and whether there is one."""
        ids, table = self.ids, self.table
        if table is None:
            pos = np.minimum(np.searchsorted(ids, corrs), len(ids) - 1)
            return pos, (ids[pos] == corrs) & (corrs >= 0)
        inside = (corrs >= 0) & (corrs < len(table))
        pos = table[np.where(inside, corrs, 0)]
        hit = inside & (pos >= 0)
        return np.where(hit, pos, 0), hit


class _StreamPass(NamedTuple):
    """What one stream's kernels give (:func:`_stream_pass`)."""

    rows: list[tuple[int, int, int, int, int]]  # (row, count, total, min, max) ns
    latencies: list[tuple[int, int, int, int]]  # (row, count, total, max) ns
    correlated: int  # kernels whose launch call was found (not after the kernel)
    first_ns: int  # the first kernel's start
    last_ns: int  # the latest end
    busy_starts: np.ndarray  # the stream's busy intervals
    busy_ends: np.ndarray
    wait_from: np.ndarray  # per gap whose kernel's call is known: the launch wait
    wait_to: np.ndarray
    gaps: np.ndarray  # every positive gap (ns)
    launch_gaps: np.ndarray  # ... of those whose call had begun when the stream idled


_NO_TABLE: Final = np.zeros(0, np.int64)


_Piece = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # rows, offsets, durations, corr


def _stream_pass(
    pieces: Sequence[_Piece], base_ns: int, row_count: int, calls: _Calls
) -> _StreamPass:
    """One stream's kernels, in pieces read one after the other (rows below
    ``row_count``, offsets and durations in ps, correlation ids) on a line starting at
    ``base_ns``: per row the kernels' durations and launch latencies, and the stream's
    busy intervals, gaps and launch waits, in one compiled pass over the pieces where it
    is built (:func:`_stream_numpy` is its twin)."""
    core = _passes()
    if core is None:
        return _stream_numpy(pieces, base_ns, row_count, calls)
    table = _NO_TABLE if calls.table is None else calls.table
    given = tuple(tuple(np.ascontiguousarray(c, np.int64) for c in piece) for piece in pieces)
    found = core.stream(given, base_ns, row_count, table, calls.ids, calls.starts)
    if found is None:  # not in start order (a stream's kernels mostly are): sorted first
        joined = _joined(pieces)
        order = np.argsort(base_ns + joined[1] // _PS_PER_NS, kind="stable")
        whole = (tuple(np.ascontiguousarray(c[order], np.int64) for c in joined),)
        found = core.stream(whole, base_ns, row_count, table, calls.ids, calls.starts)
    per_row, latencies, correlated, first, last, *arrays = found
    return _StreamPass(per_row, latencies, correlated, first, last,
                       *(np.frombuffer(a, np.int64) for a in arrays))  # fmt: skip


def _joined(pieces: Sequence[_Piece]) -> _Piece:
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    rows, offs, durs, corrs = (np.concatenate(c) for c in zip(*pieces, strict=True))
    return rows, offs, durs, corrs


def _stream_numpy(
    pieces: Sequence[_Piece], base_ns: int, row_count: int, calls: _Calls
) -> _StreamPass:
    """:func:`_stream_pass`'s twin, in numpy (the pieces joined)."""
    rows, offs, durs, corrs = _joined(pieces)
    if len(rows) and (rows.min() < 0 or rows.max() >= row_count):
        raise ValueError("stream: a row past row_count")
    empty = np.zeros(0, np.int64)
    if not len(rows):
        return _StreamPass([], [], 0, 0, 0, empty, empty, empty, empty, empty, empty)
    dur_ns = durs // _PS_PER_NS  # as XProf's DurationNs
    per_row = list(_per_row(rows, dur_ns))
    start = base_ns + offs // _PS_PER_NS
    end = start + dur_ns
    if (start[1:] < start[:-1]).any():  # a stream's kernels come in order, mostly
        order = np.argsort(start, kind="stable")
        start, end, rows, corrs = start[order], end[order], rows[order], corrs[order]
    reach = np.maximum.accumulate(end)  # the stream's latest end so far
    busy = _sorted_union(start, reach)
    # Each kernel's launch call, by correlation id (-1: none found).
    call = np.full(len(start), -1, np.int64)
    correlated, latencies = 0, []
    if len(calls.ids):
        pos, hit = calls.find(corrs)
        call = np.where(hit, calls.starts[pos], -1)
        linked = hit & (call <= start)  # a call after its kernel is not its launch
        correlated = int(linked.sum())
        latencies = [(row, count, total, high) for row, count, total, _, high
                     in _per_row(rows[linked], (start - call)[linked])]  # fmt: skip
        call = np.where(linked, call, -1)
    idle_from = reach[:-1]  # the stream's latest end before each
    nxt, nxt_call = start[1:], call[1:]
    gap = nxt - idle_from
    open_ = gap > 0
    known = open_ & (nxt_call >= 0)
    return _StreamPass(per_row, latencies, correlated, int(start[0]), int(reach[-1]), *busy,
                       np.maximum(idle_from, nxt_call)[known], nxt[known], gap[open_],
                       gap[known & (nxt_call <= idle_from)])  # fmt: skip


def _length(starts: np.ndarray, ends: np.ndarray) -> int:
    return int((ends - starts).sum()) if len(starts) else 0


@dataclass(frozen=True, slots=True)
class _PlaneSetup:
    """How one GPU plane's stream lines are read: the stat columns (stat id -> column
    below ``_WIDTH``), the texts, and the stats each event metadata gives its events."""

    columns: dict[int, int]
    texts: StatTexts
    meta_stats: dict[int, tuple[int, int, int, bool]]
    by_details: bool
    meta_has_stats: bool  # some event metadata gives its events a stat above
    # (event metadata id, details, module and op codes) -> the reader's row, for the
    # plane's lines: a stream's thousands of distinct kernels recur on the next stream.
    rows: dict[tuple[int, int, int, int], int] = field(default_factory=dict)


class _Reader:
    """Reads one capture's GPU planes into a :class:`CaptureKernels`.

    It is also the capture's ``stream_tap`` (:class:`~exporter.profiles.event_stats.
    LineTap`) while the device flame graph is made: the stream lines that conversion
    reads give their kernels here in the same pass, and :meth:`plane` reads only the
    lines it did not.
    """

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.out = CaptureKernels()
        self.calls = _launch_calls(capture)
        self.out.launches = len(self.calls.ids)
        self._keys: dict[tuple[object, ...], int] = {}
        self._rows: list[_Kernel] = []
        self._configs: dict[str, LaunchConfig | None] = {}
        self._setups: dict[PlaneRef, _PlaneSetup] = {}
        self.devices: dict[PlaneRef, _Device] = {}
        self._done: set[tuple[PlaneRef, int]] = set()  # lines reduced through the tap

    def _config(self, details: str) -> LaunchConfig | None:
        if details not in self._configs:
            self._configs[details] = parse_kernel_details(details)
        return self._configs[details]

    def _row(self, name: str, details: str, module: str, op: str) -> int:
        config = self._config(details)
        key = (name, config.key if config else None, module, op)
        found = self._keys.get(key)
        if found is None:
            found = self._keys[key] = len(self._rows)
            self._rows.append(_Kernel(name, config, module, op))
            self.out.kernels[key] = self._rows[found]
        return found

    def device(self, ref: PlaneRef) -> _Device:
        found = self.devices.get(ref)
        if found is None:
            found = self.devices[ref] = _Device(ref.name)
        return found

    def _setup(self, ref: PlaneRef, plane: Plane) -> _PlaneSetup:
        found = self._setups.get(ref)
        if found is not None:
            return found
        names = {m.id: m.name for m in plane.stat_metadata.values()}
        by_name = {name: sid for sid, name in names.items()}
        details_id = by_name.get("kernel_details", -1)
        memcpy_ids = {by_name.get("memcpy_details", -1), by_name.get("memset_details", -1)} - {-1}
        module_id, op_id = by_name.get("hlo_module", -1), by_name.get("hlo_op", -1)
        corr_id = by_name.get("correlation_id", -1)
        self.out.basis.add("kernel_details" if details_id >= 0 else "lasting events")
        columns = {
            sid: c
            for sid, c in (
                (details_id, _DETAILS),
                (module_id, _MODULE),
                (op_id, _OP),
                (corr_id, _CORRELATION),
            )
            if sid >= 0
        }
        columns |= dict.fromkeys(memcpy_ids, _COPY)  # fmt: skip
        texts = StatTexts(names)
        # Stats on the event metadata hold for every event of it (XProf's visitor reads
        # both); the event's own stats win.
        ids = _KernelStatIds(details_id, module_id, op_id, corr_id, memcpy_ids)
        meta_stats: dict[int, tuple[int, int, int, bool]] = {}
        for meta_id, meta in plane.event_metadata.items():
            d, m, o, copy, _ = ids.read(meta.stats, names, _NO_STATS)
            meta_stats[meta_id] = (texts.code(d), texts.code(m), texts.code(o), copy)
        found = self._setups[ref] = _PlaneSetup(
            columns, texts, meta_stats, details_id >= 0,
            any(stats != (0, 0, 0, False) for stats in meta_stats.values()),
        )  # fmt: skip
        return found

    def wanted(self, ref: PlaneRef, plane: Plane) -> dict[int, int]:
        """LineTap: the stat columns of a GPU plane's stream lines."""
        return self._setup(ref, plane).columns if GPU_PLANE_RE.fullmatch(ref.name) else {}

    def reading(self, ref: PlaneRef, plane: Plane, header: LineHeader) -> _StreamLine | None:
        """LineTap: a stream line's fresh reduction (None for a line that is no stream)."""
        if not GPU_PLANE_RE.fullmatch(ref.name) or not _is_stream(header.id, header.name):
            return None
        if (ref, header.index) in self._done:
            return None
        return _StreamLine(self, ref, plane, header, self._setup(ref, plane))

    def plane(self, ref: PlaneRef, plane: Plane) -> _Device:
        """Read the plane's stream lines the tap has not had; the plane's device."""
        from exporter.profiles.xspace import line_headers

        device = self.device(ref)
        setup = self._setup(ref, plane)
        for header in line_headers(self.capture, plane):
            if not _is_stream(header.id, header.name) or (ref, header.index) in self._done:
                continue

            def reduce(pieces: Iterable[StatEvents], header: LineHeader = header) -> _StreamLine:
                line = _StreamLine(self, ref, plane, header, setup)
                for piece in pieces:
                    line.add(piece, _OWN_COLUMNS)
                return line

            read_stat_events(self.capture, plane, header.index, setup.columns, _WIDTH,
                             reduce).done()  # fmt: skip
        return device

    def _stream(self, device: _Device, base_ns: int, pieces: Sequence[_Piece]) -> None:
        found = _stream_pass(pieces, base_ns, len(self._rows), self.calls)
        for row, count, total, low, high in found.rows:
            self._rows[row].add(count, total, low, high)
        for row, count, total, high in found.latencies:
            self._rows[row].add_latency(count, total, high)
        self.out.correlated += found.correlated
        device.busy.append((found.busy_starts, found.busy_ends))
        lo, hi = found.first_ns, found.last_ns
        device.first_ns = lo if device.first_ns is None else min(device.first_ns, lo)
        device.last_ns = hi if device.last_ns is None else max(device.last_ns, hi)
        if sum(len(piece[0]) for piece in pieces) < 2:  # no gap
            return
        self.out.gaps_ns.append(found.gaps)
        device.launch.append((found.wait_from, found.wait_to))
        self.out.launch_gaps_ns.append(found.launch_gaps)


class _StreamLine:
    """Reduces a stream line's pieces (:class:`StatEvents`) to its kernels: per kernel
    its row, offset and duration (ps) and correlation id, and the events skipped.

    Nothing is counted before :meth:`done`: a line the compiled core hands back to
    protobuf is reduced again from the start, by a fresh one
    (event_stats.read_stat_events); the rows its pieces made are made again alike.
    """

    def __init__(
        self, reader: _Reader, ref: PlaneRef, plane: Plane, header: LineHeader, setup: _PlaneSetup
    ) -> None:
        self.reader, self.ref, self.plane, self.header = reader, ref, plane, header
        self.setup = setup
        self.texts, self.meta_stats, self.by_details = (
            setup.texts, setup.meta_stats, setup.by_details)  # fmt: skip
        self.parts: list[_Piece] = []
        self.skipped = 0

    def add(self, piece: StatEvents, columns: Sequence[int]) -> None:
        """One piece; ``columns[c]`` is the piece's column of this reader's column c."""
        off, dur = piece.offsets, piece.durations
        lasting = dur > 0  # instants carry no time (XProf: DurationNs() == 0)
        sane = (off > -FAR) & (off < FAR) & (dur <= FAR)
        self.skipped += int(np.count_nonzero(lasting & ~sane))
        taken = lasting & sane
        # Every event kept (a stream of kernels): views, not copies.
        sel: slice | np.ndarray = slice(None) if taken.all() else np.flatnonzero(taken)
        meta = piece.ids[sel]
        if not len(meta):
            return
        d, m, o = (self.texts.column(piece, columns[c])[sel] for c in (_DETAILS, _MODULE, _OP))
        copy = piece.kinds[columns[_COPY]][sel] != 0
        if self.setup.meta_has_stats:
            metas, of_meta = dense_index(meta)
            per_meta = np.array([self.meta_stats.get(m, (0, 0, 0, False))
                                 for m in metas.tolist()], np.int64).reshape(-1, 4)  # fmt: skip
            # An event's own stat wins; without one, its metadata's (looked up only then).
            d, m, o = (codes if codes.min() >= 0 else
                       np.where(codes >= 0, codes, per_meta[:, i][of_meta])
                       for i, codes in enumerate((d, m, o)))  # fmt: skip
            if per_meta[:, 3].any():
                copy |= per_meta[:, 3][of_meta] != 0
        else:  # CUPTI's metadata carry no stats: an event without one has none
            d, m, o = (codes if codes.min() >= 0 else np.maximum(codes, 0) for codes in (d, m, o))
        kernel = d != 0 if self.by_details else ~copy
        corr = int_column(piece, columns[_CORRELATION])[sel]
        columns_ = (meta, d, m, o, off[sel], dur[sel], corr)
        if not kernel.all():
            columns_ = tuple(c[kernel] for c in columns_)
        if len(columns_[0]):  # kept as four columns, the piece's texts made its rows
            self.parts.append((self._rows(*columns_[:4]), *columns_[4:]))

    def done(self) -> None:
        """The line was read whole: its kernels go into the reader's rows and device."""
        reader = self.reader
        reader._done.add((self.ref, self.header.index))
        reader.out.skipped += self.skipped
        if not self.parts:
            return
        parts, self.parts = self.parts, []
        device = reader.device(self.ref)
        device.streams += 1
        base_ns = reader.capture.line_start_ns(self.header.timestamp_ns)
        reader._stream(device, base_ns, parts)  # the pieces as they are: not joined

    def _rows(self, meta: np.ndarray, *codes: np.ndarray) -> np.ndarray:
        """Each kernel's row: one per distinct (kernel, details, module, op), made in the
        order of their first kernels (a row is by its key: a line read again makes the
        rows it made before, in the same order)."""
        key, first = first_seen([meta, *codes])
        known = self.setup.rows
        texts = self.texts.texts
        row_of = []
        # Each distinct row's columns gathered at once: one Python step per distinct
        # kernel, a dictionary look-up where the plane has seen it.
        for found in zip(*(c[first].tolist() for c in (meta, *codes)), strict=True):
            row = known.get(found)
            if row is None:
                meta_id, d, m, o = found
                entry = self.plane.event_metadata.get(meta_id)
                name = (entry.name or entry.display_name) if entry else ""
                row = known[found] = self.reader._row(
                    name or f"<kernel {meta_id}>", texts[d], texts[m], texts[o]
                )
            row_of.append(row)
        rows: np.ndarray = np.asarray(row_of, np.int64)[key]
        return rows


def _sorted_union(start: np.ndarray, reach: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~exporter.analysis.facts.intervals.union` of intervals sorted by start,
    none negative, from ``reach``, the running maximum of their ends: a merged interval
    starts where an interval starts past the reach before it, and ends at the reach of
    its last interval (no sort, no scatter)."""
    fresh = np.flatnonzero(np.r_[True, start[1:] > reach[:-1]])
    return start[fresh], reach[np.r_[fresh[1:] - 1, len(start) - 1]]


def _per_row(rows: np.ndarray, values: np.ndarray) -> Iterable[tuple[int, int, int, int, int]]:
    """(row, count, sum, min, max) of ``values`` per distinct row, rows ascending (sums
    exact in int64)."""
    if not len(rows):
        return []
    n = len(values)
    size = int(rows.max()) + 1
    big = max(-int(values.min()), int(values.max())) >> 24
    if rows.min() >= 0 and size <= 4 * n + 1024 and n < 1 << 29 and n * (big + 1) < 1 << 53:
        # Rows are indexes of a few thousand kernels: counted by table in linear time.
        # Sums as two float64 bincounts of 24-bit halves, each below 2**53 (checked
        # above), so exact, joined as Python ints (a row's sum may pass int64).
        count = np.bincount(rows, minlength=size)
        present = np.flatnonzero(count)
        hi, lo = np.divmod(values, 1 << 24)
        high_sums = np.bincount(rows, hi, size)[present].astype(np.int64).tolist()
        low_sums = np.bincount(rows, lo, size)[present].astype(np.int64).tolist()
        total = [(h << 24) + lo for h, lo in zip(high_sums, low_sums, strict=True)]
        low = np.full(size, np.iinfo(np.int64).max)
        np.minimum.at(low, rows, values)
        high = np.full(size, np.iinfo(np.int64).min)
        np.maximum.at(high, rows, values)
        return zip(present.tolist(), count[present].tolist(), total,
                   low[present].tolist(), high[present].tolist(), strict=True)  # fmt: skip
    return _per_row_sorted(rows, values)


def _per_row_sorted(
    rows: np.ndarray, values: np.ndarray
) -> Iterable[tuple[int, int, int, int, int]]:
    """:func:`_per_row` by a sort of the rows (any rows, any values; sums exact)."""
    # Rows are few: as uint16 numpy sorts them by radix, in linear time.
    small = rows.astype(np.uint16) if rows.min() >= 0 and rows.max() < 1 << 16 else rows
    order = np.argsort(small, kind="stable")
    rows, values = rows[order], values[order]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    count = np.diff(np.r_[first, len(rows)])
    # The high and low 32 bits summed apart, neither overflowing int64 (fewer than 2**31
    # values), joined as Python ints: a sum past int64 is exact, as the compiled pass's.
    high = np.add.reduceat(values >> 32, first).tolist()
    low = np.add.reduceat(values & 0xFFFFFFFF, first).tolist()
    totals = [(h << 32) + lo for h, lo in zip(high, low, strict=True)]
    return zip(rows[first].tolist(), count.tolist(), totals,
               np.minimum.reduceat(values, first).tolist(),
               np.maximum.reduceat(values, first).tolist(), strict=True)  # fmt: skip


def kernel_tap(capture: Capture) -> LineTap | None:
    """What reads the kernels of the GPU stream lines a conversion of ``capture`` reads
    (set it as ``capture.stream_tap`` for the conversion, then pass it to
    :func:`read_kernels`); None when the capture has no GPU plane."""
    if not any(GPU_PLANE_RE.fullmatch(ref.name) for ref in capture.planes):
        return None
    return _Reader(capture)


def read_kernels(
    capture: Capture, cycles: Sequence[tuple[int, int]] = (), tap: LineTap | None = None
) -> CaptureKernels | None:
    """The GPU kernels of one capture; None when it has no GPU plane.

    ``cycles`` (absolute ns) are the step cycles: launch overhead is also counted
    inside them, for a per-step figure. ``tap``: a :func:`kernel_tap` of this capture
    that has had some stream lines already; the others are read here.
    """
    from exporter.analysis.facts.intervals import covered, subtract

    gpus = [ref for ref in capture.planes if GPU_PLANE_RE.fullmatch(ref.name)]
    if not gpus:
        return None
    reader = tap if isinstance(tap, _Reader) and tap.capture is capture else _Reader(capture)
    out = reader.out
    for ref in gpus:
        device = reader.plane(ref, capture.plane(ref))
        if device.first_ns is None or device.last_ns is None:
            continue
        busy = union(*(np.concatenate(parts) for parts in zip(*device.busy, strict=True)))
        span = device.last_ns - device.first_ns
        entry: dict[str, Any] = {
            "device": ref.name,
            "streams": device.streams,
            "span_ms": round(span / 1e6, 6),
            "busy_ms": round(_length(*busy) / 1e6, 6),
        }
        if device.launch:
            waits = union(*(np.concatenate(parts) for parts in zip(*device.launch, strict=True)))
            keep = waits[1] > waits[0]
            waits = (waits[0][keep], waits[1][keep])
            # Launch waits while no kernel ran on any stream of the device.
            idle = subtract(waits[0], waits[1], *busy)
            overhead = _length(*idle)
            entry["launch_overhead_ms"] = round(overhead / 1e6, 6)
            entry["launch_share_pct"] = round(100 * overhead / span, 3) if span else 0.0
            if cycles:
                inside = int(covered(*idle, cycles).sum())
                entry["launch_overhead_in_steps_ms"] = round(inside / 1e6, 6)
        out.devices.append(entry)
    if cycles:
        out.cycles = len(cycles)
        out.cycle_ns = sum(hi - lo for lo, hi in cycles)
    return out


def _kernel_json(kernel: _Kernel, total_ns: int) -> dict[str, Any]:
    n = kernel.occurrences
    return {
        "name": kernel.name,
        "hlo_module": kernel.module or None,
        "hlo_op": kernel.op or None,
        "occurrences": n,
        "total_ns": kernel.total_ns,
        "min_ns": kernel.min_ns,
        "max_ns": kernel.max_ns,
        "total_ms": round(kernel.total_ns / 1e6, 6),
        "mean_us": round(kernel.total_ns / n / 1e3, 3) if n else None,
        "min_us": round(kernel.min_ns / 1e3, 3),
        "max_us": round(kernel.max_ns / 1e3, 3),
        "share_pct": round(100 * kernel.total_ns / total_ns, 3) if total_ns else 0.0,
        "launch": kernel.config.to_json() if kernel.config else None,
        "launch_latency_mean_us": (
            round(kernel.latency_total_ns / kernel.latency_count / 1e3, 3)
            if kernel.latency_count
            else None
        ),
        "launch_latency_max_us": (
            round(kernel.latency_max_ns / 1e3, 3) if kernel.latency_count else None
        ),
    }


def _median_us(parts: list[np.ndarray]) -> float | None:
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return round(float(np.median(values)) / 1e3, 3) if len(values) else None


def _launch_json(found: Sequence[CaptureKernels], kernels: list[_Kernel]) -> dict[str, Any]:
    launches = sum(f.launches for f in found)
    correlated = sum(f.correlated for f in found)
    if not launches or not correlated:
        return {
            "available": False,
            "reason": (
                "no kernel launch calls (cuLaunchKernel, cudaLaunchKernel, hipLaunchKernel, "
                "...) with a correlation_id on a host plane"
                if not launches
                else f"{launches} launch calls on the host planes, but no kernel's "
                "correlation_id matches one"
            )
            + ": the gaps between kernels cannot be told apart from host idle time",
        }
    devices = [d for f in found for d in f.devices if "launch_overhead_ms" in d]
    overhead = sum(d["launch_overhead_ms"] for d in devices)
    span = sum(d["span_ms"] for d in devices)
    gaps = [g for f in found for g in f.gaps_ns]
    launch_gaps = [g for f in found for g in f.launch_gaps_ns]
    count = int(sum(len(g) for g in gaps))
    launched = int(sum(len(g) for g in launch_gaps))
    out: dict[str, Any] = {
        "available": True,
        "launch_overhead_ms": round(overhead, 6),
        "share_pct": round(100 * overhead / span, 3) if span else 0.0,
        "denominator": "the GPUs' kernel span (first kernel start to last kernel end, "
        "summed over devices)",
        "gaps": count,
        "launch_gaps": launched,
        "host_gaps": count - launched,
        "median_gap_us": _median_us(gaps),
        "median_launch_gap_us": _median_us(launch_gaps),
        "launch_calls": launches,
        "correlated_kernels": correlated,
        "per_step": None,
        "top_latency": [
            {
                "name": k.name,
                "hlo_op": k.op or None,
                "launches": k.latency_count,
                "mean_us": round(k.latency_total_ns / k.latency_count / 1e3, 3),
                "max_us": round(k.latency_max_ns / 1e3, 3),
            }
            for k in sorted(
                (k for k in kernels if k.latency_count),
                key=lambda k: -k.latency_total_ns / k.latency_count,
            )[:TOP_LATENCY]
        ],
    }
    stepped = [f for f in found if f.cycles]
    if stepped:
        inside = sum(d.get("launch_overhead_in_steps_ms", 0.0) for f in stepped for d in f.devices)
        # Each device's step time is the host's cycles: the denominator counts them once
        # per device whose overhead is summed.
        window = sum(f.cycle_ns / 1e6 * len(f.devices) for f in stepped)
        steps = sum(f.cycles for f in stepped)
        per_device = sum(f.cycles * len(f.devices) for f in stepped)
        out["per_step"] = {
            "steps": steps,
            "launch_overhead_ms_per_step": round(inside / per_device, 6) if per_device else 0.0,
            "share_of_step_pct": round(100 * inside / window, 3) if window else 0.0,
        }
    return out


def gpu_kernel_facts(
    found: Sequence[CaptureKernels | None], backend: str, top: int = TOP_KERNELS
) -> dict[str, Any]:
    """``facts.gpu_kernels`` from each capture's :func:`read_kernels` (``top`` rows)."""
    read = [f for f in found if f is not None]
    if not read:
        return {"available": False,
                "reason": f"no GPU device plane (/device:GPU:N) in this {backend.upper()} "
                          "capture: there are no CUDA kernels to count"}  # fmt: skip
    merged: dict[tuple[object, ...], _Kernel] = {}
    for f in read:
        for key, kernel in f.kernels.items():
            into = merged.get(key)
            if into is None:
                merged[key] = into = _Kernel(kernel.name, kernel.config, kernel.module, kernel.op)
            into.add(kernel.occurrences, kernel.total_ns, kernel.min_ns, kernel.max_ns)
            if kernel.latency_count:
                into.add_latency(kernel.latency_count, kernel.latency_total_ns,
                                 kernel.latency_max_ns)  # fmt: skip
    kernels = [k for k in merged.values() if k.occurrences]
    if not kernels:
        return {"available": False,
                "reason": "the GPU planes have no kernel events (no lasting event with "
                          "kernel_details on a stream line)"}  # fmt: skip
    total = sum(k.total_ns for k in kernels)
    kernels.sort(key=lambda k: (-k.total_ns, k.name, k.module, k.op))
    basis = set().union(*(f.basis for f in read))
    return {
        "available": True,
        "source": "kernel events on the stream lines of the GPU planes",
        "kernel_basis": (
            "events with kernel_details (XProf's kernel test)"
            if basis == {"kernel_details"}
            else "every lasting event of a stream line that is no memcpy (a plane without "
            "kernel_details)"
        ),
        "devices": sum(len(f.devices) for f in read),
        "streams": sum(d["streams"] for f in read for d in f.devices),
        "kernel_count": sum(k.occurrences for k in kernels),
        "distinct_kernels": len(kernels),
        "total_ms": round(total / 1e6, 6),
        "denominator": "all kernel time on the GPU planes (durations summed, every stream)",
        "skipped_events": sum(f.skipped for f in read),
        "kernels": [_kernel_json(k, total) for k in kernels[:top]],
        "devices_detail": [d for f in read for d in f.devices],
        "launch_overhead": _launch_json(read, kernels),
    }
