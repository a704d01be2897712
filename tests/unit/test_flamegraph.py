"""FlameGraph: self/total invariants, merge, scaling, truncation, folded and pprof."""

from __future__ import annotations

import gzip
import random

import pytest

from exporter.profiles.flamegraph import OTHER, FlameGraph, cut_name
from exporter.profiles.frames import FrameLabel
from exporter.profiles.html import render_html
from exporter.profiles.pprof import decode_pprof, encode_pprof, from_pprof, to_pprof


def _graph() -> FlameGraph:
    graph = FlameGraph(sample_type="wall", unit="nanoseconds", profile_name="wall")
    graph.add(["main", "train_step", "forward"], 60)
    graph.add(["main", "train_step", "backward"], 30)
    graph.add(["main", "train_step"], 5)
    graph.add(["main", "load_batch"], 5)
    return graph


def _random_graph(seed: int, stacks: int = 400) -> FlameGraph:
    rng = random.Random(seed)
    graph = FlameGraph(sample_type="wall", unit="nanoseconds")
    for _ in range(stacks):
        depth = rng.randint(1, 8)
        graph.add([f"f{rng.randint(0, 6)}" for _ in range(depth)], rng.randint(1, 1000))
    return graph


def test_self_and_total() -> None:
    graph = _graph()
    step = graph.find(["main", "train_step"])
    assert step is not None
    assert (step.self_value, step.total) == (5, 95)
    assert graph.root.total == 100
    graph.check()


def test_check_detects_broken_totals() -> None:
    graph = _graph()
    node = graph.find(["main", "load_batch"])
    assert node is not None
    node.total += 1
    with pytest.raises(ValueError, match="load_batch"):
        graph.check()


def test_merge_adds_values_and_rejects_other_units() -> None:
    a, b = _graph(), _graph()
    b.add(["main", "eval"], 7)
    a.merge(b)
    a.check()
    assert a.root.total == 207
    assert a.find(["main", "eval"]).total == 7  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(FlameGraph(sample_type="inuse_space", unit="bytes"))


def test_folded_round_trip() -> None:
    graph = _graph()
    text = graph.to_folded()
    assert "main;train_step;forward 60\n" in text
    assert "main;train_step 5\n" in text
    again = FlameGraph.from_folded(text, sample_type="wall", unit="nanoseconds")
    assert again.to_folded() == text
    with pytest.raises(ValueError, match="line 1"):
        FlameGraph.from_folded("no value here")


def test_folded_escapes_separators() -> None:
    graph = FlameGraph()
    graph.add(["a;b", "c\nd"], 1)
    assert graph.to_folded() == "a:b;c d 1\n"


@pytest.mark.parametrize("factor", [0.5, 1 / 3, 2.0, 0.001])
def test_scaled_keeps_totals_exact(factor: float) -> None:
    graph = _random_graph(1)
    scaled = graph.scaled(factor)
    scaled.check()
    assert scaled.root.total == round(graph.root.total * factor)


def test_normalized() -> None:
    normalized = _random_graph(2).normalized(1_000_000)
    normalized.check()
    assert normalized.root.total == 1_000_000


@pytest.mark.parametrize("budget", [1, 5, 20, 100])
def test_truncated_folds_smallest_into_other(budget: int) -> None:
    graph = _random_graph(3)
    assert graph.node_count > 100
    small = graph.truncated(budget)
    small.check()
    assert small.node_count <= budget
    assert small.root.total == graph.root.total
    # Kept frames keep their totals exactly; what went away is in "other" nodes.
    for ancestors, node in small.paths():
        if node.name == OTHER:
            continue
        original = graph.find([f.name for f in (*ancestors, node)])
        assert original is not None and original.total == node.total


def test_truncated_keeps_the_biggest_frames() -> None:
    small = _graph().truncated(4)
    names = {tuple(f.name for f in (*a, n)): n.total for a, n in small.paths()}
    assert names == {
        ("main",): 100,
        ("main", "train_step"): 95,
        ("main", OTHER): 5,  # load_batch
        ("main", "train_step", OTHER): 90,  # forward and backward
    }


def test_depth_limited_folds_what_is_deeper_into_one_named_frame() -> None:
    graph = FlameGraph()
    graph.add([f"f{i}" for i in range(50)], 10)
    graph.add(["f0", "g"], 5)
    graph.add([f"f{i}" for i in range(10)], 3)  # ends exactly at the limit: kept
    cut = graph.depth_limited(10)
    cut.check()
    assert cut.max_depth == 10
    assert cut.root.total == 18
    kept = cut.find([f"f{i}" for i in range(9)])
    assert kept is not None
    assert {c.name: c.total for c in kept.children.values()} == {cut_name(9): 13}
    assert kept.named(cut_name(9)).self_value == 13  # type: ignore[union-attr]
    assert graph.depth_limited(60).find([f"f{i}" for i in range(50)]) is not None


def test_deep_graphs_flatten_and_render_without_recursion() -> None:
    graph = FlameGraph(sample_type="wall", unit="nanoseconds")
    graph.add([f"f{i}" for i in range(5000)], 7)
    flat = graph.to_flat()
    assert len(flat["name"]) == 5001 and flat["parent"][:3] == [-1, 0, 1]
    assert flat["total"][-1] == 7
    page = render_html(graph, "deep")  # json.dumps of nested dicts used to recurse
    assert "f4999" in page
    assert graph.depth_limited(1000).max_depth == 1000


def test_pprof_round_trip_and_tables() -> None:
    graph = _graph()
    graph.add([FrameLabel("Model > forward", "model.py", 12)], 9)
    graph.time_nanos, graph.duration_nanos = 1_700_000_000_000_000_000, 5_000_000_000
    profile = decode_pprof(encode_pprof(graph))
    table = profile.string_table
    assert [(table[v.type], table[v.unit]) for v in profile.sample_type] == [
        ("wall", "nanoseconds")
    ]
    assert (table[profile.period_type.type], table[profile.period_type.unit]) == (
        "wall",
        "nanoseconds",
    )
    assert profile.period == 1
    assert profile.time_nanos == graph.time_nanos
    # One sample per node with self value; "main" appears once in the function table.
    assert len(profile.sample) == 5
    names = [table[f.name] for f in profile.function]
    assert len(names) == len(set(names))
    assert len({loc.id for loc in profile.location}) == len(profile.location)
    model = next(f for f in profile.function if table[f.name] == "Model > forward")
    assert table[model.filename] == "model.py"
    back = from_pprof(profile)
    assert back.to_folded() == graph.to_folded()


def test_pprof_is_gzip_protobuf() -> None:
    data = encode_pprof(_graph())
    assert data[:2] == b"\x1f\x8b"
    assert to_pprof(_graph()).SerializeToString() == gzip.decompress(data)


def test_decode_pprof_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="corrupt gzip"):
        decode_pprof(encode_pprof(_graph())[:30], "x.pprof.gz")
    with pytest.raises(ValueError, match=r"junk: not a pprof"):
        decode_pprof(b"\xff\xff\xff", "junk")


def test_to_dict_carries_self_total_and_file() -> None:
    graph = FlameGraph()
    graph.add([FrameLabel("f", "a.py", 3)], 4)
    tree = graph.to_dict()
    assert tree == {"n": "root", "s": 0, "t": 4, "c": [{"n": "f", "s": 4, "t": 4, "f": "a.py:3"}]}


def _same_name_graph() -> FlameGraph:
    graph = FlameGraph(sample_type="inuse_space", unit="bytes")
    graph.add(["main", FrameLabel("foo", "a.py", 10)], 100)
    graph.add(["main", FrameLabel("foo", "b.py", 3)], 50)
    return graph


def test_frames_are_keyed_by_name_file_and_line() -> None:
    graph = _same_name_graph()
    main = graph.find(["main"])
    assert main is not None
    foos = sorted((c.file, c.line, c.total) for c in main.children.values())
    assert foos == [("a.py", 10, 100), ("b.py", 3, 50)]
    assert graph.find(["main", FrameLabel("foo", "b.py", 3)]).total == 50  # type: ignore[union-attr]
    assert graph.find(["main", "foo"]).file == "a.py"  # type: ignore[union-attr]  # plain name: largest
    assert graph.find(["main", FrameLabel("foo", "c.py", 1)]) is None
    assert graph.node_count == 3


def test_identity_survives_merge_copy_scale_truncate_and_depth_limit() -> None:
    graph = _same_name_graph()
    merged = _same_name_graph()
    merged.merge(graph)
    for out in (
        merged,
        graph.copy(),
        graph.scaled(2),
        graph.truncated(10),
        graph.depth_limited(5),
    ):
        out.check()
        main = out.find(["main"])
        assert main is not None
        files = sorted((c.name, c.file, c.line) for c in main.children.values())
        assert files == [("foo", "a.py", 10), ("foo", "b.py", 3)]
    assert merged.find(["main", FrameLabel("foo", "a.py", 10)]).total == 200  # type: ignore[union-attr]


def test_to_dict_gives_each_same_named_frame_its_file() -> None:
    tree = _same_name_graph().to_dict()
    (main,) = tree["c"]  # type: ignore[misc]
    assert [(c["n"], c["f"], c["t"]) for c in main["c"]] == [
        ("foo", "a.py:10", 100),
        ("foo", "b.py:3", 50),
    ]


def test_pprof_keeps_same_named_functions_apart() -> None:
    profile = to_pprof(_same_name_graph())
    table = profile.string_table
    functions = sorted(
        (table[f.name], table[f.system_name], table[f.filename], f.start_line)
        for f in profile.function
    )
    assert functions == [
        ("foo", "foo", "a.py", 10),
        ("foo", "foo", "b.py", 3),
        ("main", "main", "", 0),
    ]
    by_id = {f.id: f for f in profile.function}
    lines = sorted(
        (table[by_id[ln.function_id].filename], ln.line)
        for loc in profile.location
        for ln in loc.line
    )
    assert lines == [("", 0), ("a.py", 10), ("b.py", 3)]
    back = from_pprof(profile)
    main = back.find(["main"])
    assert main is not None
    assert sorted((c.file, c.line, c.total) for c in main.children.values()) == [
        ("a.py", 10, 100),
        ("b.py", 3, 50),
    ]


def test_from_pprof_keys_by_start_line_not_call_line() -> None:
    # Two call sites (lines 14 and 20) of one function defined at line 5: one frame.
    profile = to_pprof(_same_name_graph())
    table = profile.string_table
    fn = next(f for f in profile.function if table[f.filename] == "a.py")
    fn.start_line = 5
    loc = next(loc for loc in profile.location if loc.line[0].function_id == fn.id)
    loc.line[0].line = 14
    extra = profile.location.add(id=len(profile.location) + 1, mapping_id=1)
    extra.line.add(function_id=fn.id, line=20)
    main_loc = next(s.location_id[1] for s in profile.sample)
    profile.sample.add(location_id=[extra.id, main_loc], value=[7])
    back = from_pprof(profile)
    main = back.find(["main"])
    assert main is not None
    assert sorted((c.file, c.line, c.total) for c in main.children.values()) == [
        ("a.py", 5, 107),
        ("b.py", 3, 50),
    ]
