"""Events on one timeline line -> properly nested segments -> self time per frame.

A line (a host thread, a device's ``XLA Ops`` line) holds events as (start, end, label)
in picoseconds. Flame graphs need them as a tree: :func:`nest` turns them into
*segments* that nest properly, each with its parent segment, under one of two rules:

``contain`` (XProf's rule for device ops, ``xplane_to_op_metrics_db.cc``)
    An event is a child of the innermost open event that contains it. An event that
    overlaps an open event without being contained in it closes that event and becomes
    its sibling; both keep their full duration (XProf counts both).

``split`` (the host rule; what a sampling profiler would record)
    At every instant the stack is the events open at that instant, in start order.
    When an event ends while events that started inside it are still open, those
    continue one level up, as new segments under the ended event's parent. So an event
    that begins inside another and outlives it is split: its head nests in the other,
    its tail is the other's sibling. Every event's time stays under its own name, and
    the thread's total is its busy time.

    Refinement, for cost: taken literally, the rule rebuilds the whole stack above an
    event at its end, so a "staircase" (each event starting inside the previous one
    and outliving it) of N events makes O(N^2) segments: 4,000 events, 8M segments and
    gigabytes. When more than ``REORDER_ABOVE`` open events are above the one that
    ends, those (new segments anyway) and up to as many just below that end earlier
    are reopened in end order, the latest-ending lowest: the next ends are then at the
    top and cost nothing. Time per name and busy time are unchanged; only the order of
    those overlapping events in the stack differs. Every shape tried stays within a few
    segments per event (O(N log N) at worst); ``MAX_SEGMENTS_PER_EVENT`` turns any
    other into a one-line ValueError.

Both rules agree when events nest properly, the common case, which is done in numpy
without a Python loop; a line with overlaps falls back to a sweep over its events
(``_split_loop``; compiled in ``_treegraphs.split``, held equal to it by
``tests/unit/test_split_compiled.py``).

Self time of a segment is its duration minus its children's. :func:`window_self` splits
it across time windows by overlap, so summing the windows gives the time inside them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

try:  # the split rule compiled (exporter/profiles/_treegraphs.c), where it was built
    from exporter.profiles import _treegraphs  # type: ignore[attr-defined]

    _compiled_split: Any = _treegraphs.split
    _compiled_window_self: Any = _treegraphs.window_self
except ImportError:  # pragma: no cover - an install without a compiler
    _compiled_split = _compiled_window_self = None

__all__ = ["FAR", "Nested", "aggregate", "dense_index", "nest", "window_self"]

Rule = Literal["contain", "split"]
FAR = 1 << 62  # beyond any timestamp in picoseconds: an unbounded window edge
# An end that leaves more open events than this above the ended one reorders them by end
# (see the module notes): below it, the rule is exact; above it, a staircase costs
# O(events), not O(events^2). Real host threads rarely have more than 2 or 3 above.
REORDER_ABOVE = 8
# What the split may make of a line at most: segments per event, and at least this many
# in all. The reordering keeps every input tried far below it (2-4 per event); the
# bound makes any other shape a one-line error rather than gigabytes.
MAX_SEGMENTS_PER_EVENT = 64
MIN_SEGMENT_BUDGET = 1 << 20


@dataclass(frozen=True, slots=True)
class Nested:
    """Segments of one line in start order; ``parent`` is -1 at the top, else < index."""

    start: np.ndarray  # int64 ps
    end: np.ndarray  # int64 ps
    label: np.ndarray  # int64 label id of the event each segment belongs to
    parent: np.ndarray  # int64 index of the enclosing segment, or -1
    depth: np.ndarray  # int64 nesting depth, 0 at the top

    def __len__(self) -> int:
        return len(self.start)


def _by_start(start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """The order by start, longer first on ties; None when already in that order."""
    if len(start) < 2:
        return None
    ds = np.diff(start)
    if (ds > 0).all() or ((ds >= 0).all() and not (np.diff(end)[ds == 0] > 0).any()):
        return None
    return np.lexsort((-end, start))


def _proper(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(parent, depth) of events sorted by start when they nest properly, else None."""
    n = len(start)
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    if n < 2:
        return parent, depth
    running_end = np.maximum.accumulate(end)
    overlaps = start[1:] < running_end[:-1]
    if not overlaps.any():
        return parent, depth  # flat: nothing overlaps
    # Only events in a run of overlapping ones (a while and its body) need the work.
    grouped = np.zeros(n, bool)
    grouped[1:] |= overlaps
    grouped[:-1] |= overlaps
    index = np.flatnonzero(grouped)
    s, e = start[index], end[index]
    m = len(index)
    # Open events at each start: those begun before it minus those ended by then (runs
    # do not overlap each other, so counting within the selection is exact).
    sub_depth = np.arange(m, dtype=np.int64) - np.searchsorted(np.sort(e), s, side="right")
    if (sub_depth < 0).any():
        return None
    # The parent is the latest earlier event one level up: search (depth, index) keys.
    key = np.sort(sub_depth * m + np.arange(m, dtype=np.int64))
    inner = np.flatnonzero(sub_depth > 0)
    pos = np.searchsorted(key, (sub_depth[inner] - 1) * m + inner) - 1
    found = key[np.maximum(pos, 0)]
    if ((pos < 0) | (found // m != sub_depth[inner] - 1)).any():
        return None
    sub_parent = found % m
    # Laminar iff every event ends within its parent (see the module tests for why).
    if (e[inner] > e[sub_parent]).any():
        return None
    parent[index[inner]] = index[sub_parent]
    depth[index] = sub_depth
    return parent, depth


def _contain_loop(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    parent = np.full(len(start), -1, np.int64)
    depth = np.zeros(len(start), np.int64)
    stack: list[int] = []
    ends = end.tolist()
    for i, e in enumerate(ends):
        while stack and ends[stack[-1]] < e:  # the open event does not contain this one
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = len(stack)
        stack.append(i)
    return parent, depth


def _split_loop(start: np.ndarray, end: np.ndarray, label: np.ndarray) -> Nested:
    """The ``split`` rule by a sweep over starts and ends (events sorted by start).

    An end reopens the events above the ended one: exactly the rule while they are few
    (``REORDER_ABOVE``); beyond that, they and up to as many events just below that end
    earlier are reopened in end order (latest-ending lowest), so the next ends are at
    the top and the stack is not rebuilt again at each of them (see the module notes).
    """
    seg_start: list[int] = []
    seg_end: list[int] = []
    seg_label: list[int] = []
    seg_parent: list[int] = []
    # Open events, bottom first: [end, label, current segment, seq]; a heap finds the
    # next end, and ``at`` (identity -> stack index) finds the ended one in O(1).
    stack: list[list[int]] = []
    ending: list[tuple[int, int, list[int]]] = []
    budget = MAX_SEGMENTS_PER_EVENT * len(start) + MIN_SEGMENT_BUDGET

    def open_segment(at: int, item: list[int], below: int) -> None:
        item[2] = len(seg_start)
        seg_start.append(at)
        seg_end.append(at)
        seg_label.append(item[1])
        seg_parent.append(stack[below][2] if below >= 0 else -1)

    def reopen(te: int, low: int) -> None:
        for p in range(low, len(stack)):
            open_segment(te, stack[p], p - 1)
        if len(seg_start) > budget:
            raise ValueError(
                f"{len(start)} overlapping events split into more than {budget} segments "
                "(more than the split rule's bound): refused"
            )

    def close_until(t: int) -> None:
        while ending and ending[0][0] <= t:
            te, _, item = heapq.heappop(ending)
            pos = len(stack) - 1
            while stack[pos] is not item:
                pos -= 1
            for above in stack[pos:]:
                seg_end[above[2]] = te
            del stack[pos]
            moved = len(stack) - pos
            if moved <= REORDER_ABOVE:  # the rule itself: those above continue one level up
                reopen(te, pos)
                continue
            # Many open events above the ended one: reopened anyway, so reorder them by
            # end, with those just below that end before the latest of them.
            latest = max(x[0] for x in stack[pos:])
            low = pos
            while low > 0 and pos - low < moved and stack[low - 1][0] < latest:
                low -= 1
                seg_end[stack[low][2]] = te
            stack[low:] = sorted(stack[low:], key=lambda x: (-x[0], x[3]))
            reopen(te, low)

    rows = zip(start.tolist(), end.tolist(), label.tolist(), strict=True)
    for seq, (s, e, lab) in enumerate(rows):
        close_until(s)
        item = [e, lab, -1, seq]
        open_segment(s, item, len(stack) - 1)
        stack.append(item)
        heapq.heappush(ending, (e, seq, item))  # seq: earlier-opened first on equal ends
    close_until(FAR)
    s_arr = np.asarray(seg_start, np.int64)
    e_arr = np.asarray(seg_end, np.int64)
    p_arr = np.asarray(seg_parent, np.int64)
    # Segments reopened and closed at the same instant carry no time (nor do their
    # children, which lie inside them): drop them and renumber the parents.
    keep = e_arr > s_arr
    new_index = np.cumsum(keep) - 1
    p_arr = np.where(p_arr >= 0, new_index[np.maximum(p_arr, 0)], -1)[keep]
    depth = np.zeros(int(keep.sum()), np.int64)
    for i, p in enumerate(p_arr.tolist()):  # parents come first
        if p >= 0:
            depth[i] = depth[p] + 1
    return Nested(s_arr[keep], e_arr[keep], np.asarray(seg_label, np.int64)[keep], p_arr, depth)


def nest(
    start: np.ndarray, end: np.ndarray, label: np.ndarray, rule: Rule, core: Any = None
) -> Nested:
    """Nest one line's events (int64 arrays, any order, positive durations) by ``rule``.

    ``core``: the compiled core (``exporter.profiles.xspace.compiled_core()``), whose
    ``contain`` nests in one pass what :func:`_proper` and :func:`_contain_loop` do in
    numpy and Python; both give the same segments (tests/unit/test_decoder.py).
    """
    order = _by_start(start, end)
    if order is not None:
        start, end, label = start[order], end[order], label[order]
    if core is not None and len(start):
        start = np.ascontiguousarray(start, np.int64)
        end = np.ascontiguousarray(end, np.int64)
        parent, depth, laminar = core.contain(start, end)
        if laminar or rule == "contain":
            return Nested(
                start, end, label, np.frombuffer(parent, np.int64), np.frombuffer(depth, np.int64)
            )
        if _compiled_split is not None:  # _split_loop's compiled twin (_treegraphs.c)
            budget = MAX_SEGMENTS_PER_EVENT * len(start) + MIN_SEGMENT_BUDGET
            *made, item, parent, depth = _compiled_split(start, end, REORDER_ABOVE, budget)
            s, e, p, d = (np.frombuffer(x, np.int64) for x in (*made, parent, depth))
            return Nested(s, e, label[np.frombuffer(item, np.int64)], p, d)
        return _split_loop(start, end, label)
    found = _proper(start, end)
    if found is not None:
        return Nested(start, end, label, *found)
    if rule == "contain":
        return Nested(start, end, label, *_contain_loop(start, end))
    return _split_loop(start, end, label)


def dense_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, index of each value among them), like ``np.unique``.

    Small non-negative values (metadata ids, node ids) use a lookup table, O(n) instead
    of a sort; others fall back to ``np.unique``.
    """
    if not len(values):
        return values[:0], np.zeros(0, np.int64)
    low, high = int(values.min()), int(values.max())
    if low >= 0 and high <= 4 * len(values) + 1024:
        present = np.zeros(high + 1, bool)
        present[values] = True
        uniq = np.flatnonzero(present)
        rank = np.cumsum(present) - 1
        return uniq.astype(values.dtype, copy=False), rank[values]
    uniq, inverse = np.unique(values, return_inverse=True)
    return uniq, inverse.astype(np.int64, copy=False)


def aggregate(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, exact int64 sum of ``values`` per key), keys sorted.

    ``np.bincount`` sums in float64: the values are split into high and low 24-bit
    halves so each partial sum stays exact (below 2**53) for any realistic input.
    """
    uniq, inverse = dense_index(keys)
    hi, lo = np.divmod(values, 1 << 24)
    size = len(uniq)
    hi_sum = np.bincount(inverse, weights=hi, minlength=size)
    lo_sum = np.bincount(inverse, weights=lo, minlength=size)
    return uniq, hi_sum.astype(np.int64) * (1 << 24) + lo_sum.astype(np.int64)


def window_self(
    nested: Nested,
    node: np.ndarray,
    windows: np.ndarray,
    core: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Self time (ps) per (node, window): ``(nodes, window indexes, ps)``, sparse.

    ``node`` maps each segment to its frame-tree node; ``windows`` is an (n, 2) int64
    array of disjoint [start, end) ranges in the line's picoseconds, sorted. Each
    segment adds its overlap with a window to its node and takes it from its parent's.
    ``core`` (the compiled core in use, as :func:`nest` takes it): the same sums from
    ``_treegraphs.window_self`` in one pass, this numpy being its twin.
    """
    if not len(nested) or not len(windows):
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    if core is not None and _compiled_window_self is not None:
        columns = (nested.start, nested.end, nested.parent, node, windows[:, 0], windows[:, 1])
        found = _compiled_window_self(*(np.ascontiguousarray(c, np.int64) for c in columns))
        nodes, wins, sums = (np.frombuffer(x, np.int64) for x in found)
        return nodes, wins, sums
    w_start, w_end = windows[:, 0], windows[:, 1]
    has_parent = nested.parent >= 0
    if len(windows) == 1 and w_start[0] <= nested.start[0] and nested.end.max() <= w_end[0]:
        # One window holding every segment (a whole-capture graph): no splitting.
        duration = nested.end - nested.start
        nodes = np.concatenate([node, node[nested.parent[has_parent]]])
        values = np.concatenate([duration, -duration[has_parent]])
        keys, sums = aggregate(nodes, values)
        return keys, np.zeros(len(keys), np.int64), sums
    first = np.searchsorted(w_end, nested.start, side="right")
    last = np.searchsorted(w_start, nested.end, side="left") - 1
    count = np.maximum(last - first + 1, 0)
    total = int(count.sum())
    seg = np.repeat(np.arange(len(nested), dtype=np.int64), count)
    offsets = np.cumsum(count) - count
    win = np.repeat(first, count) + (np.arange(total, dtype=np.int64) - np.repeat(offsets, count))
    overlap = np.minimum(nested.end[seg], w_end[win]) - np.maximum(nested.start[seg], w_start[win])
    has_parent = nested.parent[seg] >= 0
    nodes = np.concatenate([node[seg], node[nested.parent[seg[has_parent]]]])
    wins = np.concatenate([win, win[has_parent]])
    values = np.concatenate([overlap, -overlap[has_parent]])
    n_windows = len(windows)
    keys, sums = aggregate(nodes * n_windows + wins, values)
    return keys // n_windows, keys % n_windows, sums
