"""The frame-by-frame graph builder against its reference (exporter.profiles.tree_graphs).

Every graph a conversion builds goes through ``graphs_by_frame``; ``graphs_by_node`` is
the builder it replaced. Both run on the frame tree of each conversion here, and their
graphs must be identical: same frames, values, totals, and children in the same order.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from exporter.profiles import tree_graphs, xplane
from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.steps import StepWindow, windowed_flamegraphs
from exporter.profiles.xplane import MAX_EVENT_DEPTH, Capture, device_flamegraph, host_flamegraph
from exporter.profiles.xspace import use_decoder
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture
from tests.xspace_builder import PlaneBuilder

BASE_NS = 1_700_000_000_000_000_000


def shape(graph: FlameGraph) -> list[tuple[Any, ...]]:
    """Everything a graph holds, in its own order (pre-order, children as inserted)."""
    head = (graph.sample_type, graph.unit, graph.profile_name, graph.time_nanos)
    nodes = [(d, n.name, n.file, n.line, n.self_value, n.total) for d, n in graph._walk()]
    return [head, graph.duration_nanos, graph.comments, *nodes]


class Both:
    """Builds every graph both ways (the product keeps the new one) and counts them."""

    def __init__(self) -> None:
        self.calls = 0
        self.frames = 0

    def __call__(self, *args: Any) -> list[FlameGraph]:
        old = tree_graphs.graphs_by_node(*args)
        new = tree_graphs.graphs_by_frame(*args)
        assert [shape(g) for g in new] == [shape(g) for g in old]
        self.calls += 1
        self.frames += sum(g.node_count for g in new)
        return new


@pytest.fixture
def both(monkeypatch: pytest.MonkeyPatch) -> Iterator[Both]:
    spy = Both()
    monkeypatch.setattr(xplane, "graphs_by_frame", spy)
    yield spy


def _tiles(start: int, end: int, count: int) -> list[StepWindow]:
    edges = [start + (end - start) * i // count for i in range(count + 1)]
    return [StepWindow(a, b, None) for a, b in itertools.pairwise(edges)]


def _gapped(start: int, end: int, count: int, seed: int) -> list[StepWindow]:
    rng = random.Random(seed)
    edges = sorted(rng.sample(range(start, end), 2 * count))
    return [StepWindow(a, b, None) for a, b in zip(edges[::2], edges[1::2], strict=True) if b > a]


def test_tpu_capture_whole_and_windowed(both: Both, maker: str) -> None:
    synthetic = tpu_capture(devices=2, steps=6, ops_per_step=120, distinct_ops=40,
                            while_every=7, while_body=3)  # fmt: skip
    capture = Capture.from_space(synthetic.space)
    assert device_flamegraph(capture) is not None
    assert host_flamegraph(capture) is not None
    start, duration = capture.time_range()
    for windows in (
        _tiles(start - 10**9, start + duration + 10**9, 9),  # cut inside ops, edges outside
        _gapped(start, start + duration, 12, seed=1),  # gaps between windows
        [StepWindow(start + duration + 5, start + duration + 9, None)],  # no time in it
    ):
        for kind in ("device", "host"):
            windowed_flamegraphs(capture, kind, windows)  # type: ignore[arg-type]
    assert both.calls == 8 and both.frames > 1000


def _host_capture(lines: dict[str, list[tuple[str, int, int]]]) -> Capture:
    space = xplane_pb2.XSpace()
    env = PlaneBuilder(space, "Task Environment")
    env.plane.stats.add(metadata_id=env.stat_id("profile_start_time"), uint64_value=BASE_NS)
    host = PlaneBuilder(space, "/host:CPU")
    for number, (name, events) in enumerate(lines.items()):
        line = host.line(name, line_id=number + 1, timestamp_ns=1_000)
        for event, offset, duration in events:
            host.event(line, event, offset, duration)
    return Capture.from_space(space)


def test_host_shapes_overlaps_folds_recursion_and_the_depth_cut(both: Both, maker: str) -> None:
    rng = random.Random(7)
    py = [f"$/src/m{i}.py:{10 * i} f{i}" for i in range(6)]  # Python frames (file, line)
    overlapping = [(rng.choice(["a", "b", "c", *py]), rng.randrange(0, 5000),
                    rng.randrange(1, 400)) for _ in range(600)]  # fmt: skip
    # A TraceMe inside one of the same name folds; a Python frame inside itself recurses.
    same = [("PjitFunction(update)", 0, 100), ("PjitFunction(update)", 10, 50),
            (py[0], 200, 100), (py[0], 210, 50), (py[0], 220, 10)]  # fmt: skip
    deep = [("deep", i, 2 * (MAX_EVENT_DEPTH + 20) - 2 * i) for i in range(MAX_EVENT_DEPTH + 20)]
    pools = [("work", 0, 30), ("work", 40, 30)]
    capture = _host_capture({"python": overlapping, "main": same, "tf_pool/123": deep,
                             "tf_pool/456": pools, "python ": same})  # fmt: skip
    host = host_flamegraph(capture)
    assert host is not None
    folded = host.to_folded()
    assert xplane.CUT_FRAME in folded and "f0;f0;f0" in folded  # the cut and a recursion
    start, end = BASE_NS + 1_000, BASE_NS + 1_000 + 2 * (MAX_EVENT_DEPTH + 20)  # the lines'
    windowed_flamegraphs(capture, "host", _tiles(start, end + 1, 23))
    windowed_flamegraphs(capture, "host", _gapped(start, end, 30, seed=3))
    assert both.calls == 3 and both.frames > 3 * MAX_EVENT_DEPTH


@pytest.fixture(params=["compiled", "python"])
def maker(request: pytest.FixtureRequest) -> Iterator[str]:
    """The frame maker in use: the compiled one, then its Python twin."""
    # Built by every dev install (test_decoder fails without it): never a silent skip.
    assert request.param == "python" or tree_graphs.frame_maker() is not None, (
        "exporter.profiles._treegraphs was not built"
    )
    with use_decoder(request.param):
        assert (tree_graphs.frame_maker() is not None) == (request.param == "compiled")
        yield request.param


def test_random_trees_and_values(maker: str) -> None:
    # Straight at the builders: random trees with empty and repeated label tuples, values
    # on the root, on inner nodes and on several nodes of one frame, empty windows.
    rng = random.Random(11)
    labels = [xplane.FrameLabel(n, f, ln) for n in "abc" for f, ln in (("", 0), ("x.py", 3))]
    for _ in range(40):
        tuples = [tuple(rng.choice(labels) for _ in range(rng.randrange(0, 3))) for _ in range(9)]
        parent, tuple_of = [-1], [-1]
        for node in range(1, rng.randrange(2, 60)):
            parent.append(rng.randrange(0, node))
            tuple_of.append(rng.randrange(len(tuples)))
        count = rng.randrange(1, 6)
        size = rng.randrange(0, 120)
        values = (
            np.array([rng.randrange(len(parent)) for _ in range(size)], np.int64),
            np.array([rng.randrange(count) for _ in range(size)], np.int64),
            np.array([rng.randrange(-2, 50) for _ in range(size)], np.int64),
        )
        template = FlameGraph(sample_type="wall", unit="nanoseconds", comments=["c"])
        args = (parent, tuple_of, tuples, template, values, count)
        new = tree_graphs.graphs_by_frame(*args)
        assert [shape(g) for g in new] == [shape(g) for g in tree_graphs.graphs_by_node(*args)]
        for graph in new:
            graph.check()


def test_the_compiled_maker_refuses_rows_out_of_range() -> None:
    core = tree_graphs.frame_maker()
    assert core is not None, "exporter.profiles._treegraphs was not built"
    root = FlameGraph().root
    keys = [("root", "", 0), ("a", "", 0)]

    def make(window: int, frame: int, parent: int, keys: list[Any] = keys) -> None:
        rows = [np.array([0, window], np.int64), np.array([0, frame], np.int64),
                np.array([1, 2], np.int64), np.array([3, 2], np.int64),
                np.array([0, parent], np.int64)]  # fmt: skip
        core.make(Frame, tree_graphs._SLOTS, [root], keys, *rows)

    make(0, 1, 0)
    assert root.children[("a", "", 0)].total == 2
    for window, frame, parent in ((1, 1, 0), (0, 2, 0), (0, 1, 1), (0, 1, -1), (-1, 1, 0)):
        with pytest.raises(ValueError, match="out of range"):
            make(window, frame, parent)
    with pytest.raises(ValueError, match="not \\(name, file, line\\)"):
        make(0, 1, 0, [("root", "", 0), "a"])
    for wrong in (np.zeros(2, np.int32), np.zeros(2, np.float64)):
        with pytest.raises(ValueError, match="int64"):
            core.make(Frame, tree_graphs._SLOTS, [root], keys, *[wrong] * 5)


def test_kept_windows_only_and_the_total_of_all(maker: str) -> None:
    rng = random.Random(5)
    labels = [xplane.FrameLabel(n) for n in "abcd"]
    tuples = [(label,) for label in labels] + [(labels[0], labels[1])]
    parent, tuple_of = [-1], [-1]
    for node in range(1, 40):
        parent.append(rng.randrange(0, node))
        tuple_of.append(rng.randrange(len(tuples)))
    count, size = 9, 300
    values = (
        np.array([rng.randrange(len(parent)) for _ in range(size)], np.int64),
        np.array([rng.randrange(count) for _ in range(size)], np.int64),
        np.array([rng.randrange(1, 50) for _ in range(size)], np.int64),
    )
    keep = np.array([i % 3 == 1 for i in range(count)])
    template = FlameGraph(sample_type="wall", unit="nanoseconds")
    tree = (parent, tuple_of, tuples, template)
    every = tree_graphs.graphs_by_node(*tree, *tree_graphs.kept_windows(values, count, True))
    some = tree_graphs.graphs_by_frame(*tree, *tree_graphs.kept_windows(values, count, True, keep))
    expected = [every[i] for i in np.flatnonzero(keep)] + [every[-1]]
    assert [shape(g) for g in some] == [shape(g) for g in expected]
    assert every[-1].root.total == int(values[2].sum())


def test_the_compiled_rows_refuse_ids_out_of_range() -> None:
    # The rows graphs_by_frame makes frames from, compiled: whatever ids it is handed,
    # one ValueError, never a read outside the arrays or a walk that does not end.
    core = tree_graphs.frame_maker()
    assert core is not None, "exporter.profiles._treegraphs was not built"

    def rows(frame_of: list[int], f_parent: list[int], node: int, window: int,
             count: int = 2) -> Any:  # fmt: skip
        arrays = [np.array(x, np.int64) for x in (frame_of, f_parent, [node], [window], [5])]
        return core.rows(*arrays, count)

    made = [np.frombuffer(c, np.int64).tolist() for c in rows([0, 1], [-1, 0], 1, 1)]
    assert made == [[1, 1], [0, 1], [0, 5], [5, 5], [0, 0]]  # window, frame, own, total, parent
    for frame_of, f_parent, node, window in (
        ([0, 1], [-1, 0], 2, 0),  # a node past the nodes
        ([0, 1], [-1, 0], 0, 2),  # a window past the windows
        ([0, 2], [-1, 0], 1, 0),  # a node's frame past the frames
        ([0, 1], [-1, 1], 1, 0),  # a frame its own parent: a walk up that would not end
        ([0, 1], [0, 0], 1, 0),  # a root with a parent
    ):
        with pytest.raises(ValueError, match="rows: "):
            rows(frame_of, f_parent, node, window)
    with pytest.raises(ValueError, match="int64"):
        core.rows(*[np.zeros(2, np.int32)] * 5, 1)


def test_the_compiled_maker_writes_slots_only_of_its_own_class() -> None:
    # The maker writes a frame's slots at the descriptors' offsets only where they are
    # the class's own object slots; another class's descriptors go through their setter,
    # which refuses an object they do not belong to (no write into the wrong layout).
    core = tree_graphs.frame_maker()
    assert core is not None, "exporter.profiles._treegraphs was not built"

    class Other:
        __slots__ = ("a", "b", "c", "d", "e", "f")

    rows = [np.array([0, 0], np.int64), np.array([0, 1], np.int64), np.array([1, 2], np.int64),
            np.array([3, 2], np.int64), np.array([0, 0], np.int64)]  # fmt: skip
    keys = [("root", "", 0), ("a", "", 0)]
    with pytest.raises(TypeError):
        core.make(Other, tree_graphs._SLOTS, [FlameGraph().root], keys, *rows)
    slots = tuple(getattr(Other, name) for name in Other.__slots__)
    with pytest.raises(TypeError):
        core.make(Frame, slots, [FlameGraph().root], keys, *rows)


def test_the_compiled_frames_and_their_children_are_left_out_of_the_collector() -> None:
    # A compare's step graphs hold tens of thousands of frames: with their children
    # dicts tracked again by CPython as children went in, every collection walked them
    # (2 ms of a TPU capture's read). Frames and dicts hold no cycle: none is tracked,
    # and a child added later by Python tracks its parent's dict again, as CPython does.
    import gc

    synthetic = tpu_capture(devices=1, steps=3, ops_per_step=60, distinct_ops=20,
                            while_every=7, while_body=3)  # fmt: skip
    capture = Capture.from_space(synthetic.space)
    start, duration = capture.time_range()
    with use_decoder("compiled"):
        graphs = windowed_flamegraphs(capture, "device", _tiles(start, start + duration, 3))
    inner = [n for g in graphs for _, n in g._walk() if n.children and n is not g.root]
    assert len(inner) > 20
    assert not any(gc.is_tracked(n) or gc.is_tracked(n.children) for n in inner)
    inner[0].child("added later")
    assert gc.is_tracked(inner[0].children)
