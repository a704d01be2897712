"""The aligned diff tree: one shape for both sides, values side by side, truncation
together (tiny hand-built trees per edge case, as Pyroscope's flamegraph_diff_test.go)."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.compare.diff import align
from exporter.profiles.flamegraph import OTHER, FlameGraph
from exporter.profiles.frames import FrameLabel


def graph(*stacks: tuple[list[str | FrameLabel], int], sample_type: str = "wall") -> FlameGraph:
    out = FlameGraph(sample_type=sample_type, unit="nanoseconds")
    for stack, value in stacks:
        out.add(stack, value)
    return out


def values(tree, side: str, name: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    frame = next(f for f in tree.walk() if f.name == name)
    selfs, totals = getattr(tree, f"{side}_self"), getattr(tree, f"{side}_total")
    return float(selfs[frame.index, 0]), float(totals[frame.index, 0])


def test_missing_frames_become_zero_on_the_other_side() -> None:
    base = graph((["main", "a"], 30), (["main", "gone"], 5))
    head = graph((["main", "a"], 10), (["main", "new"], 20))
    tree = align([base], [head])
    assert [f.name for f in tree.walk()] == ["main", "a", "gone", "new"]
    assert values(tree, "base", "gone") == (5, 5) and values(tree, "head", "gone") == (0, 0)
    assert values(tree, "base", "new") == (0, 0) and values(tree, "head", "new") == (20, 20)
    assert values(tree, "base", "main") == (0, 35) and values(tree, "head", "main") == (0, 30)
    # Both sides' totals are kept, never only the difference.
    assert tree.base_total[0, 0] == 35 and tree.head_total[0, 0] == 30


def test_same_name_in_different_files_stays_two_frames() -> None:
    base = graph(([FrameLabel("foo", "a.py", 10)], 100), ([FrameLabel("foo", "b.py", 3)], 50))
    head = graph(([FrameLabel("foo", "a.py", 10)], 100))
    tree = align([base], [head])
    foos = [f for f in tree.walk() if f.name == "foo"]
    assert sorted(f.file for f in foos) == ["a.py", "b.py"]
    b = next(f for f in foos if f.file == "b.py")
    assert (tree.base_self[b.index, 0], tree.head_self[b.index, 0]) == (50, 0)


def test_each_graph_of_a_side_is_a_column() -> None:
    steps = [graph((["step", "op"], v)) for v in (10, 20, 30)]
    tree = align(steps, [graph((["step", "op"], 5))])
    op = next(f for f in tree.walk() if f.name == "op")
    assert tree.base_self[op.index].tolist() == [10, 20, 30]
    assert tree.means()[0][op.index] == 20


def test_truncation_folds_both_sides_together_ranked_by_the_larger_side() -> None:
    # "big_in_head" is tiny in the base: truncating the base alone would fold it there
    # and make it look added. Together, it is kept on both sides.
    base = graph((["m", "a"], 500), (["m", "b"], 400), (["m", "big_in_head"], 1), (["m", "c"], 99))
    head = graph(
        (["m", "a"], 100), (["m", "b"], 100), (["m", "big_in_head"], 700), (["m", "c"], 100)
    )
    tree = align([base], [head]).truncated(4)
    names = [f.name for f in tree.walk()]
    assert len(names) <= 4
    assert "big_in_head" in names and OTHER in names and "c" not in names
    other = next(f for f in tree.walk() if f.name == OTHER)
    assert tree.base_self[other.index, 0] + tree.head_self[other.index, 0] > 0
    # Totals stay exact on both sides.
    assert tree.base_total[0, 0] == 1000 and tree.head_total[0, 0] == 1000
    for node in tree.walk():
        for side in ("base", "head"):
            selfs, totals = getattr(tree, f"{side}_self"), getattr(tree, f"{side}_total")
            below = sum(totals[c.index, 0] for c in node.children.values())
            assert totals[node.index, 0] == pytest.approx(selfs[node.index, 0] + below)


def test_truncation_keeps_the_source_index_for_lookups() -> None:
    base = graph(*[(["m", f"f{i}"], 100 - i) for i in range(20)])
    full = align([base], [base])
    cut = full.truncated(5)
    for frame in cut.walk():
        if frame.name != OTHER:
            assert full.frames[frame.source].name == frame.name


def test_refuses_mixed_sample_types_and_negative_values() -> None:
    with pytest.raises(ValueError, match="different sample types"):
        align([graph((["a"], 1))], [graph((["a"], 1), sample_type="device_time")])
    bad = graph((["a"], 1))
    bad.root.children[next(iter(bad.root.children))].self_value = -5
    with pytest.raises(ValueError, match="negative"):
        align([bad], [graph((["a"], 1))])


def test_means_of_an_empty_side_are_zero() -> None:
    tree = align([graph((["a"], 1))], [graph((["a"], 3))])
    assert np.all(tree.means()[3] >= 0)
