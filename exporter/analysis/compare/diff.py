"""Two sides' flame graphs aligned to one tree, both sides' values kept side by side.

As Pyroscope's ``pkg/model/flamegraph_diff.go`` does: both trees are brought to one
shape (a frame missing on one side becomes a zero node there), each frame keeps the
base's and the head's self and total next to each other, and truncation folds frames
into ``other`` on *both* sides together, ranking by the larger side, so that a frame
never looks added or removed because one side alone was cut.

A side is a list of graphs: one per step window when the side has steps (the samples
of :mod:`exporter.analysis.compare.noise`), or a single whole graph. Values are kept per graph
in ``(frames x graphs)`` matrices; a frame's identity is (name, file, line), the key
the profiles layer gives frames.

>>> from exporter.profiles.flamegraph import FlameGraph
>>> base, head = FlameGraph("wall", "nanoseconds"), FlameGraph("wall", "nanoseconds")
>>> base.add(["main", "a"], 30); head.add(["main", "a"], 10); head.add(["main", "b"], 20)
>>> tree = align([base], [head])
>>> [(f.name, tree.base_total[f.index, 0], tree.head_total[f.index, 0]) for f in tree.walk()]
[('main', 30.0, 30.0), ('a', 30.0, 10.0), ('b', 0.0, 20.0)]
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from exporter.profiles.flamegraph import OTHER, FlameGraph, Frame

__all__ = ["AlignedTree", "DiffFrame", "FrameKey", "align", "align_reference"]

FrameKey = tuple[str, str, int]  # (name, file, line): a frame's identity among siblings


@dataclass(eq=False, slots=True)
class DiffFrame:
    """A frame of the aligned tree; its values are row ``index`` of the tree's matrices."""

    name: str
    file: str
    line: int
    index: int
    parent: DiffFrame | None
    children: dict[FrameKey, DiffFrame] = field(default_factory=dict)
    source: int = -1  # index in the untruncated tree (-1: an "other" made by truncation)

    @property
    def key(self) -> FrameKey:
        return (self.name, self.file, self.line)

    def stack(self) -> list[DiffFrame]:
        """Frames from the outermost to this one (the root excluded)."""
        out: list[DiffFrame] = []
        node: DiffFrame | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def child(self, name: str, file: str, line: int, index: int) -> tuple[DiffFrame, bool]:
        """The child with this identity; ``(child, created)``."""
        key = (name, file, line)
        found = self.children.get(key)
        if found is not None:
            return found, False
        made = self.children[key] = DiffFrame(name, file, line, index, self)
        return made, True


@dataclass
class AlignedTree:
    """Base and head aligned: ``frames[i]`` has values in row ``i`` of every matrix.

    ``base_self[i, j]`` is frame ``i``'s self value in the base's graph ``j`` (a step, or
    the single whole graph); ``*_total`` likewise. Row 0 is the root.
    """

    sample_type: str
    unit: str
    frames: list[DiffFrame]
    base_self: np.ndarray
    base_total: np.ndarray
    head_self: np.ndarray
    head_total: np.ndarray

    @property
    def root(self) -> DiffFrame:
        return self.frames[0]

    def walk(self) -> Iterator[DiffFrame]:
        """Every frame but the root, parents before children (pre-order)."""
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    def means(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Mean over each side's graphs: base self, base total, head self, head total."""
        return (
            _mean(self.base_self),
            _mean(self.base_total),
            _mean(self.head_self),
            _mean(self.head_total),
        )

    def truncated(self, max_frames: int) -> AlignedTree:
        """At most ``max_frames`` frames; the rest fold into ``other`` on both sides.

        Frames are ranked by the larger of their two sides' shares of total (each side
        relative to its own root), parents always before their children, so the kept set
        is closed under "parent of". Every kept frame's total stays exact: an ``other``
        frame's self is the sum of the totals it replaced, per graph.
        """
        if max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        n = len(self.frames) - 1
        if n <= max_frames:
            return self
        _, base_total, _, head_total = self.means()
        rank = np.maximum(_share(base_total), _share(head_total))
        # A parent's total is at least its child's on each side, so ordering by rank then
        # depth keeps parents first; the stable sort keeps pre-order among equals.
        depth = np.zeros(len(self.frames), np.int64)
        for node in self.walk():
            assert node.parent is not None
            depth[node.index] = depth[node.parent.index] + 1
        order = [
            f.index for f in sorted(self.walk(), key=lambda f: (-rank[f.index], depth[f.index]))
        ]
        budget = max_frames
        while True:
            kept = set(order[:budget])
            # Each parent (kept, or the root) with a folded child gains an "other" child.
            folding = {
                f.parent.index
                for f in self.walk()
                if f.index not in kept
                and f.parent is not None
                and (f.parent.parent is None or f.parent.index in kept)
            }
            excess = budget + len(folding) - max_frames
            if excess <= 0 or budget == 0:
                break
            budget = max(0, budget - excess)
        return self._rebuild(kept)

    def _rebuild(self, kept: set[int]) -> AlignedTree:
        rows: list[int] = [0]  # source rows of each new frame; -1 = an "other" frame
        other_of: dict[int, list[int]] = {}  # new other index -> folded source rows
        root = DiffFrame(self.root.name, "", 0, 0, None, source=0)
        frames = [root]
        pending: list[tuple[DiffFrame, DiffFrame]] = [(self.root, root)]
        while pending:
            src, dst = pending.pop()
            folded: list[int] = []
            for child in src.children.values():
                if child.index in kept:
                    made, _ = dst.child(child.name, child.file, child.line, len(frames))
                    made.source = child.source
                    frames.append(made)
                    rows.append(child.index)
                    pending.append((child, made))
                else:
                    folded.append(child.index)
            if folded:
                other, created = dst.child(OTHER, "", 0, len(frames))
                if created:
                    frames.append(other)
                    rows.append(-1)
                other_of.setdefault(other.index, []).extend(folded)

        def pick(self_m: np.ndarray, total_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            selfs = np.zeros((len(frames), self_m.shape[1]))
            totals = np.zeros((len(frames), total_m.shape[1]))
            src = np.array(rows)
            real = src >= 0
            selfs[real] = self_m[src[real]]
            totals[real] = total_m[src[real]]
            for index, folded in other_of.items():
                gone = total_m[folded].sum(axis=0)
                selfs[index] += gone
                totals[index] += gone
            return selfs, totals

        base_self, base_total = pick(self.base_self, self.base_total)
        head_self, head_total = pick(self.head_self, self.head_total)
        # A kept "other" that existed before may also receive folded siblings: its self
        # grew, so recompute the totals bottom-up from the self values.
        out = AlignedTree(
            self.sample_type, self.unit, frames, base_self, base_total, head_self, head_total
        )
        out._recompute_totals()
        return out

    def _recompute_totals(self) -> None:
        for selfs, totals in ((self.base_self, self.base_total), (self.head_self, self.head_total)):
            totals[:] = selfs
            for node in reversed(list(self.walk())):
                assert node.parent is not None
                totals[node.parent.index] += totals[node.index]


def _mean(matrix: np.ndarray) -> np.ndarray:
    if matrix.shape[1] == 0:
        return np.zeros(matrix.shape[0])
    return matrix.mean(axis=1)  # type: ignore[no-any-return]


def _share(values: np.ndarray) -> np.ndarray:
    """Values as fractions of the root's (row 0); zeros when the root is empty."""
    return values / values[0] if values[0] > 0 else np.zeros_like(values)


def _one_kind(base: Sequence[FlameGraph], head: Sequence[FlameGraph]) -> tuple[str, str]:
    """The sample type and unit both sides share; ValueError when a side is empty or
    they do not share one (pprof's ``compatible()``)."""
    if not base or not head:
        raise ValueError("each side needs at least one flame graph")
    kinds = {(g.sample_type, g.unit) for g in [*base, *head]}
    if len(kinds) > 1:
        shown = ", ".join(sorted(f"{t}/{u}" for t, u in kinds))
        raise ValueError(f"cannot compare flame graphs of different sample types ({shown})")
    return kinds.pop()


def align_reference(base: Sequence[FlameGraph], head: Sequence[FlameGraph]) -> AlignedTree:
    """:func:`align` frame by frame, the way it was first written: kept as the reference
    the faster :func:`align` is held equal to (``tests/unit/test_diff_align.py``)."""
    sample_type, unit = _one_kind(base, head)
    graphs = [*base, *head]
    root = DiffFrame(graphs[0].root.name, "", 0, 0, None, source=0)
    frames = [root]
    cells: list[tuple[list[int], list[float], list[float]]] = []  # rows, selfs, totals
    for graph in graphs:
        rows, cols_self, cols_total = [0], [float(graph.root.self_value)], [float(graph.root.total)]
        stack: list[tuple[Frame, DiffFrame]] = [(graph.root, root)]
        while stack:
            src, dst = stack.pop()
            for child in src.children.values():
                if child.self_value < 0 or child.total < 0:
                    raise ValueError(f"frame {child.name!r} has a negative value: cannot compare")
                made, created = dst.child(child.name, child.file, child.line, len(frames))
                if created:
                    made.source = made.index
                    frames.append(made)
                rows.append(made.index)
                cols_self.append(float(child.self_value))
                cols_total.append(float(child.total))
                stack.append((child, made))
        cells.append((rows, cols_self, cols_total))

    def matrices(
        part: list[tuple[list[int], list[float], list[float]]],
    ) -> tuple[np.ndarray, np.ndarray]:
        selfs = np.zeros((len(frames), len(part)))
        totals = np.zeros((len(frames), len(part)))
        for column, (rows, cols_self, cols_total) in enumerate(part):
            index = np.asarray(rows, np.int64)
            np.add.at(selfs[:, column], index, cols_self)
            np.add.at(totals[:, column], index, cols_total)
        return selfs, totals

    base_self, base_total = matrices(cells[: len(base)])
    head_self, head_total = matrices(cells[len(base) :])
    return AlignedTree(sample_type, unit, frames, base_self, base_total, head_self, head_total)


def align(base: Sequence[FlameGraph], head: Sequence[FlameGraph]) -> AlignedTree:
    """Align every graph of both sides to one tree (see the module docstring).

    Raises ValueError when the graphs do not share one sample type and unit (pprof's
    ``compatible()``), or when a value is negative (as Pyroscope's diff refuses).

    Each graph is walked once, its frames matched to the aligned tree's by their
    children's keys (a :class:`Frame`'s children are keyed by its identity); the values
    are then read in bulk and scattered into the matrices with numpy. It gives what
    :func:`align_reference` gives, frames in the same order:
    ``tests/unit/test_diff_align.py`` holds them equal.
    """
    sample_type, unit = _one_kind(base, head)
    graphs = [*base, *head]
    root = DiffFrame(graphs[0].root.name, "", 0, 0, None, source=0)
    frames = [root]
    rows: list[int] = []  # per graph, its frames' rows in walk order (root first)
    nodes: list[Frame] = []  # the graph frames, in the same order
    sizes: list[int] = []  # frames per graph
    collecting = gc.isenabled()
    gc.disable()  # millions of short-lived tuples: no collection to walk the trees meanwhile
    try:
        for graph in graphs:
            start = len(rows)
            rows.append(0)
            nodes.append(graph.root)
            stack: list[tuple[Frame, DiffFrame]] = [(graph.root, root)]
            pop, push, add_row = stack.pop, stack.append, rows.append
            while stack:
                src, dst = pop()
                mine = dst.children
                theirs = src.children
                nodes.extend(theirs.values())
                for key, child in theirs.items():
                    made = mine.get(key)
                    if made is None:
                        index = len(frames)
                        made = mine[key] = DiffFrame(*key, index, dst, source=index)
                        frames.append(made)
                    add_row(made.index)
                    push((child, made))
            sizes.append(len(rows) - start)
    finally:
        if collecting:
            gc.enable()
    count = len(rows)
    selfs = np.fromiter(map(attrgetter("self_value"), nodes), np.float64, count)
    totals = np.fromiter(map(attrgetter("total"), nodes), np.float64, count)
    starts = np.cumsum([0, *sizes[:-1]])
    negative = (selfs < 0) | (totals < 0)
    negative[starts] = False  # a graph's root is not checked (its own values)
    if negative.any():
        raise ValueError(
            f"frame {nodes[int(negative.argmax())].name!r} has a negative value: cannot compare"
        )
    column = np.repeat(np.arange(len(graphs)), sizes)
    where = np.asarray(rows, np.int64) * len(graphs) + column
    size = len(frames) * len(graphs)
    shape = (len(frames), len(graphs))
    self_matrix = np.bincount(where, selfs, size).reshape(shape)
    total_matrix = np.bincount(where, totals, size).reshape(shape)
    n = len(base)
    return AlignedTree(
        sample_type,
        unit,
        frames,
        self_matrix[:, :n].copy(),
        total_matrix[:, :n].copy(),
        self_matrix[:, n:].copy(),
        total_matrix[:, n:].copy(),
    )
