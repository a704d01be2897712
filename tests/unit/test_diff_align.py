"""``diff.align`` (the bulk walk) against ``diff.align_reference`` (frame by frame): the
same AlignedTree, frames in the same order, on random graphs and on the step views of a
TPU-shaped capture; and the step view's one-pass build against copy-and-merge."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exporter.analysis.compare.diff import AlignedTree, align, align_reference
from exporter.analysis.sides import load
from exporter.analysis.sides.load import HOST_FRAME, load_side, step_view, step_views
from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.frames import FrameLabel
from exporter.profiles.tree_graphs import frame_maker
from exporter.profiles.xspace import use_decoder
from exporter.testing.synthetic import write_tpu_capture


def tree_shape(tree: AlignedTree) -> list[Any]:
    """Everything an AlignedTree holds, frames in their order, children in theirs."""
    frames = [
        (
            f.name,
            f.file,
            f.line,
            f.index,
            f.source,
            f.parent.index if f.parent is not None else None,
            [(k, c.index) for k, c in f.children.items()],
        )
        for f in tree.frames
    ]
    assert [f.index for f in tree.frames] == list(range(len(tree.frames)))
    return [tree.sample_type, tree.unit, frames]


def assert_same(new: AlignedTree, old: AlignedTree) -> None:
    assert tree_shape(new) == tree_shape(old)
    for name in ("base_self", "base_total", "head_self", "head_total"):
        mine, theirs = getattr(new, name), getattr(old, name)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert np.array_equal(mine, theirs), name
    assert [f.index for f in new.walk()] == [f.index for f in old.walk()]


def graph_shape(graph: FlameGraph) -> list[Any]:
    out = []
    for depth, node in graph._walk():
        out.append((depth, node.key, node.self_value, node.total, list(node.children)))
    meta = (graph.sample_type, graph.unit, graph.profile_name, graph.time_nanos)
    return [meta, graph.duration_nanos, graph.comments, out]


def random_graph(rng: random.Random, labels: list[FrameLabel], root: str = "root") -> FlameGraph:
    graph = FlameGraph("wall", "nanoseconds", root=Frame(root))
    for _ in range(rng.randrange(0, 40)):
        stack = [rng.choice(labels) for _ in range(rng.randrange(0, 6))]
        graph.add(stack, rng.randrange(0, 1000))
    if rng.random() < 0.2:  # a value on the root itself
        graph.root.self_value += 5
        graph.root.total += 5
    return graph


def test_random_graphs_align_as_the_reference() -> None:
    rng = random.Random(7)
    # Same names in other files and lines: distinct frames that must stay apart.
    labels = [FrameLabel(n, f, ln) for n in "abcd" for f, ln in (("", 0), ("x.py", 3))]
    for _ in range(60):
        base = [random_graph(rng, labels, "b") for _ in range(rng.randrange(1, 6))]
        head = [random_graph(rng, labels) for _ in range(rng.randrange(1, 6))]
        assert_same(align(base, head), align_reference(base, head))
        tree = align(base, head)
        for cut in (1, 3, 10):
            assert_same(tree.truncated(cut), align_reference(base, head).truncated(cut))


def test_the_same_refusals_with_the_same_words() -> None:
    good = FlameGraph("wall", "nanoseconds")
    good.add(["main", "a"], 3)
    bad = FlameGraph("wall", "nanoseconds")
    bad.add(["main", "a"], 3)
    bad.add(["main", "b"], 4)
    bad.root.children[("main", "", 0)].children[("b", "", 0)].self_value = -1
    other = FlameGraph("cpu", "nanoseconds")
    other.add(["main"], 1)
    negative_root = FlameGraph("wall", "nanoseconds")
    negative_root.add(["main"], 1)
    negative_root.root.self_value = -4  # the root's own values are not checked
    cases: list[tuple[list[FlameGraph], list[FlameGraph]]] = [
        ([good], [bad]),
        ([bad, good], [good]),
        ([good], [other]),
        ([], [good]),
        ([good], []),
    ]
    for base, head in cases:
        with pytest.raises(ValueError) as old:
            align_reference(base, head)
        with pytest.raises(ValueError) as new:
            align(base, head)
        assert str(new.value) == str(old.value)
    assert_same(align([good], [negative_root]), align_reference([good], [negative_root]))


def test_step_views_of_a_tpu_capture_align_as_the_reference(tmp_path: Path) -> None:
    # Real step graphs: a TPU-shaped capture read as the report reads it (device work,
    # host threads under "host"), against a slower run of the same program.
    base_path, head_path = tmp_path / "base.xplane.pb", tmp_path / "head.xplane.pb"
    shape: dict[str, Any] = {"devices": 2, "steps": 6, "ops_per_step": 300, "while_every": 20}
    write_tpu_capture(base_path, **shape)
    write_tpu_capture(head_path, seed=3, slowdown=1.2, **shape)
    base, head = load_side(str(base_path)), load_side(str(head_path))
    assert base.scope == "step" and len(base.steps) >= 6
    assert_same(align(base.steps, head.steps), align_reference(base.steps, head.steps))
    assert_same(align([base.whole], [head.whole]), align_reference([base.whole], [head.whole]))
    device = load_side(str(base_path), "device")
    assert_same(align(device.steps, base.steps), align_reference(device.steps, base.steps))


def copy_and_merge(device: FlameGraph, host: FlameGraph) -> FlameGraph:
    """The step view as it was first built: the device copied, the host's own threads
    merged in one by one, every total recomputed."""
    out = device.copy()
    own = [t for t in host.root.children.values() if not load.XLA_THREAD.search(t.name)]
    if own:
        top = out.root.child(HOST_FRAME)
        stack = [(top, thread) for thread in own]
        while stack:
            mine, theirs = stack.pop()
            node = mine.child(theirs.name, theirs.file, theirs.line)
            node.self_value += theirs.self_value
            stack.extend((node, child) for child in theirs.children.values())
        out.recompute_totals()
    return out


@pytest.fixture(params=["compiled", "python"])
def decoder(request: pytest.FixtureRequest) -> Iterator[str]:
    """The compiled frame maker copies the device graphs, then the Python loop does."""
    assert request.param == "python" or frame_maker() is not None, (
        "exporter.profiles._treegraphs was not built"
    )
    with use_decoder(request.param):
        yield request.param


def test_the_step_view_is_the_copy_and_merge(tmp_path: Path, decoder: str) -> None:
    rng = random.Random(5)
    labels = [FrameLabel(n) for n in ("a", "b", HOST_FRAME, "python3", "tf_XLAEigen")]
    for round_ in range(40):
        devices = [random_graph(rng, labels) for _ in range(rng.randrange(1, 4))]
        hosts = [random_graph(rng, labels) for _ in devices]
        devices[0].comments.append("device note")
        devices[0].time_nanos, devices[0].duration_nanos = 10, 20
        if round_ % 5 == 4:  # float values (a scaled graph): copied as they are
            devices[-1].root.children.clear()
            devices[-1].add(["a", "b"], 2.5)  # type: ignore[arg-type]
        if round_ % 7 == 6:  # companions: the long way
            devices[0].companions.append(random_graph(rng, labels))
        views = step_views(devices, hosts)
        expected = [copy_and_merge(d, h) for d, h in zip(devices, hosts, strict=True)]
        assert [graph_shape(v) for v in views] == [graph_shape(e) for e in expected]
        assert [[type(n.total) for _, n in v._walk()] for v in views] == [
            [type(n.total) for _, n in e._walk()] for e in expected
        ]
        for view, device in zip(views, devices, strict=True):
            view.check()
            assert view.root is not device.root
            assert len(view.companions) == len(device.companions)
        assert graph_shape(step_view(devices[0], hosts[0])) == graph_shape(expected[0])
    path = tmp_path / "one.xplane.pb"
    write_tpu_capture(path, devices=1, steps=4, ops_per_step=200)
    device, host = load_side(str(path), "device"), load_side(str(path), "host")
    views = step_views([device.whole, *device.steps], [host.whole, *host.steps])
    expected = [
        copy_and_merge(d, h)
        for d, h in zip([device.whole, *device.steps], [host.whole, *host.steps], strict=True)
    ]
    assert [graph_shape(v) for v in views] == [graph_shape(e) for e in expected]
