"""Step windows and per-step flame graphs (exporter.profiles.steps)."""

from __future__ import annotations

import itertools

import pytest

from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.steps import StepWindow, step_windows, windowed_flamegraphs
from exporter.profiles.xplane import Capture, device_flamegraph, host_flamegraph
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture
from tests.xspace_builder import PlaneBuilder

BASE_NS = 1_700_000_000_000_000_000


def _frames(graph: FlameGraph) -> dict[tuple[tuple[str, str, int], ...], int]:
    return {
        tuple(f.key for f in (*ancestors, node)): node.self_value
        for ancestors, node in graph.paths()
        if node.self_value
    }


def _summed(graphs: list[FlameGraph]) -> dict[tuple[tuple[str, str, int], ...], int]:
    total = graphs[0].copy()
    for graph in graphs[1:]:
        total.merge(graph)
    return _frames(total)


def _tiles(start: int, end: int, count: int) -> list[StepWindow]:
    edges = [start + (end - start) * i // count for i in range(count + 1)]
    return [StepWindow(a, b, None) for a, b in itertools.pairwise(edges)]


def test_device_steps_are_the_steps_line_across_chips() -> None:
    synthetic = tpu_capture(devices=2, steps=5, ops_per_step=20, distinct_ops=10)
    capture = Capture.from_space(synthetic.space)
    windows, source = step_windows(capture)
    assert source == "device_steps"
    assert [w.step for w in windows] == [0, 1, 2, 3, 4]
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(windows))
    assert all(w.end_ns > w.start_ns for w in windows)


def test_windows_that_tile_the_capture_sum_to_its_graph() -> None:
    synthetic = tpu_capture(devices=2, steps=4, ops_per_step=50, distinct_ops=12)
    capture = Capture.from_space(synthetic.space)
    full = device_flamegraph(capture)
    host = host_flamegraph(capture)
    assert full is not None and host is not None
    start, duration = capture.time_range()
    # Wider than the capture, cut at odd places (inside ops), 7 windows.
    windows = _tiles(start - 10**9, start + 10 * duration + 10**9, 7)
    device_parts = windowed_flamegraphs(capture, "device", windows)
    assert len(device_parts) == 7
    for part in device_parts:
        part.check()
    assert _summed(device_parts) == _frames(full)
    assert _summed(windowed_flamegraphs(capture, "host", windows)) == _frames(host)


def test_step_windows_split_device_time_per_step() -> None:
    synthetic = tpu_capture(devices=1, steps=3, ops_per_step=30, distinct_ops=9)
    capture = Capture.from_space(synthetic.space)
    windows, _ = step_windows(capture)
    per_step = windowed_flamegraphs(capture, "device", windows)
    full = device_flamegraph(capture)
    assert full is not None
    # Every op runs inside a step: the steps hold all device time, each a share of it.
    assert sum(g.root.total for g in per_step) == full.root.total
    assert all(0 < g.root.total < full.root.total for g in per_step)
    assert [g.time_nanos for g in per_step] == [w.start_ns for w in windows]


def _two_window_plane() -> tuple[Capture, list[StepWindow]]:
    space = xplane_pb2.XSpace()
    env = PlaneBuilder(space, "Task Environment")
    env.plane.stats.add(metadata_id=env.stat_id("profile_start_time"), uint64_value=BASE_NS)
    host = PlaneBuilder(space, "/host:CPU")
    line = host.line("python", line_id=5, timestamp_ns=1_000)  # relative to the start
    host.event(line, "train", 0, 100, step_num=1)
    host.event(line, "load", 10, 30)
    # Overlaps both steps: 10 ns inside step 1, 50 between the steps, and step 2 begins
    # inside it (the split rule: 20 ns of step 2 under it, the rest at the top).
    host.event(line, "other", 90, 80)
    host.event(line, "train", 150, 100, step_num=2)
    return Capture.from_space(space), [
        StepWindow(BASE_NS + 1_000, BASE_NS + 1_100, 1),
        StepWindow(BASE_NS + 1_150, BASE_NS + 1_250, 2),
    ]


def test_host_step_annotations_give_windows_in_epoch_ns() -> None:
    capture, expected = _two_window_plane()
    windows, source = step_windows(capture)
    assert source == "host_step_annotations"
    assert windows == expected


def test_an_event_across_windows_is_split_by_overlap() -> None:
    capture, windows = _two_window_plane()
    first, second = windowed_flamegraphs(capture, "host", windows)
    assert _frames(first) == {
        (("python", "", 0), ("train", "", 0)): 60,
        (("python", "", 0), ("train", "", 0), ("load", "", 0)): 30,
        (("python", "", 0), ("train", "", 0), ("other", "", 0)): 10,
    }
    assert _frames(second) == {
        (("python", "", 0), ("other", "", 0), ("train", "", 0)): 20,
        (("python", "", 0), ("train", "", 0)): 80,
    }
    # What lies between the windows (50 ns of "other") is in neither.
    host = host_flamegraph(capture)
    assert host is not None
    assert host.root.total - first.root.total - second.root.total == 50


def test_no_step_markers() -> None:
    space = xplane_pb2.XSpace()
    host = PlaneBuilder(space, "/host:CPU")
    host.event(host.line("python"), "work", 0, 10)
    capture = Capture.from_space(space)
    assert step_windows(capture) == ([], "none")
    assert windowed_flamegraphs(capture, "device", [StepWindow(0, 10, None)])[0].root.total == 0


def test_overlapping_windows_are_refused() -> None:
    capture, _ = _two_window_plane()
    with pytest.raises(ValueError, match="must not overlap"):
        windowed_flamegraphs(capture, "host", [StepWindow(0, 10, 1), StepWindow(5, 20, 2)])


def test_the_windows_total_is_the_whole_graph_read_in_the_same_pass() -> None:
    from tests.unit.test_tree_graphs import shape

    synthetic = tpu_capture(devices=2, steps=5, ops_per_step=60, distinct_ops=15, while_every=6)
    capture = Capture.from_space(synthetic.space)
    start, duration = capture.time_range()
    windows, _ = step_windows(capture)
    # Step to step, and what lies before the first and after the last (as a compare reads).
    starts = [-(1 << 62)] + [w.start_ns for w in windows] + [1 << 62]
    edges = [StepWindow(a, b, None) for a, b in itertools.pairwise(starts)]
    for kind, whole in (("device", device_flamegraph(capture)), ("host", host_flamegraph(capture))):
        assert whole is not None
        *parts, total = windowed_flamegraphs(capture, kind, edges, total=True)  # type: ignore[arg-type]
        assert len(parts) == len(edges)
        # The same graph as the whole-capture reader's, frames in the same order too.
        assert shape(total) == shape(whole)
        assert (total.time_nanos, total.duration_nanos) == (start, duration)
        assert _summed(parts) == _frames(whole)
    # No windows: the total is an empty graph of the capture.
    [empty] = windowed_flamegraphs(capture, "device", [], total=True)
    assert empty.root.total == 0 and empty.time_nanos == start


def test_whole_and_sampled_windows_in_one_pass_match_two_passes() -> None:
    from exporter.profiles.steps import whole_and_windowed_flamegraphs
    from tests.unit.test_tree_graphs import shape

    synthetic = tpu_capture(devices=2, steps=9, ops_per_step=60, distinct_ops=15, while_every=6)
    capture = Capture.from_space(synthetic.space)
    windows, _ = step_windows(capture)
    sampled = windows[::3]  # gaps between them, as sample_cycles leaves on long captures
    for kind, reader in (("device", device_flamegraph), ("host", host_flamegraph)):
        whole, parts = whole_and_windowed_flamegraphs(capture, kind, sampled)  # type: ignore[arg-type]
        assert shape(whole) == shape(reader(capture))  # type: ignore[arg-type]
        alone = windowed_flamegraphs(capture, kind, sampled)  # type: ignore[arg-type]
        assert len(parts) == len(alone) == len(sampled)
        for part, single, window in zip(parts, alone, sampled, strict=True):
            assert (part.time_nanos, part.duration_nanos) == (single.time_nanos,
                                                              single.duration_nanos)  # fmt: skip
            ours, theirs = _frames(part), _frames(single)
            assert ours.keys() == theirs.keys()
            # Rounded as running sums over more windows: 1 ns apart at most.
            assert all(abs(ours[k] - theirs[k]) <= 1 for k in ours)
            assert part.duration_nanos == window.end_ns - window.start_ns


def test_keep_marks_one_window_each() -> None:
    capture, windows = _two_window_plane()
    [second] = windowed_flamegraphs(capture, "host", windows, keep=[False, True])
    assert second.time_nanos == windows[1].start_ns
    with pytest.raises(ValueError, match="1 marks for 2 windows"):
        windowed_flamegraphs(capture, "host", windows, keep=[True])


def _encoded_steps_capture() -> Capture:
    """Host step annotations whose step_num comes in every encoding protobuf allows."""
    space = xplane_pb2.XSpace()
    env = PlaneBuilder(space, "Task Environment")
    env.plane.stats.add(metadata_id=env.stat_id("profile_start_time"), uint64_value=BASE_NS)
    host = PlaneBuilder(space, "/host:CPU")
    step_id = host.stat_id("step_num")
    other_id = host.stat_id("other")
    encodings: list[dict[str, object]] = [
        {"int64_value": 3}, {"uint64_value": 4}, {"double_value": 5.0}, {"double_value": 5.5},
        {"str_value": "6"}, {"str_value": "-7"}, {"str_value": "x8"}, {"bytes_value": b"9"},
        {"ref_value": 10}, {}, {"uint64_value": (1 << 64) - 1}, {"ref_value": (1 << 64) - 2},
    ]  # fmt: skip
    for number, thread in enumerate(("python", "worker")):
        line = host.line(thread, line_id=number + 1, timestamp_ns=1_000 + number)
        for i, value in enumerate(encodings):
            meta = host.meta("train" if i % 2 else "step")
            for _ in range(30):  # other events between the steps, as a traced thread has
                line.events.add(metadata_id=host.meta("work"), offset_ps=i * 10**6,
                                duration_ps=10**5)  # fmt: skip
            event = line.events.add(metadata_id=meta, offset_ps=i * 10**6 + 7, duration_ps=9**5)
            event.stats.add(metadata_id=other_id, int64_value=1)
            event.stats.add(metadata_id=step_id, **value)  # type: ignore[arg-type]
        zero = line.events.add(metadata_id=host.meta("train"), offset_ps=5, duration_ps=0)
        zero.stats.add(metadata_id=step_id, int64_value=99)  # no duration: not a step
        # A step_num given twice (the fuzz tests made one): both decoders take the last,
        # as the GPU readers take a repeated stat's last.
        twice = line.events.add(metadata_id=host.meta("step"), offset_ps=20 * 10**6,
                                duration_ps=9**5)  # fmt: skip
        twice.stats.add(metadata_id=step_id, double_value=-2.5e150)
        twice.stats.add(metadata_id=step_id, int64_value=12)
    return Capture.from_space(space)


@pytest.mark.parametrize("which", ["synthetic", "tpu"])
def test_host_steps_from_columns_are_the_event_by_event_reading(which: str) -> None:
    from exporter.profiles.xspace import compiled_core, use_decoder

    assert compiled_core() is not None, "exporter.profiles._xwire was not built"
    if which == "synthetic":
        capture = _encoded_steps_capture()
    else:  # host step annotations beside device steps: read for their names
        capture = Capture.from_space(tpu_capture(devices=1, steps=3, ops_per_step=20).space)
    found = {}
    for decoder in ("compiled", "python"):
        with use_decoder(decoder):
            names: set[str] = set()
            found[decoder] = (step_windows(capture, names), names)
    assert found["compiled"] == found["python"]
    if which == "synthetic":
        (windows, source), names = found["compiled"]
        assert source == "host_step_annotations" and names == {"step", "train"}
        numbered = sorted({w.step for w in windows if w.step is not None})
        assert numbered == [-7, 0, 3, 4, 5, 6, 10, 12, (1 << 64) - 2, (1 << 64) - 1]
