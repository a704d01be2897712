"""XProf captures -> device and host flame graphs, on synthetic TPU-shaped captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.errors import InputError
from exporter.profiles.convert import flamegraph_from_path
from exporter.profiles.pprof import from_pprof, to_pprof
from exporter.profiles.xplane import (
    Capture,
    device_flamegraph,
    host_flamegraph,
    load_capture,
    parse_xspace,
)
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture, write_tpu_capture
from tests.xspace_builder import PlaneBuilder


def _leaves(graph: object) -> dict[tuple[str, ...], int]:
    return {
        tuple(f.name for f in (*ancestors, node)): node.self_value
        for ancestors, node in graph.paths()  # type: ignore[attr-defined]
        if node.self_value
    }


def test_device_flamegraph_has_expected_op_totals(tmp_path: Path) -> None:
    path = tmp_path / "tpu-vm-0.xplane.pb"
    synthetic = write_tpu_capture(path, devices=2, steps=3, ops_per_step=700, distinct_ops=120)
    graph = device_flamegraph(load_capture(path))
    assert graph is not None
    graph.check()
    assert (graph.sample_type, graph.unit, graph.profile_name) == (
        "device_time",
        "nanoseconds",
        "device",
    )
    assert _leaves(graph) == synthetic.expected_device_ns
    # program > framework name scope > op category > HLO op
    some_path = next(iter(synthetic.expected_device_ns))
    assert some_path[0] == "jit_train_step"
    assert some_path[-2] in {"convolution fusion", "loop fusion", "all-reduce", "convolution",
                             "output fusion", "data formatting", "non-fusion elementwise",
                             "custom-call"}  # fmt: skip
    assert graph.root.total == sum(synthetic.expected_device_ns.values())
    assert graph.time_nanos > 0


def test_device_programs_found_by_time_containment() -> None:
    """Ops whose metadata do not name their program are placed by the XLA Modules line."""
    synthetic = tpu_capture(devices=1, steps=2, ops_per_step=50, distinct_ops=16, host=False)
    for plane in synthetic.space.planes:
        for meta in plane.event_metadata.values():
            keep = [
                s for s in meta.stats if plane.stat_metadata[s.metadata_id].name != "program_id"
            ]
            if meta.name.startswith(("fusion", "copy", "all-reduce", "convolution", "multiply",
                                     "custom-call")):  # fmt: skip
                del meta.stats[:]
                meta.stats.extend(keep)
    graph = device_flamegraph(Capture.from_space(synthetic.space))
    assert graph is not None
    assert _leaves(graph) == synthetic.expected_device_ns


def test_host_flamegraph_stacks_by_containment() -> None:
    synthetic = tpu_capture(devices=1, steps=4, ops_per_step=10)
    graph = host_flamegraph(Capture.from_space(synthetic.space))
    assert graph is not None
    graph.check()
    assert graph.find(list(synthetic.expected_host_frames)) is not None
    step = graph.find(["python", "main", "train_step", "train"])
    assert step is not None
    call = step.named("__call__")
    assert call is not None
    assert {c.name for c in call.children.values()} == {"cache_miss", "PjitFunction(train_step)"}
    assert call.self_value == 4 * (400_000 - 100_000 - 50_000)
    assert graph.find(["tf_XLACpuClient", "ThunkExecutor > Execute"]) is not None
    train_step = graph.find(["python", "main", "train_step"])
    assert train_step is not None and train_step.file == "train.py" and train_step.line == 61


def test_overlapping_events_never_make_negative_self() -> None:
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    for i, name in enumerate(["outer", "a", "b"], 1):
        plane.event_metadata[i].id = i
        plane.event_metadata[i].name = name
    line = plane.lines.add(id=1, name="worker/77")
    line.events.add(metadata_id=1, offset_ps=0, duration_ps=10_000)
    line.events.add(metadata_id=2, offset_ps=1_000, duration_ps=6_000)
    line.events.add(metadata_id=3, offset_ps=5_000, duration_ps=4_000)  # overlaps a
    graph = host_flamegraph(Capture.from_space(space))
    assert graph is not None
    graph.check()
    assert graph.find(["worker"]).total == 10  # type: ignore[union-attr]
    assert graph.find(["worker", "outer", "b"]).total == 2  # type: ignore[union-attr]


def test_cpu_capture_without_device_planes(tmp_path: Path) -> None:
    space = tpu_capture(devices=0, steps=2).space
    path = tmp_path / "cpu.xplane.pb"
    path.write_bytes(space.SerializeToString())
    assert device_flamegraph(load_capture(path)) is None
    with pytest.raises(InputError, match=r"cpu\.xplane\.pb: no device planes .*--kind host"):
        flamegraph_from_path(path, "device")
    assert flamegraph_from_path(path, None).sample_type == "wall"


def test_capture_with_neither_device_nor_host(tmp_path: Path) -> None:
    space = xplane_pb2.XSpace()
    space.planes.add(name="/host:metadata")
    path = tmp_path / "empty.xplane.pb"
    path.write_bytes(space.SerializeToString())
    with pytest.raises(InputError, match=r"empty\.xplane\.pb: nothing to convert.*/host:metadata"):
        flamegraph_from_path(path)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b"this is not a capture", "not an XProf capture"),
        (lambda b: b"", "empty file"),
        (lambda b: b[:3], "truncated"),
    ],
)
def test_bad_files_name_the_file(tmp_path: Path, mutate: object, message: str) -> None:
    good = tpu_capture(devices=1, steps=1, ops_per_step=20).space.SerializeToString()
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(mutate(good))  # type: ignore[operator]
    with pytest.raises(InputError, match=rf"bad\.xplane\.pb.*{message}"):
        flamegraph_from_path(path)


def test_corrupt_line_is_an_input_error() -> None:
    synthetic = tpu_capture(devices=1, steps=1, ops_per_step=20, host=False)
    line = synthetic.space.planes[0].lines[2]
    # A line whose events field holds bytes that are not an XEvent: the XSpace framing
    # still parses, the line does not.
    bad = xplane_pb2.XPlaneByLine()
    bad.ParseFromString(synthetic.space.planes[0].SerializeToString())
    bad.lines[2] = line.SerializeToString()[:5] + b"\x22\x05\xff\xff\xff\xff\xff"
    space = xplane_pb2.XSpaceByLine()
    space.planes.add().CopyFrom(bad)
    with pytest.raises(InputError, match="<memory>: corrupt XProf capture"):
        device_flamegraph(parse_xspace(space.SerializeToString(), "<memory>"))


def test_synthetic_capture_scales() -> None:
    synthetic = tpu_capture(devices=2, steps=5, ops_per_step=2000)
    assert synthetic.event_count >= 20_000
    names = [p.name for p in synthetic.space.planes]
    assert names[:3] == ["/host:CPU", "/device:TPU:0", "/device:TPU:1"]
    lines = [line.name for line in synthetic.space.planes[1].lines]
    assert lines == ["Steps", "XLA Modules", "XLA Ops"]
    stats = {m.name for m in synthetic.space.planes[1].stat_metadata.values()}
    assert {"hlo_category", "tf_op", "program_id", "flops", "bytes_accessed"} <= stats


def test_capture_without_task_environment_is_stamped_from_its_lines() -> None:
    space = tpu_capture(devices=1, steps=2, ops_per_step=20, distinct_ops=8).space
    (env,) = [p for p in space.planes if p.name == "Task Environment"]
    names = {m.id: m.name for m in env.stat_metadata.values()}
    start_ns = next(
        s.uint64_value for s in env.stats if names[s.metadata_id] == "profile_start_time"
    )
    space.planes.remove(env)
    for plane in space.planes:
        for line in plane.lines:
            line.duration_ps = 5_000_000_000  # 5 ms
    capture = Capture.from_space(space)
    for graph in (device_flamegraph(capture), host_flamegraph(capture)):
        assert graph is not None
        assert (graph.time_nanos, graph.duration_nanos) == (start_ns, 5_000_000)


def _device_space() -> tuple[xplane_pb2.XSpace, PlaneBuilder]:
    space = xplane_pb2.XSpace()
    return space, PlaneBuilder(space, "/device:TPU:0")


def test_nested_device_ops_count_their_time_once() -> None:
    # 3 x (copy 100 us + while 1000 us holding fusions of 300 us and 400 us).
    space, tpu = _device_space()
    ops = tpu.line("XLA Ops")
    op = {
        name: tpu.meta(name, hlo_category=category, program_id=1, tf_op=scope)
        for name, category, scope in [
            ("copy.1", "data formatting", "jit(f)/copy"),
            ("while.2", "control flow", "jit(f)/while"),
            ("fusion.3", "loop fusion", "jit(f)/while/body/add"),
            ("fusion.4", "loop fusion", "jit(f)/while/body/mul"),
        ]
    }
    modules = tpu.line("XLA Modules")
    module = tpu.meta("jit_f(1)", program_id=1)
    for i in range(3):
        t = i * 2000_000
        tpu.event(modules, module, t, 1100_000)
        tpu.event(ops, op["copy.1"], t, 100_000)
        tpu.event(ops, op["while.2"], t + 100_000, 1000_000)
        tpu.event(ops, op["fusion.3"], t + 150_000, 300_000)
        tpu.event(ops, op["fusion.4"], t + 500_000, 400_000)
    graph = device_flamegraph(Capture.from_space(space))
    assert graph is not None
    graph.check()
    assert graph.root.total == 3 * 1100_000  # 3.3 ms, as XProf's op_profile counts it
    loop = graph.find(["jit_f", "jit(f)", "while", "control flow", "while.2"])
    assert loop is not None
    assert loop.self_value == 3 * 300_000 and loop.total == 3 * 1000_000
    body = graph.find([*["jit_f", "jit(f)", "while", "control flow", "while.2"], "body"])
    assert body is not None and body.total == 3 * 700_000
    assert _leaves(graph)[
        ("jit_f", "jit(f)", "while", "control flow", "while.2", "body", "mul", "loop fusion",
         "fusion.4")
    ] == 3 * 400_000  # fmt: skip


def _host_space() -> tuple[xplane_pb2.XSpace, PlaneBuilder]:
    space = xplane_pb2.XSpace()
    return space, PlaneBuilder(space, "/host:CPU")


def test_partly_overlapping_host_events_keep_all_their_time() -> None:
    space, host = _host_space()
    line = host.line("worker")
    host.event(line, "outer", 0, 100)
    host.event(line, "a", 10, 50)  # [10, 60)
    host.event(line, "b", 40, 60)  # [40, 100): begins inside a, outlives it
    host.event(line, "c", 45, 10)  # [45, 55): wholly inside a and b
    graph = host_flamegraph(Capture.from_space(space))
    assert graph is not None
    graph.check()
    totals: dict[str, int] = {}
    for _ancestors, node in graph.paths():
        totals[node.name] = totals.get(node.name, 0) + node.self_value
    assert graph.find(["worker"]).total == 100  # type: ignore[union-attr]  # busy time
    # Every event's duration is under its own name (self + what is nested in it).
    assert graph.find(["worker", "outer", "a", "b", "c"]).self_value == 10  # type: ignore[union-attr]
    assert graph.find(["worker", "outer", "a", "b"]).total == 20  # type: ignore[union-attr]
    assert graph.find(["worker", "outer", "b"]).total == 40  # type: ignore[union-attr]
    assert graph.find(["worker", "outer", "a"]).total == 50  # type: ignore[union-attr]
    assert totals == {"worker": 0, "outer": 10, "a": 30, "b": 50, "c": 10}


def test_threads_of_one_name_stay_apart_by_thread_id() -> None:
    space, host = _host_space()
    for tid, events in ((4242, 1), (4343, 2)):
        line = host.line("python", line_id=tid)
        for i in range(events):
            host.event(line, "work", 100 * i, 30)
    for tid in (1, 2):  # pool threads fold into one frame per pool
        host.event(host.line(f"tf_XLAEigen/{tid}", line_id=100 + tid), "task", 0, 5)
    host.event(host.line("main", line_id=9), "work", 0, 1)
    graph = host_flamegraph(Capture.from_space(space))
    assert graph is not None
    roots = {c.name: c.total for c in graph.root.children.values()}
    assert roots == {"python #1": 60, "python #2": 30, "tf_XLAEigen": 10, "main": 1}


def _two_python_threads(ids: tuple[int, int], busy_first: bool) -> xplane_pb2.XSpace:
    """A capture of one workload: a busy main thread and a quiet loader, both "python"."""
    space, host = _host_space()
    busy = [("train_step", 10 * i, 8) for i in range(5)]
    quiet = [("load_batch", 3, 2)]
    order = [(ids[0], busy), (ids[1], quiet)] if busy_first else [(ids[1], quiet), (ids[0], busy)]
    for line_id, events in order:
        line = host.line("python", line_id=line_id)
        for name, start, duration in events:
            host.event(line, name, start, duration)
    return space


def test_thread_labels_are_short_and_align_across_processes() -> None:
    # Two processes of one workload: XProf's line ids (hashes) differ, and so may the
    # order of the lines in the plane.
    first = host_flamegraph(
        Capture.from_space(_two_python_threads((5701004968990778314, -4853628515483876563), True))
    )
    second = host_flamegraph(
        Capture.from_space(_two_python_threads((-2328719687163744847, 3712231681065321896), False))
    )
    assert first is not None and second is not None
    for graph in (first, second):
        names = {
            c.name: sorted(g.name for g in c.children.values())
            for c in graph.root.children.values()
        }
        assert names == {"python #1": ["train_step"], "python #2": ["load_batch"]}
        assert not any("tid" in name or "-" in name for name in names)
    # The raw ids stay in the graph and its pprof, beside the label they became.
    assert first.comments == [
        "thread python #1: XLine id 5701004968990778314",
        "thread python #2: XLine id -4853628515483876563",
    ]
    profile = to_pprof(first)
    assert [profile.string_table[i] for i in profile.comment] == first.comments
    assert from_pprof(profile, profile_name="wall").comments == first.comments


def test_a_traceme_inside_one_of_the_same_name_folds() -> None:
    space, host = _host_space()
    line = host.line("python")
    host.event(line, "$train.py:10 update", 0, 100)
    host.event(line, "PjitFunction(update)", 5, 90)
    host.event(line, "PjitFunction(update)", 6, 88)
    host.event(line, "Execute", 10, 50)
    host.event(line, "$lib.py:3 f", 60, 20)  # Python recursion keeps its frames
    host.event(line, "$lib.py:3 f", 61, 10)
    graph = host_flamegraph(Capture.from_space(space))
    assert graph is not None
    pjit = graph.find(["python", "update", "PjitFunction(update)"])
    assert pjit is not None and pjit.total == 90
    assert {c.name for c in pjit.children.values()} == {"Execute", "f"}
    assert graph.find(["python", "update", "PjitFunction(update)", "f", "f"]) is not None


def test_gpu_kernels_stack_program_scope_op_kernel() -> None:
    space = xplane_pb2.XSpace()
    gpu = PlaneBuilder(space, "/device:GPU:0")
    stream = gpu.line("Stream #14(Compute)")
    other = gpu.line("Stream #15(MemcpyH2D)")
    dot = {"hlo_module": "jit_train_step(123)", "hlo_op": "dot.7"}
    dot["tf_op"] = "jit(train_step)/mlp/dot_general"
    add = {"hlo_module": "jit_train_step(123)", "hlo_op": "fusion.2"}
    add["tf_op"] = "jit(train_step)/mlp/add"
    gpu.event(stream, "sm90_gemm_bf16_kernel", 0, 50, **dot)
    gpu.event(stream, "sm90_gemm_bf16_kernel", 100, 30, **dot)
    gpu.event(stream, "loop_add_fusion", 200, 10, **add)
    gpu.event(other, "MemcpyH2D", 0, 5)  # no HLO stats: kept under the unknown program
    graph = device_flamegraph(Capture.from_space(space))
    assert graph is not None
    program = ("jit_train_step", "jit(train_step)", "mlp")
    assert _leaves(graph) == {
        (*program, "dot_general", "dot.7", "sm90_gemm_bf16_kernel"): 80,
        (*program, "add", "fusion.2", "loop_add_fusion"): 10,
        ("<unknown program>", "MemcpyH2D"): 5,
    }
