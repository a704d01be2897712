"""XLA computations that ran on host threads: the CPU backend's "device".

A JAX CPU capture has no device plane; XLA's CPU client runs each HLO op (a thunk) on
its own threads (``tf_XLAPjRtCpuClient``, ``tf_XLAEigen``), and every such event
carries ``hlo_op`` and ``hlo_module`` stats. Work the executor hands to a thread pool
without such an event shows as ``ThunkExecutor::Execute (wait for completion)`` on the
client thread (with the program's ``run_id``): that is XLA time too. These events are
to a CPU capture what a TPU's ``XLA Ops`` line is to a TPU: they give it a device-time
flame graph (program > op, whichever thread ran it) and the time inside a step when
XLA computes.

Events that nest on one thread (a ``while`` thunk running its body) are stacked:
each event adds its time to its own frame and takes it from its parent's, so self
time excludes nested ops, as XProf computes it.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

import numpy as np

from exporter.errors import InputError
from exporter.profiles.event_stats import (
    KIND_INT64,
    KIND_NONE,
    KIND_REF,
    KIND_STR,
    KIND_UINT64,
    StatEvents,
    read_stat_events,
)
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.frames import FrameLabel
from exporter.profiles.tree_graphs import graphs_by_frame
from exporter.profiles.xplane import Capture
from exporter.profiles.xspace import Plane, compiled_core, line_header, read_line

__all__ = ["RUNTIME_WAIT_RE", "XlaEvents", "graphs", "xla_host_events"]

HLO_OP_STAT = "hlo_op"
HLO_MODULE_STAT = "hlo_module"
RUN_ID_STAT = "run_id"
# XLA's CPU executor waiting for the program's asynchronous thunks (e.g. a dot on the
# Eigen pool, whose work carries no hlo_op event): the program is still computing.
EXECUTOR_WAIT_PREFIX = "ThunkExecutor::Execute"
# Frames whose time is the runtime waiting for work that other frames hold: the
# executor waiting for its thunks (``ThunkExecutor::Execute``, ``ThunkExecutor >
# Execute`` as host nesting names it), a host thread dispatching or awaiting an
# executable. Never "work that grew", never the "top op".
RUNTIME_WAIT_RE: Final = re.compile(
    r"^(ThunkExecutor( > |::)Execute|CommonPjRtLoadedExecutable|PjitFunction\(|PjRt|TfrtCpu"
    r"|.*block_until_ready|.*BlockHostUntilReady|.*::Await)"
)
UNKNOWN_PROGRAM = "<unknown program>"
_PS_PER_NS = 1000
_INT64 = 1 << 63
_META_ID = attrgetter("metadata_id")


@dataclass
class XlaEvents:
    """XLA events of the host planes, absolute nanoseconds since the epoch.

    ``paths[path_index[i]]`` is event ``i``'s stack (program, outer ops..., op);
    ``parent[i]`` the event it nests in on its thread, or -1.
    """

    start: np.ndarray
    end: np.ndarray
    path_index: np.ndarray
    parent: np.ndarray
    paths: list[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.start)


def _module_names(plane: object) -> dict[int, str]:
    return {k: m.name for k, m in plane.stat_metadata.items()}  # type: ignore[attr-defined]


def xla_host_events(capture: Capture) -> XlaEvents:
    """XLA events of the capture's host planes: ``hlo_op`` events and executor waits.

    Each line's events are read with their ``hlo_op``, ``hlo_module`` and ``run_id``
    stats as columns by the compiled core (:func:`_column_rows`): only the XLA events
    (a few thousand in a Python-traced capture's tens of thousands) reach Python. The
    twin, :func:`_parsed_rows`, reads the line through protobuf an event at a time
    (``MLPROF_DECODER=python``); both give the same rows (``tests/unit/test_decoder.py``).
    """
    starts: list[int] = []
    ends: list[int] = []
    path_ids: list[int] = []
    parents: list[int] = []
    paths: dict[tuple[str, ...], int] = {}
    path_list: list[tuple[str, ...]] = []
    line_rows = _column_rows if compiled_core() is not None else _parsed_rows
    for ref in capture.host_planes:
        plane = capture.plane(ref)
        names = _module_names(plane)
        op_id = next((k for k, n in names.items() if n == HLO_OP_STAT), None)
        module_id = next((k for k, n in names.items() if n == HLO_MODULE_STAT), None)
        run_stat = next((k for k, n in names.items() if n == RUN_ID_STAT), None)
        if op_id is None:
            continue
        waits = {
            k for k, m in plane.event_metadata.items() if m.name.startswith(EXECUTOR_WAIT_PREFIX)
        }
        stats = _StatIds(op_id, module_id, run_stat, names)
        lines: list[list[tuple[int, int, int, str, int]]] = []
        program_of_run: dict[int, str] = {}
        for index in range(len(plane.lines)):
            try:
                timestamp_ns, rows = line_rows(capture, plane, index, stats, waits)
            except InputError:
                raise InputError(
                    f"{capture.source}: corrupt XProf capture (a line does not parse)"
                ) from None
            base_ps = capture.line_start_ns(timestamp_ns) * _PS_PER_NS
            # start ps, end ps, metadata id, program, run id
            found: list[tuple[int, int, int, str, int]] = []
            for meta_id, offset_ps, duration_ps, is_op, program, run in rows:
                if is_op and program and run:
                    program_of_run[run] = program
                if is_op or (run and meta_id in waits):
                    start = base_ps + offset_ps
                    found.append((start, start + duration_ps, meta_id, program, run))
            if found:
                lines.append(found)
        for number, on_line in enumerate(lines):
            on_line.sort(key=lambda e: (e[0], -e[1]))
            found = _trim_waits(on_line, waits, [x for k, x in enumerate(lines) if k != number])
            open_events: list[tuple[int, int]] = []  # (end ps, global index)
            for start, end, meta_id, program, run in found:
                while open_events and (open_events[-1][0] <= start or open_events[-1][0] < end):
                    open_events.pop()  # ended, or overlaps without containing: not a parent
                meta = plane.event_metadata.get(meta_id)
                op = (meta.name or meta.display_name) if meta is not None else f"<op {meta_id}>"
                parent = open_events[-1][1] if open_events else -1
                named = program or program_of_run.get(run, "") or UNKNOWN_PROGRAM
                stack = (*path_list[path_ids[parent]], op) if parent >= 0 else (named, op)
                index = paths.get(stack, -1)
                if index < 0:
                    index = paths[stack] = len(path_list)
                    path_list.append(stack)
                starts.append(start // _PS_PER_NS)
                ends.append(end // _PS_PER_NS)
                path_ids.append(index)
                parents.append(parent)
                open_events.append((end, len(starts) - 1))
    if (starts and min(starts) < -_INT64) or (ends and max(ends) >= _INT64):
        raise InputError(f"{capture.source}: corrupt XProf capture (an event ends past 2**63 ns)")
    return XlaEvents(
        np.asarray(starts, np.int64),
        np.asarray(ends, np.int64),
        np.asarray(path_ids, np.int64),
        np.asarray(parents, np.int64),
        path_list,
    )


@dataclass(frozen=True)
class _StatIds:
    """A host plane's stat metadata ids of the stats an XLA event is read by."""

    op: int
    module: int | None
    run: int | None
    names: dict[int, str]  # every stat id's name: a module's ref_value names one


# (metadata id, offset ps, duration ps, is an op, program, run id) of a line's lasting
# events of XLA's metadata ids: those in ``waits``, or whose first event on the line
# carries ``hlo_op`` (most host events, Python and TraceMe, are not XLA).
Row = tuple[int, int, int, bool, str, int]


def _parsed_rows(
    capture: Capture, plane: Plane, index: int, stats: _StatIds, waits: set[int]
) -> tuple[int, list[Row]]:
    """The line's timestamp and rows, read through protobuf (:func:`_column_rows`' twin)."""
    line = read_line(capture, plane, index)
    events = line.events
    ids = np.fromiter(map(_META_ID, events), np.int64, len(events))
    unique, first = np.unique(ids, return_index=True)
    xla_ids = [
        m
        for m, i in zip(unique.tolist(), first.tolist(), strict=True)
        if m in waits or any(st.metadata_id == stats.op for st in events[i].stats)
    ]
    rows: list[Row] = []
    for at in np.flatnonzero(np.isin(ids, xla_ids)).tolist():
        event = events[at]
        if event.duration_ps <= 0:
            continue
        program, run, is_op = "", 0, False
        for stat in event.stats:
            if stat.metadata_id == stats.op:
                is_op = True
            elif stat.metadata_id == stats.module:
                ref_value = stat.ref_value
                program = stats.names.get(ref_value, "") if ref_value else stat.str_value
            elif stat.metadata_id == stats.run:
                run = stat.int64_value or stat.uint64_value
        rows.append((event.metadata_id, event.offset_ps, event.duration_ps, is_op, program, run))
    return line.timestamp_ns, rows


_OP, _MODULE, _RUN = range(3)  # the stat columns of a line's read


def _column_rows(
    capture: Capture, plane: Plane, index: int, stats: _StatIds, waits: set[int]
) -> tuple[int, list[Row]]:
    """The line's timestamp and rows from the compiled core's columns (the last stat of
    each id, as the twin's loop keeps the last; a module's text and a run id are read
    as protobuf gives them: a ref_value's name, a str_value, an unsigned uint64)."""
    header = line_header(capture, plane, index)
    columns = {stats.op: _OP}
    if stats.module is not None:
        columns[stats.module] = _MODULE
    if stats.run is not None:
        columns[stats.run] = _RUN
    ids, offsets, durations, kinds, values, strings = read_stat_events(
        capture, plane, index, columns, 3, _joined
    )
    pick = np.flatnonzero(_of_xla_ids(ids, kinds[_OP] != KIND_NONE, waits) & (durations > 0))
    modules: dict[tuple[int, int], str] = {}
    rows: list[Row] = []
    for meta_id, offset, duration, op_kind, module_kind, module, run_kind, run in zip(
        *(c[pick].tolist() for c in (ids, offsets, durations, kinds[_OP], kinds[_MODULE],
          values[_MODULE], kinds[_RUN], values[_RUN])), strict=True,
    ):  # fmt: skip
        program = modules.get((module_kind, module))
        if program is None:
            program = ""
            if module_kind == KIND_REF and module:
                program = stats.names.get(module % (1 << 64), "")
            elif module_kind == KIND_STR:
                program = strings[module]
            modules[module_kind, module] = program
        # An int64 or uint64 (read from its int64 bits) value; any other reads as 0.
        run_id = (
            run % (1 << 64) if run_kind == KIND_UINT64 else run if run_kind == KIND_INT64 else 0
        )
        rows.append((meta_id, offset, duration, op_kind != KIND_NONE, program, run_id))
    return header.timestamp_ns, rows


def _of_xla_ids(ids: np.ndarray, has_op: np.ndarray, waits: set[int]) -> np.ndarray:
    """Per event, whether its metadata id is XLA's: in ``waits``, or its first event on
    the line has an ``hlo_op`` stat (``has_op``). Metadata ids are small counters in
    every writer's captures: a table by id, where it stays small, else a sort."""
    n = len(ids)
    if not n:
        return np.zeros(0, bool)
    if int(ids.min()) >= 0 and int(ids.max()) <= 4 * n + 1024:
        first = np.full(int(ids.max()) + 1, n, np.int64)
        np.minimum.at(first, ids, np.arange(n, dtype=np.int64))
        present = np.flatnonzero(first < n)
        xla = np.zeros(len(first), bool)
        xla[present] = has_op[first[present]]
        xla[[m for m in waits if 0 <= m < len(first)]] = True
        found: np.ndarray = xla[ids]
        return found
    unique, at = np.unique(ids, return_index=True)
    return np.isin(ids, unique[has_op[at] | np.isin(unique, list(waits))])


def _joined(
    pieces: Iterator[StatEvents],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """A line's pieces as one: ids, offsets, durations, kinds, values and the strings
    (a piece's str_value indexes shifted past the pieces before it)."""
    parts = []
    strings: list[str] = []
    for piece in pieces:
        values = piece.values.copy()
        values[piece.kinds == KIND_STR] += len(strings)
        strings.extend(piece.strings)
        parts.append((piece.ids, piece.offsets, piece.durations, piece.kinds, values))
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, np.zeros((3, 0), np.int8), np.zeros((3, 0), np.int64), []
    ids, offsets, durations = (np.concatenate([p[k] for p in parts]) for k in range(3))
    kinds = np.concatenate([p[3] for p in parts], axis=1)
    return ids, offsets, durations, kinds, np.concatenate([p[4] for p in parts], axis=1), strings


def _trim_waits(
    found: list[tuple[int, int, int, str, int]],
    waits: set[int],
    other_lines: list[list[tuple[int, int, int, str, int]]],
) -> list[tuple[int, int, int, str, int]]:
    """An executor wait, less the time ops run on the plane's other threads.

    The executor waits on its thread while the pool runs the program's thunks; when the
    pool's work carries ``hlo_op`` events of its own (a dot on a ``tf_XLAEigen`` thread),
    that time is already the op's, and counting the wait too counted it twice: on an idle
    machine 16 % of ``tests/integration/formatting_workload.py``'s XLA time was such a
    wait, and its layout copy read 28.5 % where it took 33 %. A wait that holds ops of its
    own thread is kept whole (their time is taken from it by nesting).
    """
    if not waits or not any(e[2] in waits for e in found):
        return found
    busy: list[list[int]] = []  # the other threads' op time, merged: [start, end) ps
    for lo, hi in sorted((e[0], e[1]) for line in other_lines for e in line if e[2] not in waits):
        if busy and lo <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], hi)
        else:
            busy.append([lo, hi])
    if not busy:
        return found
    ends = [hi for _, hi in busy]  # picoseconds since the epoch: past int64, no numpy
    out: list[tuple[int, int, int, str, int]] = []
    for k, event in enumerate(found):
        start, end, meta_id, program, run = event
        nested = k + 1 < len(found) and found[k + 1][0] < end
        if meta_id not in waits or nested:
            out.append(event)
            continue
        cursor = start
        for lo, hi in itertools.islice(busy, bisect.bisect_right(ends, start), None):
            if lo >= end:
                break
            if lo > cursor:
                out.append((cursor, lo, meta_id, program, run))
            cursor = hi
            if cursor >= end:
                break
        if cursor < end:
            out.append((cursor, end, meta_id, program, run))
    return out


def graphs(
    events: XlaEvents, windows: Sequence[tuple[int, int]] | None, time_nanos: int = 0
) -> list[FlameGraph]:
    """Device-time graphs (program > op, ns): one per window, or one of all time.

    ``windows`` are disjoint and sorted. Each event adds its overlap with a window to
    its own frame there and takes it from its parent's; events are placed in windows by
    binary search, so the cost is O(events log windows), not events x windows.
    """
    spans = list(windows) if windows is not None else [(-(1 << 62), 1 << 62)]
    n_paths, n_windows = len(events.paths), len(spans)
    lows = np.asarray([lo for lo, _ in spans], np.int64)
    highs = np.asarray([hi for _, hi in spans], np.int64)
    first = np.searchsorted(highs, events.start, side="right")  # first window ending after
    last = np.searchsorted(lows, events.end, side="left") - 1  # last window starting before
    keys: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    parent_path = np.where(events.parent >= 0, events.path_index[events.parent], -1)

    def add(index: np.ndarray, window: np.ndarray) -> None:
        part = np.minimum(events.end[index], highs[window]) - np.maximum(
            events.start[index], lows[window]
        )
        keep = part > 0
        index, window, part = index[keep], window[keep], part[keep]
        keys.append(window * n_paths + events.path_index[index])
        weights.append(part)
        nested = parent_path[index] >= 0
        keys.append(window[nested] * n_paths + parent_path[index][nested])
        weights.append(-part[nested])

    single = np.flatnonzero((first == last) & (first < n_windows) & (last >= 0))
    add(single, first[single])
    for i in np.flatnonzero(last > first).tolist():  # events spanning window edges: few
        span = np.arange(first[i], last[i] + 1)
        add(np.full(len(span), i), span)
    total: np.ndarray = np.zeros(n_windows * n_paths)
    if keys:
        total = np.bincount(
            np.concatenate(keys), weights=np.concatenate(weights), minlength=n_windows * n_paths
        )
    per_window = total.reshape(n_windows, n_paths)
    template = FlameGraph(sample_type="device_time", unit="nanoseconds", profile_name="device")
    wins, found = np.nonzero(per_window > 0)  # by window, then path: the order frames come
    ns = np.round(per_window[wins, found])  # half to even, as round() does
    # Totals past int64 ns (the builder's are int64), or a float residue that rounds to 0
    # (a frame of no time, which add() makes and the builder leaves out): only hostile
    # input, a value at a time.
    if len(ns) and (float(ns.sum()) >= _INT64 or ns.min() < 1):
        out = _graphs_one_by_one(events.paths, per_window, n_windows, template)
    else:
        # Each path a node below the root (its frames the path's labels), its time per
        # window the node's: the frame builder makes each window's frames once, in the
        # order FlameGraph.add would (by path, ancestors first), with the same totals.
        parent = [-1] + [0] * n_paths
        tuple_of = [-1, *range(n_paths)]
        labels = [tuple(FrameLabel(name) for name in path) for path in events.paths]
        values = (found.astype(np.int64) + 1, wins.astype(np.int64), ns.astype(np.int64))
        out = graphs_by_frame(parent, tuple_of, labels, template, values, n_windows)
    for graph, (lo, _) in zip(out, spans, strict=True):
        graph.time_nanos = max(lo, time_nanos) if windows is not None else time_nanos
    return out


def _graphs_one_by_one(
    paths: list[tuple[str, ...]], per_window: np.ndarray, n_windows: int, template: FlameGraph
) -> list[FlameGraph]:
    """:func:`graphs`' frames added a path at a time (for sums past int64 ns)."""
    out = []
    for w in range(n_windows):
        graph = template.copy()
        row = per_window[w]
        for index in np.flatnonzero(row > 0).tolist():
            graph.add(paths[index], round(float(row[index])))
        out.append(graph)
    return out
