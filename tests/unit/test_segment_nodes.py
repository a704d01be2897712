"""Each segment's frame-tree node, compiled (``_treegraphs.segment_nodes``), is assign's.

A windowed conversion (a compare's per-step graphs) gives every segment of a line its
node in the shared frame tree: ``FrameTree.assign`` in numpy, level by level (the twin,
``MLPROF_DECODER=python``), or the compiled pass whose node table the tree interns
level by level the same way. Both must leave the same tree (node ids, parents, tuples)
and the same self time per (node, window), over several lines sharing the tree, with
folded frames, the depth cut and overlapping events.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from exporter.profiles import tree_graphs, xplane
from exporter.profiles.frames import FrameLabel
from exporter.profiles.nesting import nest
from exporter.profiles.xspace import use_decoder


def _lines(rng: random.Random) -> list[tuple[np.ndarray, np.ndarray, list[int]]]:
    lines = []
    for _ in range(rng.randint(1, 4)):
        events = []
        if rng.random() < 0.3:  # a staircase deeper than the (lowered) depth cut
            events = [(1_000 * i, 400_000 - 1_000 * i) for i in range(12)]
        for _ in range(rng.randint(1, 50)):  # ps after the line's start
            s = rng.randint(0, 300_000)
            events.append((s, s + rng.randint(1, 150_000)))
        start = np.array([s for s, _ in events], np.int64)
        end = np.array([e for _, e in events], np.int64)
        labels = [rng.randrange(6) for _ in events]
        lines.append((start, end, labels))
    return lines


def _tree(decoder: str, lines: list[tuple[np.ndarray, np.ndarray, list[int]]],
          windows: np.ndarray | None, rule: str) -> xplane.FrameTree:  # fmt: skip
    with use_decoder(decoder):
        frames = xplane.FrameTree(windows)
        assert (frames.core is not None) == (decoder == "compiled")
        tuples = [frames.tuple_id((FrameLabel(f"f{k}"),)) for k in range(5)]
        for number, (start, end, labels) in enumerate(lines):
            nested = nest(start, end, np.arange(len(labels)), rule, frames.core)  # type: ignore[arg-type]
            ids = np.array([tuples[k] if k < 5 else xplane.FOLD for k in labels], np.int64)
            root = frames.node(0, frames.tuple_id((FrameLabel(f"thread {number}"),)))
            frames.add_line(1_000 * number, nested, ids[nested.label], root)
    return frames


def test_the_compiled_nodes_are_assigns(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tree_graphs.frame_maker() is not None, "exporter.profiles._treegraphs was not built"
    monkeypatch.setattr(xplane, "MAX_EVENT_DEPTH", 6)  # the cut within reach of small lines
    rng = random.Random(2026)
    cut_seen = 0
    for _ in range(300):
        lines = _lines(rng)
        edges = sorted(rng.sample(range(-100, 4_000), 2 * rng.randint(1, 8)))  # ns
        windows = np.array(list(zip(edges[::2], edges[1::2], strict=True)), np.int64)
        rule = rng.choice(["contain", "split"])
        compiled = _tree("compiled", lines, windows, rule)
        twin = _tree("python", lines, windows, rule)
        assert compiled.parent == twin.parent and compiled.tuple_of == twin.tuple_of
        assert [a.tolist() for a in compiled.self_ns()] == [b.tolist() for b in twin.self_ns()]
        cut_seen += compiled.cut in compiled.tuple_of
    assert cut_seen > 0


def test_tuples_past_its_range_are_left_to_numpy() -> None:
    one = np.zeros(1, np.int64)
    assert tree_graphs.segment_nodes(-one - 1, one, one + (1 << 31), 10, 0) is None
    assert tree_graphs.segment_nodes(-one - 1, one, one, 10, -1) is None
    with pytest.raises(ValueError, match="not before it"):
        tree_graphs.segment_nodes(one, one, one, 10, 0)  # its own parent
    with pytest.raises(ValueError, match="different lengths"):
        tree_graphs.segment_nodes(one, np.zeros(2, np.int64), one, 10, 0)
