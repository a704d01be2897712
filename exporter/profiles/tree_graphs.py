"""Flame graphs from a frame tree's self time, one graph per time window.

:class:`exporter.profiles.xplane.FrameTree` interns its nodes as (parent node, frame
tuple), a frame tuple being the labels one event adds below its parent, and sums self
time per (node, window). Two builders turn that into :class:`FlameGraph` objects:

:func:`graphs_by_node`
    The reference: per window, each node that carries time walks up to the nearest node
    already built and adds its labels below it with :meth:`Frame.child`; totals are
    recomputed by walking each finished graph. Its cost is a few dictionary look-ups per
    label, per node, per window: a compare's per-step graphs (up to 200 windows per
    capture) spent most of their time here.

:func:`graphs_by_frame`
    The same graphs, built once per frame. The node tree is mapped to a frame tree once
    (a frame being a path of labels from the root, as ``Frame.child`` keys them); then,
    for all windows together, each frame that carries time in a window is found with
    its ancestors, its self time and its total: by one compiled walk over the windows'
    nodes (``_treegraphs.rows``), or in numpy, level by level from the deepest frame
    (its twin ``_rows``). Then each frame's object is made once, its values set, by a
    compiled loop (``_treegraphs.make``; its Python twin ``_make`` where it is not built),
    the garbage collector paused meanwhile: the frames hold no cycle, and collections
    started by their allocations, each walking the growing heap, cost most of the time.
    The compiled loop also leaves its frames out of the collector's later walks
    (reference counts free them, as they free every frame).

Both give identical graphs, children in the same order too (a frame is made when the
first node, in node order, that lies below it is reached; then its ancestors first):
``tests/unit/test_tree_graphs.py`` holds them equal on synthetic and real captures.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import numpy as np

from exporter.profiles.flamegraph import FlameGraph, Frame, FrameKey
from exporter.profiles.frames import FrameLabel
from exporter.profiles.xspace import compiled_core

__all__ = [
    "FRAME_SLOTS",
    "frame_maker",
    "graphs_by_frame",
    "graphs_by_node",
    "kept_windows",
    "segment_nodes",
]

try:  # the frame maker compiled (exporter/profiles/_treegraphs.c), where it was built
    from exporter.profiles import _treegraphs  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - an install without a compiler
    _treegraphs = None

Labels = tuple[FrameLabel, ...]
# The compiled maker sets a Frame's slots through these descriptors, in this order.
_SLOT_NAMES = ("name", "file", "line", "self_value", "total", "children")
FRAME_SLOTS = _SLOTS = tuple(getattr(Frame, name) for name in _SLOT_NAMES)  # public: sides/load


def frame_maker() -> Any | None:
    """The compiled frame maker while the compiled core is in use, else None (the twin).

    It follows ``MLPROF_DECODER`` / ``use_decoder`` as the decoding core does
    (:func:`exporter.profiles.xspace.compiled_core`), and stands aside if ``Frame``
    ever has other slots than those it sets.
    """
    if _treegraphs is None or set(Frame.__slots__) != set(_SLOT_NAMES):
        return None
    return _treegraphs if compiled_core() is not None else None


def segment_nodes(
    parent: np.ndarray, depth: np.ndarray, tuple_ids: np.ndarray, max_depth: int, cut: int
) -> tuple[bytes, bytes, bytes, bytes] | None:
    """A line's node table and each segment's node in it (``_treegraphs.segment_nodes``,
    the compiled twin of ``FrameTree.assign``), or None where it is not built or leaves
    the line to numpy."""
    if _treegraphs is None:
        return None
    columns = (np.ascontiguousarray(c, np.int64) for c in (parent, depth, tuple_ids))
    found: tuple[bytes, bytes, bytes, bytes] | None = _treegraphs.segment_nodes(
        *columns, max_depth, cut
    )
    return found


def kept_windows(
    values: tuple[np.ndarray, np.ndarray, np.ndarray],
    count: int,
    total: bool = False,
    keep: np.ndarray | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int]:
    """``values`` = (node, window, ns) of ``count`` windows as the graphs to build: only
    the windows ``keep`` marks (renumbered in order), and with ``total`` one more last,
    every node's sum over all the windows. Returns the values and their window count.

    A node's windows sum to its rounded total (``FrameTree.self_ns``), so when the
    windows cover a capture the total is its whole graph, built in the same pass at the
    cost of its own frames instead of merging every window's graph; windows not kept
    (the gaps between sampled steps) count in it without a graph of their own.
    """
    nodes, wins, ns = values
    parts = []
    out_count = count
    if keep is None:
        parts.append((nodes, wins, ns))
    else:
        kept = np.asarray(keep, bool)
        renumber = np.cumsum(kept) - 1
        mask = kept[wins]
        parts.append((nodes[mask], renumber[wins[mask]], ns[mask]))
        out_count = int(kept.sum())
    if total:
        parts.append((nodes, np.full(len(nodes), out_count, np.int64), ns))
        out_count += 1
    if len(parts) == 1:
        return parts[0], out_count
    return (
        (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        ),
        out_count,
    )


def graphs_by_node(
    parent: Sequence[int],
    tuple_of: Sequence[int],
    tuples: Sequence[Labels],
    template: FlameGraph,
    values: tuple[np.ndarray, np.ndarray, np.ndarray],
    count: int,
) -> list[FlameGraph]:
    """One graph per window from ``values`` = (node, window, ns): the reference builder."""
    nodes, wins, ns = values
    out = [template.copy() for _ in range(count)]
    keep = ns > 0
    order = np.lexsort((nodes[keep], wins[keep]))
    w_sorted, n_sorted, v_sorted = wins[keep][order], nodes[keep][order], ns[keep][order]
    bounds = np.searchsorted(w_sorted, np.arange(count + 1))
    for window, graph in enumerate(out):
        lo, hi = int(bounds[window]), int(bounds[window + 1])
        frames: dict[int, Frame] = {0: graph.root}

        def frame_of(node: int, frames: dict[int, Frame] = frames) -> Frame:
            chain = []
            while node not in frames:  # walk up to a node already built
                chain.append(node)
                node = parent[node]
            frame = frames[node]
            for below in reversed(chain):
                for label in tuples[tuple_of[below]]:
                    frame = frame.child(label.name, label.file, label.line)
                frames[below] = frame
            return frame

        for node, value in zip(n_sorted[lo:hi].tolist(), v_sorted[lo:hi].tolist(), strict=True):
            frame_of(node).self_value += value
        graph.recompute_totals()
    return out


def _frame_tree(
    parent: Sequence[int], tuple_of: Sequence[int], tuples: Sequence[Labels]
) -> tuple[np.ndarray, np.ndarray, list[FrameKey], np.ndarray]:
    """(parent frame, depth, key of each frame; the frame of each node). Frame 0 is the
    root, node 0's; a node with no labels is its parent's frame."""
    f_parent = [-1]
    f_depth = [0]
    keys: list[FrameKey] = [("root", "", 0)]
    index: dict[tuple[int, str, str, int], int] = {}
    frame_of = [0] * len(parent)
    for node in range(1, len(parent)):  # a node's parent is interned before it
        frame = frame_of[parent[node]]
        for label in tuples[tuple_of[node]]:
            key = (frame, label.name, label.file, label.line)
            found = index.get(key)
            if found is None:
                found = index[key] = len(f_parent)
                f_parent.append(frame)
                f_depth.append(f_depth[frame] + 1)
                keys.append((label.name, label.file, label.line))
            frame = found
        frame_of[node] = frame
    return (
        np.asarray(f_parent, np.int64),
        np.asarray(f_depth, np.int64),
        keys,
        np.asarray(frame_of, np.int64),
    )


def _combine(
    keys: np.ndarray, own: np.ndarray, total: np.ndarray, touch: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct key: summed self and total, and the smallest touch."""
    order = np.argsort(keys, kind="stable")
    keys, own, total, touch = keys[order], own[order], total[order], touch[order]
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return (
        keys[first],
        np.add.reduceat(own, first),
        np.add.reduceat(total, first),
        np.minimum.reduceat(touch, first),
    )


def graphs_by_frame(
    parent: Sequence[int],
    tuple_of: Sequence[int],
    tuples: Sequence[Labels],
    template: FlameGraph,
    values: tuple[np.ndarray, np.ndarray, np.ndarray],
    count: int,
) -> list[FlameGraph]:
    """One graph per window from ``values`` = (node, window, ns); see the module doc."""
    out = [template.copy() for _ in range(count)]
    if not (values[2] > 0).any():
        for graph in out:
            graph.recompute_totals()
        return out
    f_parent, f_depth, f_keys, frame_of = _frame_tree(parent, tuple_of, tuples)
    maker = frame_maker()
    if maker is not None:
        found = maker.rows(frame_of, f_parent, *(np.ascontiguousarray(v, np.int64)
                                                 for v in values), count)  # fmt: skip
        rows = tuple(np.frombuffer(column, np.int64) for column in found)
        maker.make(Frame, _SLOTS, [g.root for g in out], f_keys, *rows)
    else:
        rows = _rows(f_parent, f_depth, frame_of, values, count, len(parent))
        _make(out, f_keys, *rows)
    for window_index in np.flatnonzero(np.bincount(rows[0], minlength=count) == 0).tolist():
        out[window_index].recompute_totals()  # no time in it: as the reference leaves it
    return out


def _rows(
    f_parent: np.ndarray,
    f_depth: np.ndarray,
    frame_of: np.ndarray,
    values: tuple[np.ndarray, np.ndarray, np.ndarray],
    count: int,
    span_touch: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(window, frame, own, total, parent row) of each frame to make, in making order:
    the compiled ``rows``' twin, in numpy (``span_touch``: the number of nodes)."""
    nodes, wins, ns = values
    keep = ns > 0
    width = len(f_parent)
    # (window, frame) pairs as one int64 key; "touch" is the first node (in node order)
    # below the frame that carries time in that window: frames are made in that order.
    pair = wins[keep] * width + frame_of[nodes[keep]]
    touch = nodes[keep]
    own = ns[keep]
    depth = f_depth[pair % width]
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    empty = np.zeros(0, np.int64)
    up_keys, up_total, up_touch = empty, empty, empty  # what the level below adds
    levels = []
    for level in range(int(depth.max()), -1, -1):
        here = by_depth[bounds[level] : bounds[level + 1]]
        level_keys, level_own, level_total, level_touch = _combine(
            np.concatenate([pair[here], up_keys]),
            np.concatenate([own[here], np.zeros(len(up_keys), np.int64)]),
            np.concatenate([own[here], up_total]),
            np.concatenate([touch[here], up_touch]),
        )
        levels.append((level_keys, level_own, level_total, level_touch, level))
        level_window, level_frame = np.divmod(level_keys, width)
        up_keys = level_window * width + np.maximum(f_parent[level_frame], 0)
        up_total, up_touch = level_total, level_touch
    keys = np.concatenate([x[0] for x in levels])
    own_all = np.concatenate([x[1] for x in levels])
    total_all = np.concatenate([x[2] for x in levels])
    touch_all = np.concatenate([x[3] for x in levels])
    depth_all = np.concatenate([np.full(len(x[0]), x[4], np.int64) for x in levels])
    window_all, frame_all = np.divmod(keys, width)
    # Made in order: by window, then by first touching node, ancestors first (one sort
    # of a combined key where it fits in int64, else three).
    span_depth = int(depth.max()) + 1
    if count * span_touch * span_depth < 1 << 62:
        made = np.argsort((window_all * span_touch + touch_all) * span_depth + depth_all,
                          kind="stable")  # fmt: skip
    else:
        made = np.lexsort((depth_all, touch_all, window_all))
    # Each pair's parent is in the level above, whose keys are sorted: found there, then
    # placed in the making order.
    starts = np.cumsum([0] + [len(x[0]) for x in levels])
    parent_at = np.zeros(len(keys), np.int64)
    for index in range(len(levels) - 1):  # the last level is the roots'
        above = window_all[starts[index] : starts[index + 1]] * width + np.maximum(
            f_parent[frame_all[starts[index] : starts[index + 1]]], 0
        )
        parent_at[starts[index] : starts[index + 1]] = starts[index + 1] + np.searchsorted(
            levels[index + 1][0], above
        )
    rank = np.empty(len(keys), np.int64)
    rank[made] = np.arange(len(keys), dtype=np.int64)
    return (window_all[made], frame_all[made], own_all[made], total_all[made],
            rank[parent_at[made]])  # fmt: skip


def _make(
    out: list[FlameGraph],
    keys: list[FrameKey],
    windows: np.ndarray,
    frames: np.ndarray,
    own: np.ndarray,
    totals: np.ndarray,
    parents: np.ndarray,
) -> None:
    """Make each row's Frame below its parent's (the compiled ``make``'s twin)."""
    collecting = gc.isenabled()
    gc.disable()  # a tree holds no cycle; see _treegraphs.c
    try:
        _make_rows(out, keys, windows, frames, own, totals, parents)
    finally:
        if collecting:
            gc.enable()


def _make_rows(
    out: list[FlameGraph],
    keys: list[FrameKey],
    windows: np.ndarray,
    frames: np.ndarray,
    own: np.ndarray,
    totals: np.ndarray,
    parents: np.ndarray,
) -> None:
    built: list[Frame] = []
    rows = zip(
        windows.tolist(), frames.tolist(), own.tolist(), totals.tolist(), parents.tolist(),
        strict=True,
    )  # fmt: skip
    for window_index, frame_id, self_value, total, above in rows:
        if frame_id == 0:
            frame = out[window_index].root
        else:
            key = keys[frame_id]
            frame = Frame(*key)
            built[above].children[key] = frame
        frame.self_value = self_value
        frame.total = total
        built.append(frame)
