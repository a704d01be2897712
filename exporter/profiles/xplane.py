"""XProf captures (``*.xplane.pb``) -> device-time and host-time flame graphs.

Reads the XSpace with the project's own schema (no JAX, no xprof).

Device time stacks program > framework name scope > op category > HLO op from the
``XLA Ops`` line of each ``/device:TPU:N`` / ``/device:GPU:N`` plane. Ops nest by time
containment on that line (a ``while`` holds its body's ops): a nested op sits below the
op that contains it, and an op's self time is its duration minus its nested ops', as
XProf's ``op_profile`` computes it. GPU stream lines (no ``XLA Ops`` line) whose kernels
carry ``hlo_module``/``hlo_op``/``tf_op`` stats stack program > name scope > op > kernel.

Host time stacks ``/host:CPU`` events per thread by time; Python-tracer events become
Python frames. Threads of one name are told apart by a short ordinal, busiest first
(``python #1``, ``python #2``: most events, then most event time), so two captures of
one workload label its threads alike; the line ids (hashes, not thread ids) go to the
graph's ``comments`` (the pprof's ``comment``). Thread-pool lines fold into one frame
per pool.
Events that overlap without nesting follow the ``split`` rule of
:mod:`exporter.profiles.nesting`: at every instant the stack is the events open then,
in start order, so an event that begins inside another and outlives it has its head
under that event and its tail beside it, and every event's time stays under its own
name. A TraceMe nested in a TraceMe of the same name folds into one frame.

Events nested deeper than ``MAX_EVENT_DEPTH`` fold into one frame named ``CUT_FRAME``
(totals stay exact). Each graph comes from :class:`FrameTree`, which also splits self time
across time windows for :mod:`exporter.profiles.steps`.

Speed: events are touched once each, reading three integer fields into numpy arrays;
nesting, grouping and windows run in numpy (a Python loop only for lines whose events
overlap without nesting), and labels are computed once per distinct event kind.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import numpy as np

from exporter.profiles.event_stats import (
    StatEvents,
    StatTexts,
    TapLine,
    first_seen,
    merge_columns,
    read_stat_events,
)
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.frames import FrameLabel, label_native, parse_python_tracer
from exporter.profiles.nesting import FAR, Nested, aggregate, dense_index, nest, window_self
from exporter.profiles.tree_graphs import graphs_by_frame, kept_windows, segment_nodes
from exporter.profiles.xspace import (
    DEVICE_PLANE_RE,
    HOST_PLANE,
    PS_PER_NS,
    Capture,
    LineHeader,
    OpLine,
    Plane,
    PlaneRef,
    compiled_core,
    event_columns,
    lasting_columns,
    line_headers,
    line_pieces,
    load_capture,
    parse_xspace,
    read_line,
    stat_values,
)

# The decoding names (Capture, load_capture, ...) are also this module's: callers that
# convert a capture open it and build its graphs through one import.
__all__ = [
    "CUT_FRAME",
    "DEVICE_PLANE_RE",
    "HOST_PLANE",
    "MAX_EVENT_DEPTH",
    "Capture",
    "FrameTree",
    "OpLine",
    "PlaneRef",
    "device_flamegraph",
    "device_graphs",
    "graph_template",
    "host_flamegraph",
    "host_graphs",
    "line_headers",
    "load_capture",
    "parse_xspace",
    "read_line",
    "xplane_flamegraphs",
]

XLA_OPS = "XLA Ops"
XLA_MODULES = "XLA Modules"
STEPS = "Steps"
# Lines on a device plane that are not op executions (derived or summary lines).
_NON_OP_LINES = frozenset({XLA_MODULES, STEPS, "XLA TraceMe", "Framework Ops",
                           "Framework Name Scope", "Source code", "Host Offload Ops",
                           "SparseCore Steps", "Sparse Core Ops"})  # fmt: skip
_THREAD_ID_SUFFIX = re.compile(r"/-?\d+$")
_PROGRAM_ID_SUFFIX = re.compile(r"\(-?\d+\)$")
UNKNOWN_PROGRAM = "<unknown program>"
# Pyroscope's default stack-depth limit: deeper events fold into one frame, which also
# bounds the cost of pathological nesting (a 20,000-deep line) to O(events * 1).
MAX_EVENT_DEPTH = 1000
CUT_FRAME = f"<events nested deeper than {MAX_EVENT_DEPTH}>"


# -- frames and their time ------------------------------------------------------------
Labels = tuple[FrameLabel, ...]
FOLD = -1  # a segment whose frames are its parent's (adjacent identical frames)


class FrameTree:
    """The frame tree shared by the lines of one conversion, and self time per window.

    Public: torch.profiler traces (:mod:`exporter.profiles.torch_trace`) build their host
    and device graphs on it too, so both kinds of capture nest and window alike.

    Nodes are interned as (parent node, frame-tuple id); a frame tuple is the labels one
    event adds below its parent (device ops add name scopes, category and op). Node 0 is
    the graph's root. Events nested deeper than ``MAX_EVENT_DEPTH`` fold into one frame.
    """

    def __init__(self, windows_ns: np.ndarray | None) -> None:
        self.windows_ns = windows_ns  # (n, 2) absolute ns, or None: one unbounded window
        self.parent: list[int] = [-1]
        self.tuple_of: list[int] = [-1]
        self._nodes: dict[tuple[int, int], int] = {}
        self.tuples: list[Labels] = []
        self._tuple_ids: dict[Labels, int] = {}
        self._op_tuples: dict[tuple[_OpInfo, str | None, _OpInfo | None], int] = {}
        self._labels: dict[str, FrameLabel] = {}
        self.cut = self.tuple_id((FrameLabel(CUT_FRAME),))
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.core = compiled_core()  # nesting and whole-line self time in C, else numpy

    def tuple_id(self, labels: Labels) -> int:
        found = self._tuple_ids.get(labels)
        if found is None:
            found = self._tuple_ids[labels] = len(self.tuples)
            self.tuples.append(labels)
        return found

    def op_tuple(self, info: _OpInfo, program: str | None, outer: _OpInfo | None) -> int:
        """The tuple id of an op's frames (cached: the chips of a capture share their ops)."""
        key = (info, program, outer)
        found = self._op_tuples.get(key)
        if found is None:
            names = _op_labels(info, program, outer)
            # One label per distinct name (the program, scopes and categories repeat in
            # most ops): made once, not once per op.
            labels = tuple(self._labels.get(x) or self._labels.setdefault(x, FrameLabel(x))
                           for x in names)  # fmt: skip
            found = self._op_tuples[key] = self.tuple_id(labels)
        return found

    def node(self, parent: int, tuple_id: int) -> int:
        key = (parent, tuple_id)
        found = self._nodes.get(key)
        if found is None:
            found = self._nodes[key] = len(self.parent)
            self.parent.append(parent)
            self.tuple_of.append(tuple_id)
        return found

    def _level(self, parents: np.ndarray, tuple_ids: np.ndarray) -> np.ndarray:
        """Nodes of (parent node, tuple id) pairs, interning each distinct pair once."""
        out = parents.copy()
        real = tuple_ids != FOLD
        if not real.any():
            return out
        width = max(len(self.tuples), 1)
        pairs, inverse = dense_index(parents[real] * width + tuple_ids[real])
        made = np.fromiter(
            (self.node(int(k) // width, int(k) % width) for k in pairs.tolist()),
            np.int64,
            len(pairs),
        )
        out[real] = made[inverse]
        return out

    def assign(self, nested: Nested, tuple_ids: np.ndarray, root: int) -> np.ndarray:
        """The node of each segment, level by level (a parent's node before its child's)."""
        n = len(nested)
        depth = nested.depth
        top = int(depth.max()) if n else 0
        if top == 0:  # a flat line (most device lines): one level, no sorting
            return self._level(np.full(n, root, np.int64), tuple_ids)
        node = np.zeros(n, np.int64)
        # Depths are small: as uint16 numpy sorts them by radix, in linear time.
        small = depth.astype(np.uint16) if top < 1 << 16 else depth
        order = np.argsort(small, kind="stable")
        bounds = np.searchsorted(depth[order], np.arange(min(top, MAX_EVENT_DEPTH) + 2))
        for level in range(min(top, MAX_EVENT_DEPTH) + 1):
            idx = order[bounds[level] : bounds[level + 1]]
            parents = np.full(len(idx), root, np.int64) if level == 0 else node[nested.parent[idx]]
            ids = tuple_ids[idx] if level < MAX_EVENT_DEPTH else np.full(len(idx), self.cut)
            node[idx] = self._level(parents, ids)
        if top > MAX_EVENT_DEPTH:
            # Deeper segments share the cut frame of their ancestor at the cap: in start
            # order, that ancestor is the latest segment at the cap before them.
            at_cap = np.where(depth == MAX_EVENT_DEPTH, np.arange(n), -1)
            ancestor = np.maximum.accumulate(at_cap)
            deep = depth > MAX_EVENT_DEPTH
            node[deep] = node[ancestor[deep]]
        return node

    def _add_tree(self, tree: tuple[bytes, bytes, bytes, bytes, int | None], root: int) -> None:
        """Add the compiled core's ``self_tree`` of a line below node ``root``.

        Its nodes are interned here as :meth:`assign` interns them: level by level, each
        level's new (parent node, tuple) pairs in sorted order, so node ids, and every
        graph built from them, are the numpy path's.
        """
        parent_b, tuple_b, level_b, self_b, root_self = tree
        made = self._intern(parent_b, tuple_b, level_b, root)[1:]
        sums = np.frombuffer(self_b, np.int64)
        if root_self is not None:
            made = np.append(made, root)
            sums = np.append(sums, root_self)
        self._parts.append((made, np.zeros(len(made), np.int64), sums))

    def _intern(self, parent_b: bytes, tuple_b: bytes, level_b: bytes, root: int) -> np.ndarray:
        """This tree's node of each node of a compiled node table (index 0 the root)."""
        parents = np.frombuffer(parent_b, np.int64).tolist()
        tuples = np.frombuffer(tuple_b, np.int64).tolist()
        levels = np.frombuffer(level_b, np.int64).tolist()
        nodes = [root] * (len(parents) + 1)  # by the core's node index; 0 is the root
        by_level = sorted(range(len(parents)), key=levels.__getitem__)
        for _, group in groupby(by_level, key=levels.__getitem__):
            for i in sorted(group, key=lambda i: (nodes[parents[i]], tuples[i])):
                nodes[i + 1] = self.node(nodes[parents[i]], tuples[i])
        return np.asarray(nodes, np.int64)

    def add_line(self, base_ns: int, nested: Nested, tuple_ids: np.ndarray, root: int) -> None:
        """Add one line's segments (times in ps after ``base_ns``) below node ``root``."""
        if not len(nested):
            return
        if self.windows_ns is None and self.core is not None:
            tree = self.core.self_tree(
                np.ascontiguousarray(nested.parent, np.int64),
                np.ascontiguousarray(nested.depth, np.int64),
                np.ascontiguousarray(tuple_ids, np.int64),
                nested.end - nested.start,
                MAX_EVENT_DEPTH,
                self.cut,
            )
            if tree is not None:
                self._add_tree(tree, root)
                return
        if self.windows_ns is None and not nested.depth.any() and (tuple_ids != FOLD).all():
            # A flat line, whole capture: self time is duration, summed per frame tuple.
            tuples, sums = aggregate(tuple_ids, nested.end - nested.start)
            nodes = np.array([self.node(root, t) for t in tuples.tolist()], np.int64)
            self._parts.append((nodes, np.zeros(len(nodes), np.int64), sums))
            return
        found = None
        if self.core is not None:  # assign's nodes, compiled (tree_graphs.segment_nodes)
            found = segment_nodes(nested.parent, nested.depth, tuple_ids, MAX_EVENT_DEPTH, self.cut)
        if found is not None:
            node = self._intern(*found[:3], root)[np.frombuffer(found[3], np.int64)]
        else:
            node = self.assign(nested, tuple_ids, root)
        if self.windows_ns is None:
            windows = np.array([[-FAR, FAR]], np.int64)
        else:
            rel = np.clip(self.windows_ns - base_ns, -FAR // PS_PER_NS, FAR // PS_PER_NS)
            windows = rel * PS_PER_NS
        self._parts.append(window_self(nested, node, windows, self.core))

    def self_ns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(node, window, ns) over all lines; ns per node sums exactly across windows.

        Each node's picoseconds are accumulated over the windows and rounded as running
        sums, so the windows of one node add up to its rounded total.
        """
        count = 1 if self.windows_ns is None else len(self.windows_ns)
        if not self._parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        nodes = np.concatenate([p[0] for p in self._parts])
        wins = np.concatenate([p[1] for p in self._parts])
        ps = np.concatenate([p[2] for p in self._parts])
        keys, sums = aggregate(nodes * count + wins, ps)
        nodes, wins = keys // count, keys % count
        running = np.cumsum(sums)
        first = np.r_[True, nodes[1:] != nodes[:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(nodes)), 0))
        before = running[group_start] - sums[group_start]
        rounded = (running - before + PS_PER_NS // 2) // PS_PER_NS
        previous = np.where(first, 0, np.r_[0, rounded[:-1]])
        ns = np.maximum(rounded - previous, 0)  # < 0 only where XProf's rule double counts
        return nodes, wins, ns

    def graphs(
        self, template: FlameGraph, total: bool = False, keep: np.ndarray | None = None
    ) -> list[FlameGraph]:
        """One graph per window (one in all without windows), shaped like ``template``;
        only the windows ``keep`` marks when given; with ``total``, one more of all the
        windows' time together (their sum, kept or not)."""
        count = 1 if self.windows_ns is None else len(self.windows_ns)
        values, count = kept_windows(self.self_ns(), count, total, keep)
        # Built frame by frame for all windows at once (tree_graphs; its reference,
        # graphs_by_node, walks the nodes of each window and gives the same graphs).
        return graphs_by_frame(self.parent, self.tuple_of, self.tuples, template, values, count)


def graph_template(capture: Capture, kind: str) -> FlameGraph:
    """An empty device-time or host-time graph stamped with the capture's time range."""
    start, duration = capture.time_range()
    if kind == "device":
        return FlameGraph(
            sample_type="device_time",
            unit="nanoseconds",
            profile_name="device",
            time_nanos=start,
            duration_nanos=duration,
        )
    return FlameGraph(
        sample_type="wall",
        unit="nanoseconds",
        profile_name="wall",
        time_nanos=start,
        duration_nanos=duration,
    )


# -- device time ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _OpInfo:
    program_id: int | None
    scope: tuple[str, ...]  # framework name scope, outermost first
    category: str
    name: str


_OP_STATS = frozenset({"hlo_category", "tf_op", "name_scope", "program_id"})
_PROGRAM_STAT = frozenset({"program_id"})


def _op_info(plane: Plane, meta_id: int, names: dict[int, str]) -> _OpInfo:
    meta = plane.event_metadata.get(meta_id)
    if meta is None:
        return _OpInfo(None, (), "uncategorized", f"<op {meta_id}>")
    stats = stat_values(plane, meta.stats, names, _OP_STATS)
    op = meta.name or meta.display_name or f"<op {meta_id}>"
    category = str(stats.get("hlo_category") or "uncategorized")
    scope = str(stats.get("tf_op") or stats.get("name_scope") or "")
    program = stats.get("program_id")
    program_id = int(program) if isinstance(program, int | float) else None
    return _OpInfo(program_id, tuple(p for p in scope.split("/") if p), category, op)


def _op_labels(info: _OpInfo, program: str | None, outer: _OpInfo | None) -> tuple[str, ...]:
    """The names of the frames an op adds: program (at the top), name scope, category, op.

    A nested op (a ``while`` body's fusion) sits below its enclosing op with only the
    part of its name scope that extends the enclosing op's.
    """
    scope = info.scope
    if outer is not None:
        shared = 0
        for mine, theirs in zip(scope, outer.scope, strict=False):
            if mine != theirs:
                break
            shared += 1
        scope = scope[shared:]
    head = (program,) if program is not None else ()
    return (*head, *scope, info.category, info.name)


def _program_name(name: str) -> str:
    # "jit_train_step(5371820118934960219)": the id changes per compile; the name does not.
    return _PROGRAM_ID_SUFFIX.sub("", name) or name


@dataclass
class _Programs:
    """Program names of a device plane, from its ``XLA Modules`` line."""

    by_id: dict[int, str] = field(default_factory=dict)  # program_id -> name
    by_meta: dict[int, str] = field(default_factory=dict)  # module metadata id -> name
    spans: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # starts, ends, meta ids
    base_ns: int = 0  # the modules line's start: spans are ps after it

    def module_of(self, starts: np.ndarray, base_ns: int) -> np.ndarray:
        """Per start (ps after ``base_ns``), the module metadata id around it, else -1."""
        shift = (base_ns - self.base_ns) * PS_PER_NS
        # No modules, or lines 2**62 ps (53 days) apart: only a corrupt capture has those,
        # and no module is placed around its ops.
        if self.spans is None or not len(self.spans[0]) or abs(shift) >= FAR:
            return np.full(len(starts), -1, np.int64)
        m_starts, m_ends, m_ids = self.spans
        starts = starts + shift
        slot = np.searchsorted(m_starts, starts, side="right") - 1
        inside = (slot >= 0) & (starts < m_ends[np.maximum(slot, 0)])
        return np.where(inside, m_ids[np.maximum(slot, 0)], -1)

    def names_of(self, modules: np.ndarray, name_index: dict[str, int]) -> np.ndarray:
        """Per module metadata id, the index of its program name (0, unknown, if none)."""
        if not self.by_meta:
            return np.zeros(len(modules), np.int64)
        keys = np.array(sorted(self.by_meta), np.int64)
        values = np.array([name_index[self.by_meta[k]] for k in keys.tolist()], np.int64)
        pos = np.minimum(np.searchsorted(keys, modules), len(keys) - 1)
        return np.where(keys[pos] == modules, values[pos], 0)


def _programs(capture: Capture, plane: Plane, modules_index: int | None) -> _Programs:
    out = _Programs()
    if modules_index is None:
        return out
    modules = read_line(capture, plane, modules_index)
    out.base_ns = capture.line_start_ns(modules.timestamp_ns)
    m_ids, m_starts, m_ends = event_columns(modules.events, capture.source)
    names = {m.id: m.name for m in plane.stat_metadata.values()}
    for meta_id in set(m_ids.tolist()):
        meta = plane.event_metadata.get(meta_id)
        if meta is None:
            continue
        name = _program_name(meta.name or meta.display_name)
        out.by_meta[meta_id] = name
        pid = stat_values(plane, meta.stats, names, _PROGRAM_STAT).get("program_id")
        if pid is None:
            match = re.search(r"\((-?\d+)\)$", meta.name)
            pid = int(match.group(1)) if match else None
        if isinstance(pid, int | float):
            out.by_id[int(pid)] = name
    order = np.argsort(m_starts, kind="stable")
    out.spans = (m_starts[order], m_ends[order], m_ids[order])
    return out


def _gpu_stat_ids(plane: Plane) -> dict[str, int]:
    wanted = {"hlo_op", "hlo_module", "tf_op", "name_scope"}
    return {m.name: m.id for m in plane.stat_metadata.values() if m.name in wanted}


_GPU_MODULE, _GPU_OP, _GPU_SCOPE = range(3)  # a stream line's stat columns (event_stats)


def _gpu_line(
    capture: Capture,
    ref: PlaneRef,
    plane: Plane,
    header: LineHeader,
    stat_ids: dict[str, int],
    texts: StatTexts,
    frames: FrameTree,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A GPU stream line's lasting events: metadata ids, starts, ends (ps) and frame
    tuples, program > name scope > op > kernel.

    On GPU the HLO module, op and framework op (``tf_op``, else ``name_scope``: the
    last of either) are stats of each kernel event, read with the events
    (:mod:`exporter.profiles.event_stats`); labels are made once per distinct
    (kernel, module, op, scope), in the order they first occur.

    The capture's :class:`~exporter.profiles.event_stats.LineTap` (``stream_tap``: the
    kernel facts), if any, gets the stats it wants from the same read.
    """
    columns = {stat_ids[name]: c for name, c in (("hlo_module", _GPU_MODULE),
               ("hlo_op", _GPU_OP), ("tf_op", _GPU_SCOPE), ("name_scope", _GPU_SCOPE))
               if name in stat_ids}  # fmt: skip
    width, tap = 3, capture.stream_tap
    tap_columns: list[int] = []
    if tap is not None and (wanted := tap.wanted(ref, plane)):
        merged = merge_columns(columns, width, wanted, max(wanted.values()) + 1)
        if merged is None:  # the tap reads the line itself
            tap = None
        else:
            columns, width, tap_columns = merged

    def lasting(pieces: Iterable[StatEvents]) -> tuple[list[np.ndarray], TapLine | None]:
        parts = [[np.zeros(0, np.int64)] * 6]
        tapped = tap.reading(ref, plane, header) if tap is not None else None
        for piece in pieces:
            if tapped is not None:
                tapped.add(piece, tap_columns)
            keep = np.flatnonzero(piece.durations > 0)  # instants carry no time
            codes = [np.maximum(texts.column(piece, c)[keep], 0) for c in range(3)]
            parts.append([piece.ids[keep], piece.offsets[keep], piece.durations[keep], *codes])
        return [np.concatenate(c) for c in zip(*parts, strict=True)], tapped

    read, tapped = read_stat_events(capture, plane, header.index, columns, width, lasting)
    if tapped is not None:
        tapped.done()
    ids, offs, durs, *codes = read
    ids, starts, ends = lasting_columns(ids, offs, durs, capture.source)
    key, first = first_seen([ids, *codes])
    made = []
    for at in first.tolist():
        meta_id = int(ids[at])
        module, op, scope = (texts.texts[c[at]] for c in codes)
        meta = plane.event_metadata.get(meta_id)
        kernel = (meta.name or meta.display_name) if meta else f"<kernel {meta_id}>"
        parts = (
            _program_name(module) or UNKNOWN_PROGRAM,
            *(p for p in scope.split("/") if p),
            *((op,) if op and op != kernel else ()),
            kernel,
        )
        made.append(frames.tuple_id(tuple(FrameLabel(p) for p in parts)))
    return ids, starts, ends, np.asarray(made, np.int64)[key]


def _op_piece(
    plane: Plane,
    programs: _Programs,
    base_ns: int,
    piece: tuple[np.ndarray, np.ndarray, np.ndarray],
    frames: FrameTree,
    infos: dict[int, _OpInfo],
) -> None:
    """Add one piece of an op line (events no other piece's cross) to ``frames``."""
    ids, starts, ends = piece
    metas, meta_index = dense_index(ids)
    stat_names: dict[int, str] | None = None
    for meta_id in metas.tolist():
        if meta_id not in infos:
            if stat_names is None:
                stat_names = {m.id: m.name for m in plane.stat_metadata.values()}
            infos[meta_id] = _op_info(plane, meta_id, stat_names)
    line_infos = [infos[m] for m in metas.tolist()]
    # Each event's program: its metadata's program_id, else the module run around it.
    names = [
        UNKNOWN_PROGRAM,
        *sorted(set(programs.by_id.values()) | set(programs.by_meta.values())),
    ]
    name_index = {n: i for i, n in enumerate(names)}
    by_meta_program = np.array(
        [
            name_index[programs.by_id[x.program_id]] if x.program_id in programs.by_id else -1
            for x in line_infos
        ],
        np.int64,
    )
    if (by_meta_program >= 0).all() and (by_meta_program == by_meta_program[0]).all():
        # Every op names the same program (the common case): classes are the ops.
        classes = by_meta_program[0] * len(metas) + np.arange(len(metas), dtype=np.int64)
        label = meta_index
    else:
        program = by_meta_program[meta_index]
        unnamed = program < 0
        if unnamed.any():
            module = programs.module_of(starts[unnamed], base_ns)
            program[unnamed] = programs.names_of(module, name_index)
        classes, label = dense_index(program * len(metas) + meta_index)
        del program
    del ids, meta_index
    nested = nest(starts, ends, label, "contain", frames.core)
    del starts, ends, label
    class_program = (classes // len(metas)).tolist()
    class_info = [line_infos[int(c)] for c in (classes % len(metas)).tolist()]
    top = nested.parent < 0
    root_ids = np.array(
        [
            frames.op_tuple(info, names[p], None)
            for p, info in zip(class_program, class_info, strict=True)
        ],
        np.int64,
    )
    tuple_ids = root_ids[nested.label]  # top-level ops; nested ones are set below
    if not top.all():
        nested_in = ~top
        width = len(classes)
        pairs, pair_index = dense_index(
            nested.label[nested.parent[nested_in]] * width + nested.label[nested_in]
        )
        pair_ids = np.array(
            [
                frames.op_tuple(class_info[k % width], None, class_info[k // width])
                for k in pairs.tolist()
            ],
            np.int64,
        )
        tuple_ids[nested_in] = pair_ids[pair_index]
    frames.add_line(base_ns, nested, tuple_ids, 0)


def _device_plane(capture: Capture, ref: PlaneRef, frames: FrameTree) -> None:
    """Add one device plane's op time to ``frames``."""
    plane = capture.plane(ref)
    headers = line_headers(capture, plane)
    by_name = {h.name: h.index for h in headers}
    gpu_stats: dict[str, int] = {}
    if XLA_OPS in by_name:
        op_lines = [by_name[XLA_OPS]]
    else:  # e.g. GPU captures without derived lines: every stream line holds kernels
        op_lines = [h.index for h in headers if h.name not in _NON_OP_LINES]
        gpu_stats = _gpu_stat_ids(plane)
    if STEPS in by_name:
        steps = read_line(capture, plane, by_name[STEPS])
        capture.steps = max(capture.steps, sum(1 for e in steps.events if e.duration_ps > 0))
        del steps
    programs = _programs(capture, plane, by_name.get(XLA_MODULES))
    infos: dict[int, _OpInfo] = {}
    texts = StatTexts({m.id: m.name for m in plane.stat_metadata.values()}) if gpu_stats else None
    for line_index in op_lines:
        base_ns = capture.line_start_ns(headers[line_index].timestamp_ns)
        if texts is not None and gpu_stats.keys() & {"hlo_op", "hlo_module"}:
            metas_of, starts, ends, kernel_ids = _gpu_line(
                capture, ref, plane, headers[line_index], gpu_stats, texts, frames
            )
            if capture.on_op_line is not None:
                sole = len(op_lines) == 1
                capture.on_op_line(OpLine(ref, plane, base_ns, metas_of, starts, ends, sole))
            del metas_of
            nested = nest(starts, ends, kernel_ids, "contain", frames.core)
            tuple_ids = nested.label.copy()
            inner = np.flatnonzero(nested.parent >= 0)  # a kernel inside a kernel: itself
            for i in inner.tolist():
                tuple_ids[i] = frames.tuple_id(frames.tuples[int(nested.label[i])][-1:])
            frames.add_line(base_ns, nested, tuple_ids, 0)
            continue
        for piece in line_pieces(capture, plane, line_index):  # a long line, bounded
            if capture.on_op_line is not None:
                capture.on_op_line(OpLine(ref, plane, base_ns, *piece, sole=len(op_lines) == 1))
            if len(piece[0]):
                _op_piece(plane, programs, base_ns, piece, frames, infos)


def device_flamegraph(capture: Capture) -> FlameGraph | None:
    """Device time (ns) over all device planes; None when the capture has none.

    An op's self time is its duration minus the ops nested in it on its line (a
    ``while`` and its body), as XProf's ``op_profile`` computes it.
    """
    graphs = device_graphs(capture, None)
    return graphs[0] if graphs is not None else None


def device_graphs(
    capture: Capture,
    windows_ns: np.ndarray | None,
    total: bool = False,
    keep: np.ndarray | None = None,
) -> list[FlameGraph] | None:
    """Device-time graphs, one per window (``None``: one graph of all the time), or per
    window ``keep`` marks, and with ``total`` their sum last (see ``FrameTree.graphs``)."""
    planes = capture.device_planes
    if not planes:
        return None
    frames = FrameTree(windows_ns)
    for ref in planes:
        _device_plane(capture, ref, frames)
    return frames.graphs(graph_template(capture, "device"), total, keep)


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


def _thread_names(
    headers: Sequence[LineHeader], activity: dict[int, tuple[int, int]]
) -> tuple[dict[int, str], list[str]]:
    """The frame of each line with events (by line index), and a comment per ordinal.

    ``activity`` maps a line's index to (events, event time) for the lines that have
    events. Threads sharing a name are numbered busiest first (``python #1``); XProf's
    line ids are hashes of the thread (``5701004968990778314``), unreadable and different
    in every process, so they appear only in the comments. Thread-pool lines
    (``tf_XLAEigen/-2284334949033183961``) fold into one frame per pool on purpose: the
    pool's work matters, not which of its threads did it.
    """
    names: dict[int, str] = {}
    pools: set[int] = set()
    for header in headers:
        if header.index not in activity:
            continue
        name = header.display_name or header.name or "thread"
        pooled = _THREAD_ID_SUFFIX.sub("", name)
        if pooled and pooled != name:
            pools.add(header.index)
        names[header.index] = pooled or name
    same: dict[str, list[LineHeader]] = {}
    for header in headers:
        if header.index in names and header.index not in pools:
            same.setdefault(names[header.index], []).append(header)
    comments = []
    for name, group in same.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda h: (-activity[h.index][0], -activity[h.index][1], h.index))
        for ordinal, header in enumerate(group, 1):
            names[header.index] = f"{name} #{ordinal}"
            comments.append(f"thread {name} #{ordinal}: XLine id {header.id}")
    return names, comments


def _host_tuple_ids(
    plane: Plane, nested: Nested, frames: FrameTree, labels: dict[int, FrameLabel]
) -> np.ndarray:
    """Each host segment's frame tuple (``labels``: the plane's labels made so far)."""
    metas, index = dense_index(nested.label)
    line_labels = []
    for meta_id in metas.tolist():
        label = labels.get(meta_id)
        if label is None:
            label = labels[meta_id] = _host_label(plane, meta_id)
        line_labels.append(label)
    own = np.array([frames.tuple_id((x,)) for x in line_labels], np.int64)
    tuple_ids: np.ndarray = own[index]
    # Adjacent identical frames fold into one (a TraceMe inside a TraceMe of the same
    # name, e.g. PjitFunction(update) twice); Python frames keep their recursion.
    inner = np.flatnonzero(nested.parent >= 0)
    same = tuple_ids[inner] == tuple_ids[nested.parent[inner]]
    if same.any():
        fold = np.array([not x.file for x in line_labels], bool)[index[inner]]
        tuple_ids[inner[same & fold]] = FOLD
    return tuple_ids


def _host_plane(capture: Capture, ref: PlaneRef, frames: FrameTree) -> list[str]:
    """Add a host plane's lines to ``frames``; returns the thread comments."""
    plane = capture.plane(ref)
    headers = line_headers(capture, plane)
    labels: dict[int, FrameLabel] = {}
    # Each line first goes below a placeholder root; the thread labels, which rank lines
    # by activity, replace the placeholders once every line is read.
    roots: dict[int, int] = {}
    activity: dict[int, tuple[int, int]] = {}
    for header in headers:
        base_ns = capture.line_start_ns(header.timestamp_ns)
        for ids, starts, ends in line_pieces(capture, plane, header.index):
            if not len(ids):
                continue
            count, busy = activity.get(header.index, (0, 0))
            activity[header.index] = (count + len(ids), busy + int((ends - starts).sum()))
            nested = nest(starts, ends, ids, "split", frames.core)
            del ids, starts, ends
            if header.index not in roots:
                placeholder = FrameLabel(f"\0line {ref!r} {header.index}")
                roots[header.index] = frames.tuple_id((placeholder,))
            root = frames.node(0, roots[header.index])
            frames.add_line(base_ns, nested, _host_tuple_ids(plane, nested, frames, labels), root)
    names, comments = _thread_names(headers, activity)
    for line_index, tuple_id in roots.items():
        frames.tuples[tuple_id] = (FrameLabel(names[line_index]),)  # same name: one frame
    return comments


def host_flamegraph(capture: Capture) -> FlameGraph | None:
    """Host wall time (ns) stacked per thread; None when there are no host events.

    Events nest by time on each thread; overlapping events follow the ``split`` rule of
    :mod:`exporter.profiles.nesting` (every event's time stays under its own name).
    """
    graphs = host_graphs(capture, None)
    if graphs is None or graphs[0].root.total <= 0:
        return None
    return graphs[0]


def host_graphs(
    capture: Capture,
    windows_ns: np.ndarray | None,
    total: bool = False,
    keep: np.ndarray | None = None,
) -> list[FlameGraph] | None:
    """Host-time graphs, one per window (``None``: one graph of all the time), or per
    window ``keep`` marks, and with ``total`` their sum last (see ``FrameTree.graphs``)."""
    planes = capture.host_planes
    if not planes:
        return None
    frames = FrameTree(windows_ns)
    template = graph_template(capture, "host")
    for ref in planes:
        template.comments.extend(_host_plane(capture, ref, frames))
    return frames.graphs(template, total, keep)


def xplane_flamegraphs(path: Path) -> dict[str, FlameGraph]:
    """Device-time and host-time flame graphs of one ``.xplane.pb`` (those it has)."""
    graphs: dict[str, FlameGraph] = {}
    with load_capture(path) as capture:
        for source, build in (("xprof_device", device_flamegraph), ("xprof_host", host_flamegraph)):
            graph = build(capture)
            if graph is not None:
                graphs[source] = graph
    return graphs
