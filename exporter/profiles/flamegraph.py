"""Flame graphs whose nodes carry self and total values.

``total`` of a node is its ``self`` plus the totals of its children; every operation
here (add, merge, scaling, truncation, depth limit) keeps that exact.

>>> graph = FlameGraph(sample_type="wall", unit="nanoseconds")
>>> graph.add(["main", "step", "matmul"], 30)
>>> graph.add(["main", "step"], 10)
>>> graph.root.total, graph.find(["main", "step"]).self_value
(40, 10)
>>> print(graph.to_folded(), end="")
main;step 10
main;step;matmul 30

A frame's identity is its :attr:`Frame.key`, (name, file, line of definition), wherever
the source gives them: ``foo`` of ``a.py:10`` and ``foo`` of ``b.py:3`` are two frames
(siblings with the same label), as pprof's ``merge.go`` keys functions. Frames without a
file or line (device ops, TraceMe events, folded text) are keyed by name alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from exporter.ascii_digits import parse_ascii_int
from exporter.profiles.frames import FrameLabel

__all__ = ["OTHER", "FlameGraph", "Frame", "FrameKey", "cut_name", "format_value"]

OTHER = "other"  # the frame that holds what truncation folded away


def format_value(value: float, unit: str) -> str:
    """``value`` in its unit for reading, as the HTML page shows it (``5.522 s``, ``2.00 MiB``)."""
    if unit == "nanoseconds":
        for scale, name in ((1e9, "s"), (1e6, "ms"), (1e3, "\u00b5s")):
            if abs(value) >= scale:
                return f"{value / scale:.3f} {name}"
        return f"{value:.0f} ns"
    if unit == "bytes":
        names = ("B", "KiB", "MiB", "GiB", "TiB")
        index, scaled = 0, float(value)
        while abs(scaled) >= 1024 and index < len(names) - 1:
            scaled, index = scaled / 1024, index + 1
        return f"{scaled:.2f} {names[index]}" if index else f"{scaled:.0f} B"
    return f"{value:,.0f} {unit}"


def cut_name(kept: int) -> str:
    """The frame holding what a depth limit cut below ``kept`` frames."""
    return f"<frames below depth {kept}>"


FrameKey = tuple[str, str, int]  # (name, file, line of definition)


class Frame:
    """One node: a label, where it lives, its self and total value and its children.

    ``line`` is the line where the function is defined (pprof's ``start_line``) when the
    source gives it; ``children`` are keyed by each child's :attr:`key`.
    """

    __slots__ = ("children", "file", "line", "name", "self_value", "total")

    def __init__(self, name: str, file: str = "", line: int = 0) -> None:
        self.name = name
        self.file = file
        self.line = line
        self.self_value = 0
        self.total = 0
        self.children: dict[FrameKey, Frame] = {}

    @property
    def key(self) -> FrameKey:
        """The frame's identity among its siblings: (name, file, line of definition)."""
        return (self.name, self.file, self.line)

    def child(self, name: str, file: str = "", line: int = 0) -> Frame:
        """The child with this identity, created when missing."""
        key = (name, file, line)
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = Frame(name, file, line)
        return node

    def named(self, name: str) -> Frame | None:
        """The child labelled ``name``; among same-named children, the largest total."""
        found: Frame | None = None
        for node in self.children.values():
            if node.name == name and (found is None or node.total > found.total):
                found = node
        return found

    def __repr__(self) -> str:
        return f"Frame({self.name!r}, self={self.self_value}, total={self.total})"


def _as_label(item: str | FrameLabel) -> FrameLabel:
    return item if isinstance(item, FrameLabel) else FrameLabel(item)


def _clean(name: str) -> str:
    # Folded text has no escaping: ';' separates frames and a newline ends a line.
    return name.replace(";", ":").replace("\n", " ")


@dataclass
class FlameGraph:
    """A tree of frames with self/total values of one sample type.

    ``profile_name`` becomes Pyroscope's ``__name__``; ``sample_type``/``unit`` the pprof
    sample type; ``time_nanos``/``duration_nanos`` when the data was recorded.

    ``companions`` are other sample types measured on the same stacks (a memory
    profile's ``inuse_objects`` beside its ``inuse_space``): the pprof carries them as
    further sample types. ``copy`` and ``merge`` carry them along; the other transforms
    (scaling, truncation, depth limit) apply to this sample type alone.
    """

    sample_type: str = "samples"
    unit: str = "count"
    profile_name: str = "profile"
    period_type: str = ""
    period_unit: str = ""
    period: int = 1
    time_nanos: int = 0
    duration_nanos: int = 0
    root: Frame = field(default_factory=lambda: Frame("root"))
    companions: list[FlameGraph] = field(default_factory=list)
    # Notes that travel with the graph into the pprof's ``comment`` (e.g. the raw ids of
    # the threads the labels number); every transform and merge keeps them.
    comments: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.period_type = self.period_type or self.sample_type
        self.period_unit = self.period_unit or self.unit

    # -- building ------------------------------------------------------------------
    def add(self, stack: Iterable[str | FrameLabel], value: int) -> None:
        """Add ``value`` to the node at ``stack`` (root-first) and its ancestors' totals."""
        node = self.root
        node.total += value
        for item in stack:
            label = _as_label(item)
            node = node.child(label.name, label.file, label.line)
            node.total += value
        node.self_value += value

    def find(self, stack: Sequence[str | FrameLabel]) -> Frame | None:
        """The node at ``stack`` (root-first), or None.

        A :class:`FrameLabel` matches its exact identity; a plain name matches a child of
        that name (the largest, when frames of several files share it).
        """
        node = self.root
        for item in stack:
            if isinstance(item, FrameLabel):
                found = node.children.get((item.name, item.file, item.line))
            else:
                found = node.named(item)
            if found is None:
                return None
            node = found
        return node

    def recompute_totals(self) -> None:
        """Set every total to self plus children (after editing ``self_value`` directly)."""
        for _, node in reversed(list(self._walk())):
            node.total = node.self_value + sum(c.total for c in node.children.values())

    def merge(self, other: FlameGraph) -> None:
        """Add ``other``'s values into this graph (same sample type and unit)."""
        if (other.sample_type, other.unit) != (self.sample_type, self.unit):
            raise ValueError(
                f"cannot merge {other.sample_type}/{other.unit} into {self.sample_type}/{self.unit}"
            )
        stack: list[tuple[Frame, Frame]] = [(self.root, other.root)]
        while stack:
            mine, theirs = stack.pop()
            mine.self_value += theirs.self_value
            mine.total += theirs.total
            for child in theirs.children.values():
                stack.append((mine.child(child.name, child.file, child.line), child))
        self.comments.extend(c for c in other.comments if c not in self.comments)
        for extra in other.companions:
            same = next((c for c in self.companions if c.sample_type == extra.sample_type), None)
            if same is None:
                self.companions.append(extra.copy())
            else:
                same.merge(extra)
        if other.time_nanos and (not self.time_nanos or other.time_nanos < self.time_nanos):
            end = max(
                self.time_nanos + self.duration_nanos, other.time_nanos + other.duration_nanos
            )
            self.time_nanos = other.time_nanos
            self.duration_nanos = end - other.time_nanos

    # -- reading -------------------------------------------------------------------
    def _walk(self) -> Iterator[tuple[int, Frame]]:
        """(depth, node) pre-order, root included at depth 0; iterative (deep stacks)."""
        stack: list[tuple[int, Frame]] = [(0, self.root)]
        while stack:
            depth, node = stack.pop()
            yield depth, node
            children = list(node.children.values())
            stack.extend((depth + 1, c) for c in reversed(children))

    def paths(self) -> Iterator[tuple[tuple[Frame, ...], Frame]]:
        """(ancestors root-first excluding root, node) for every non-root node, pre-order."""
        stack: list[tuple[tuple[Frame, ...], Frame]] = [
            ((), c) for c in reversed(list(self.root.children.values()))
        ]
        while stack:
            ancestors, node = stack.pop()
            yield ancestors, node
            below = (*ancestors, node)
            stack.extend((below, c) for c in reversed(list(node.children.values())))

    @property
    def node_count(self) -> int:
        """Number of frames, root excluded."""
        return sum(1 for _ in self._walk()) - 1

    @property
    def max_depth(self) -> int:
        """Length of the longest stack."""
        return max(depth for depth, _ in self._walk())

    def check(self) -> None:
        """Raise ValueError where a total is not self plus children or a value is negative."""
        for depth, node in reversed(list(self._walk())):  # deepest first: name the culprit
            expected = node.self_value + sum(c.total for c in node.children.values())
            if node.total != expected or node.self_value < 0:
                raise ValueError(
                    f"frame {node.name!r} at depth {depth}: total {node.total} != self "
                    f"{node.self_value} + children {expected - node.self_value}"
                )

    def to_folded(self) -> str:
        """Folded stacks, one ``a;b;c value`` line per node with self value.

        Folded text carries names only: frames that differ only by file or line print
        as separate lines with the same stack, and ``from_folded`` merges them.
        """
        lines: list[str] = []
        # Each node's text is its parent's plus its own name: one pass, no re-joining.
        stack = [(c, _clean(c.name)) for c in reversed(list(self.root.children.values()))]
        while stack:
            node, text = stack.pop()
            if node.self_value:
                lines.append(f"{text} {node.self_value}")
            children = list(node.children.values())
            stack.extend((c, f"{text};{_clean(c.name)}") for c in reversed(children))
        return "\n".join(lines) + ("\n" if lines else "")

    @classmethod
    def from_folded(cls, text: str, **attrs: object) -> FlameGraph:
        """Parse folded stacks (``a;b;c 123`` per line)."""
        graph = cls(**attrs)  # type: ignore[arg-type]
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line:
                continue
            stack, _, value = line.rpartition(" ")
            count = parse_ascii_int(value, signed=True)
            if not stack or count is None:
                raise ValueError(f"line {number}: expected 'frame;frame VALUE', got {raw!r}")
            graph.add(stack.split(";"), count)
        return graph

    def to_dict(self) -> dict[str, object]:
        """Nested ``{"n", "s", "t", "c"}`` dicts (name, self, total, children) for HTML/JSON.

        ``"f"`` is the node's ``file:line`` (or file) where known.
        """

        def build(node: Frame) -> dict[str, object]:
            out: dict[str, object] = {"n": node.name, "s": node.self_value, "t": node.total}
            if node.file:
                out["f"] = f"{node.file}:{node.line}" if node.line else node.file
            return out

        top = build(self.root)
        stack: list[tuple[Frame, dict[str, object]]] = [(self.root, top)]
        while stack:
            node, out = stack.pop()
            kids = sorted(node.children.values(), key=lambda c: -c.total)
            built = [build(c) for c in kids]
            if built:
                out["c"] = built
            stack.extend(zip(kids, built, strict=True))
        return top

    def to_flat(self) -> dict[str, list[object]]:
        """The tree as flat columns in pre-order (no nesting, so no recursion anywhere).

        ``parent`` is each node's parent index (-1 for the root, node 0); children come
        in order of decreasing total. ``name``, ``file`` (``file:line`` or ``""``),
        ``self`` and ``total`` are per node. Used by the HTML page.
        """
        names: list[object] = []
        files: list[object] = []
        parents: list[object] = []
        selfs: list[object] = []
        totals: list[object] = []
        stack: list[tuple[Frame, int]] = [(self.root, -1)]
        while stack:
            node, parent = stack.pop()
            index = len(names)
            names.append(node.name)
            files.append(f"{node.file}:{node.line}" if node.file and node.line else node.file)
            parents.append(parent)
            selfs.append(node.self_value)
            totals.append(node.total)
            kids = sorted(node.children.values(), key=lambda c: -c.total)
            stack.extend((c, index) for c in reversed(kids))
        return {"name": names, "file": files, "parent": parents, "self": selfs, "total": totals}

    # -- transforming (each returns a new graph) ------------------------------------
    def _like(self) -> FlameGraph:
        return FlameGraph(
            sample_type=self.sample_type,
            unit=self.unit,
            profile_name=self.profile_name,
            period_type=self.period_type,
            period_unit=self.period_unit,
            period=self.period,
            time_nanos=self.time_nanos,
            duration_nanos=self.duration_nanos,
            comments=list(self.comments),
        )

    def copy(self) -> FlameGraph:
        """A deep copy (companions included)."""
        out = self._like()
        out.merge(self)
        return out

    def scaled(self, factor: float) -> FlameGraph:
        """Values multiplied by ``factor``, rounded so that totals stay exact.

        Self values are rounded by largest remainder, so the root total is the rounded
        scaled root total and every node's total is still self plus children.
        """
        out = self.copy()
        nodes = [node for _, node in out._walk()]
        exact = [node.self_value * factor for node in nodes]
        floors = [int(x // 1) for x in exact]
        target = round(self.root.total * factor)
        missing = target - sum(floors)
        order = sorted(range(len(nodes)), key=lambda i: floors[i] - exact[i])
        for i in order[: max(0, missing)]:
            floors[i] += 1
        for node, value in zip(nodes, floors, strict=True):
            node.self_value = value
        out.recompute_totals()
        return out

    def normalized(self, total: int = 1_000_000) -> FlameGraph:
        """Scaled so the root total is ``total`` (parts per million by default)."""
        if self.root.total <= 0:
            return self.copy()
        return self.scaled(total / self.root.total)

    def truncated(self, max_nodes: int) -> FlameGraph:
        """At most ``max_nodes`` frames: the smallest subtrees fold into an ``other`` child.

        Totals stay exact: an ``other`` node's self is the sum of the totals it replaced.
        """
        if max_nodes < 1:
            raise ValueError("max_nodes must be at least 1")
        if self.node_count <= max_nodes:
            return self.copy()
        # Rank by total, ancestors before descendants on ties (depth), so the kept set is
        # closed under "parent of": a parent's total is never below its child's.
        ranked: list[tuple[int, int, int, Frame, Frame]] = []
        seq = 0
        stack: list[tuple[int, Frame]] = [(0, self.root)]
        while stack:
            depth, node = stack.pop()
            for child in node.children.values():
                seq += 1
                ranked.append((-child.total, depth + 1, seq, child, node))
                stack.append((depth + 1, child))
        keep_n = max_nodes
        while True:
            kept = (
                heapq.nsmallest(keep_n, ranked, key=lambda r: (r[0], r[1], r[2])) if keep_n else []
            )
            kept_ids = {id(r[3]) for r in kept}
            parents = {id(self.root): self.root} | {id(r[3]): r[3] for r in kept}
            others = 0
            for parent in parents.values():
                names = [c.name for c in parent.children.values() if id(c) not in kept_ids]
                if names and not any(
                    c.name == OTHER and id(c) in kept_ids for c in parent.children.values()
                ):
                    others += 1
            if keep_n + others <= max_nodes or keep_n == 0:
                break
            keep_n = max(0, keep_n - (keep_n + others - max_nodes))
        out = self._like()
        pending: list[tuple[Frame, Frame]] = [(self.root, out.root)]
        while pending:
            src, dst = pending.pop()
            dst.self_value = src.self_value
            folded = 0
            for child in src.children.values():
                if id(child) in kept_ids:
                    pending.append((child, dst.child(child.name, child.file, child.line)))
                else:
                    folded += child.total
            if folded:
                dst.child(OTHER).self_value += folded
        out.recompute_totals()
        return out

    def depth_limited(self, max_depth: int) -> FlameGraph:
        """Stacks at most ``max_depth`` frames deep; what is deeper folds into one frame.

        Where a stack goes deeper, its frame at ``max_depth`` and everything below it
        become one frame named :func:`cut_name` (self = the total cut), so totals stay
        exact and the cut is visible; stacks that end at ``max_depth`` are kept.
        """
        if max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        out = self._like()
        cut = cut_name(max_depth - 1)
        pending: list[tuple[int, Frame, Frame]] = [(0, self.root, out.root)]
        while pending:
            depth, src, dst = pending.pop()
            dst.self_value += src.self_value
            for child in src.children.values():
                if depth + 1 == max_depth and child.children:
                    dst.child(cut).self_value += child.total
                else:
                    pending.append(
                        (depth + 1, child, dst.child(child.name, child.file, child.line))
                    )
        out.recompute_totals()
        return out
