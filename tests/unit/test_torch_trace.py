"""torch.profiler traces read as captures: hand-built Kineto JSON (GPU-shaped, no GPU)."""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.cli import main
from exporter.errors import InputError
from exporter.profiles import torch_trace
from exporter.profiles.convert import flamegraph_from_path
from exporter.profiles.frames import FrameLabel
from exporter.profiles.torch_trace import (
    host_label,
    is_torch_trace,
    load_torch_trace,
    step_windows,
    windowed_graphs,
)
from tests import kineto_traces as kt

SGEMM = "ampere_sgemm_128x64_nn"
RELU = "void at::native::vectorized_elementwise_kernel<4, relu>"
MEMCPY = "Memcpy HtoD (Pageable -> Device)"


def steps(count: int, extra: bool = False) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for step in range(count):
        t = 200.0 * step
        events += kt.training_step(step + 1, t, 10 * step + 1)
        if extra:  # new work: an op launching its own kernel inside the step
            events += [
                kt.complete("cpu_op", "aten::cumsum", t + 88, 2.0),
                kt.launch(t + 88.5, 1.0, 10 * step + 5),
                kt.kernel("cumsum_kernel", t + 96, 40.0, 10 * step + 5),
            ]
    return events


def folded(graph: object) -> dict[str, int]:
    return {
        line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1])
        for line in graph.to_folded().splitlines()  # type: ignore[attr-defined]
    }


def test_the_cli_draws_a_trace_that_was_refused_as_not_an_xprof_capture(tmp_path: Path) -> None:
    # Before: "not an XProf capture (field 4 at byte 0 has wire type 0...)".
    path = kt.write(tmp_path / "trace.pt.trace.json", steps(1))
    done = CliRunner().invoke(main, ["flamegraph", str(path)])
    assert done.exit_code == 0, done.output
    lines = set(done.output.splitlines())
    assert f"GPU 0;stream 7;ProfilerStep;train_step;aten::mm;{SGEMM} 25000" in lines
    assert f"GPU 0;stream 7;ProfilerStep;train_step;aten::relu;{RELU} 6000" in lines
    assert f"GPU 0;stream 8;ProfilerStep;train_step;aten::copy_;{MEMCPY} 2500" in lines


def test_detected_by_content_not_by_name_plain_and_gzipped(tmp_path: Path) -> None:
    plain = kt.write(tmp_path / "capture.bin", steps(1))
    packed = kt.write(tmp_path / "trace.json.gz", steps(1), gz=True)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schemaVersion": 1, "events": []}))
    assert is_torch_trace(plain) and is_torch_trace(packed)
    assert not is_torch_trace(other) and not is_torch_trace(tmp_path)
    assert folded(flamegraph_from_path(plain)) == folded(flamegraph_from_path(packed))


def test_kernel_totals_equal_the_traces_own_durations_per_name(tmp_path: Path) -> None:
    # HTA's kernel breakdown is the sum of "dur" per kernel name: summed here from the
    # JSON itself, apart from the reader.
    path = kt.write(tmp_path / "t.pt.trace.json", steps(5, extra=True))
    expected: dict[str, int] = defaultdict(int)
    for event in json.loads(path.read_text())["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            expected[event["name"]] += round(event["dur"] * 1000)
    graph = flamegraph_from_path(path, "device")
    got: dict[str, int] = defaultdict(int)
    for _stack, frame in graph.paths():
        if not frame.children:
            got[frame.name] += frame.self_value
    assert got == expected
    assert graph.root.total == sum(expected.values())


def test_a_kernel_linked_by_flow_events_alone_goes_under_its_launching_op(tmp_path: Path) -> None:
    events = [
        kt.complete("cpu_op", "aten::mm", 10, 30),
        kt.complete("cuda_runtime", "cudaLaunchKernel", 20, 5),  # no correlation arg
        kt.kernel(SGEMM, 60, 25, None),
        kt.flow("s", 99, 20, pid=kt.PID, tid=kt.TID),
        kt.flow("f", 99, 60, pid=0, tid=7),
        kt.kernel("orphan_kernel", 90, 5, None, stream=9),  # no link at all
    ]
    graph = flamegraph_from_path(kt.write(tmp_path / "t.json", events), "device")
    assert folded(graph) == {f"GPU 0;stream 7;aten::mm;{SGEMM}": 25000,
                             "GPU 0;stream 9;orphan_kernel": 5000}  # fmt: skip


def test_host_graph_self_and_total_per_thread(tmp_path: Path) -> None:
    graph = flamegraph_from_path(kt.write(tmp_path / "t.json", steps(1)), "host")
    step = graph.find(["python", "ProfilerStep"])
    assert step is not None and step.total == 100_000 and step.self_value == 10_000
    body = graph.find(["python", "ProfilerStep", "train_step"])
    assert body is not None and body.total == 90_000 and body.self_value == 30_000
    mm = graph.find(["python", "ProfilerStep", "train_step", "aten::mm"])
    assert mm is not None and mm.self_value == 25_000
    assert mm.children["cudaLaunchKernel", "", 0].total == 5_000
    assert body.key == ("train_step", "train.py", 12)
    graph.check()


def test_steps_and_each_kernel_in_the_step_that_launched_it(tmp_path: Path) -> None:
    events = steps(2)
    # Step 1's last kernel runs after step 1 ended, between the steps: still step 1's.
    events += [kt.launch(95, 1, 77), kt.kernel("late_kernel", 150, 10, 77)]
    trace = load_torch_trace(kt.write(tmp_path / "t.json", events))
    windows = step_windows(trace)
    assert [w.step for w in windows] == [1, 2]
    assert [w.end_ns - w.start_ns for w in windows] == [100_000, 100_000]
    first, second = windowed_graphs(trace, "device", windows)
    assert first.find(["GPU 0", "stream 7", "ProfilerStep", "late_kernel"]) is not None
    assert second.find(["GPU 0", "stream 7", "ProfilerStep", "late_kernel"]) is None
    assert first.root.total == 25_000 + 6_000 + 2_500 + 10_000
    host = windowed_graphs(trace, "host", windows)
    assert [g.root.total for g in host] == [100_000, 100_000]


def test_per_step_divides_device_time_by_the_profiler_steps(tmp_path: Path) -> None:
    path = kt.write(tmp_path / "t.json", steps(4))
    whole = flamegraph_from_path(path, "device")
    per_step = flamegraph_from_path(path, "device", per_step=True)
    assert per_step.root.total == pytest.approx(whole.root.total / 4, abs=4)


def test_memory_events_make_an_allocation_graph(tmp_path: Path) -> None:
    events = [
        kt.complete("cpu_op", "aten::empty", 10, 30),
        kt.memory(15, 4096, 0x1000),
        kt.memory(16, 1024, 0x2000),
        kt.memory(17, 1 << 20, 0x7F0000000000, device=0),
        kt.memory(50, -4096, 0x1000),  # a free: not an allocation
    ]
    graph = flamegraph_from_path(kt.write(tmp_path / "t.json", events), "memory")
    assert (graph.sample_type, graph.unit) == ("alloc_space", "bytes")
    assert folded(graph) == {"CPU;python;aten::empty": 5120, "GPU 0;python;aten::empty": 1 << 20}
    with pytest.raises(InputError, match="profile_memory=True"):
        flamegraph_from_path(kt.write(tmp_path / "n.json", steps(1)), "memory")


def test_compare_two_traces_gives_a_step_verdict_and_names_the_added_op(tmp_path: Path) -> None:
    base = kt.write(tmp_path / "base.pt.trace.json", steps(12))
    head = kt.write(tmp_path / "head.pt.trace.json.gz", steps(12, extra=True), gz=True)
    done = CliRunner().invoke(main, ["compare", str(base), str(head), "--format", "json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["base"]["source"] == "torch_trace" and report["base"]["steps"] == 12
    assert report["base"]["step_source"] == "host_step_annotations"
    assert report["step_verdict"]["base_median_ms"] == pytest.approx(0.2)
    added = [r for r in report["regressions"] if "cumsum" in json.dumps(r)]
    assert added, report["regressions"]


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("train.py(12): train_step", FrameLabel("train_step", "train.py", 12)),
        ("<built-in method relu of type object at 0x7ff4d82cea40>", FrameLabel("relu", "builtins")),
        ("<built-in method encode of str object at 0x7ff4b8c61250>",
         FrameLabel("str > encode", "builtins")),
        ("<built-in function isinstance>", FrameLabel("isinstance", "builtins")),
        ("<method 'append' of 'list' objects>", FrameLabel("list > append", "builtins")),
        ("nn.Module: Linear_0", FrameLabel("nn.Module: Linear_0")),
    ],
)  # fmt: skip
def test_python_frames_drop_addresses_so_runs_match(name: str, label: FrameLabel) -> None:
    assert host_label("python_function", name) == label


def test_op_frames_keep_torch_names() -> None:
    assert host_label("cpu_op", "aten::mm") == FrameLabel("aten::mm")
    assert host_label("user_annotation", "ProfilerStep#12") == FrameLabel("ProfilerStep")


# -- hostile traces: one line each, bounded -------------------------------------------------
HEAD = b'{"schemaVersion": 1, "traceEvents": '


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (HEAD + b'[{"ph": "X", "name": "aten::mm"', "not valid JSON"),
        (HEAD + b"[" * 200_000 + b"]" * 200_000 + b"}", "nests deeper"),
        (HEAD + b"5}", "no traceEvents list"),
    ],
)
def test_a_hostile_trace_gets_one_line(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "bad.pt.trace.json"
    path.write_bytes(data)
    done = CliRunner().invoke(main, ["flamegraph", str(path)])
    assert done.exit_code == 1
    assert expected in done.output and len(done.output.strip().splitlines()) == 1


def test_a_lone_surrogate_in_a_name_is_escaped(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    event = kt.complete("cpu_op", "aten::SURROGATE", 10, 30)
    path.write_text(json.dumps(kt.document([event])).replace("SURROGATE", "\\ud800"))
    graph = flamegraph_from_path(path, "host")
    assert folded(graph) == {"python;aten::\\ud800": 30_000}
    graph.to_folded().encode("utf-8")  # what a pprof or a page needs


def test_odd_events_are_skipped_not_fatal(tmp_path: Path) -> None:
    odd = [
        {"ph": "X", "cat": "cpu_op", "name": {"x": 1}, "pid": kt.PID, "tid": kt.TID, "ts": "1"},
        {"ph": "X", "cat": "cpu_op", "name": "aten::a", "pid": True, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::b", "pid": 1, "tid": 1, "ts": 1, "dur": -1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::c", "pid": 1, "tid": 1, "ts": 1e400, "dur": 1},
        "not an event",
        kt.complete("cpu_op", "aten::mm", 10, 30),
    ]
    graph = flamegraph_from_path(kt.write(tmp_path / "t.json", odd), "host")  # type: ignore[arg-type]
    assert folded(graph) == {"python;aten::mm": 30_000}


def test_too_many_objects_are_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_trace, "MAX_TRACE_OBJECTS", 50)
    path = kt.write(tmp_path / "t.json", steps(10))
    with pytest.raises(InputError, match="more than 50 JSON objects"):
        load_torch_trace(path)


def test_a_gzip_bomb_stops_at_the_byte_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_trace, "MAX_TRACE_BYTES", 1 << 20)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(HEAD + b"[" + b" " * (64 << 20) + b"]}"))
    assert path.stat().st_size < 1 << 20
    assert is_torch_trace(path)
    with pytest.raises(InputError, match=f"larger than {1 << 20} bytes"):
        load_torch_trace(path)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.pt.trace.json"
    os.mkfifo(fifo)
    assert not is_torch_trace(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_torch_trace(fifo)


def test_no_events_of_a_kind_is_one_line(tmp_path: Path) -> None:
    path = kt.write(tmp_path / "t.json", [kt.complete("cpu_op", "aten::mm", 10, 30)])
    with pytest.raises(InputError, match="no GPU kernels"):
        flamegraph_from_path(path, "device")
    with pytest.raises(InputError, match="--per-step needs GPU kernels"):
        flamegraph_from_path(path, None, per_step=True)
    empty = kt.write(tmp_path / "e.json", [])
    with pytest.raises(InputError, match="no host or GPU events"):
        flamegraph_from_path(empty)


def test_analyze_gives_the_steps_breakdown_and_top_kernels_of_a_trace(tmp_path: Path) -> None:
    # Before: "looks like JSON (a Chrome/Kineto trace?), not an XProf capture".
    events = steps(6)
    for step in range(6):  # torch's own DataLoader annotation, after the step's kernels
        events.append(
            kt.complete(
                "user_annotation",
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                200.0 * step + 110,
                20.0,
            )
        )
    path = kt.write(tmp_path / "t.pt.trace.json", events)
    done = CliRunner().invoke(main, ["analyze", str(path), "--no-xprof", "--format", "json"])
    assert done.exit_code == 0, done.output
    facts = json.loads(done.output)["facts"]
    assert facts["backend"] == "gpu"
    assert facts["steps"]["count"] == 6 and facts["steps"]["median_ms"] == pytest.approx(0.2)
    assert facts["steps"]["source"] == "host_step_annotations"
    # Kernels cover 25 + 6 + 2.5 µs of each step (the copy on its own stream does not
    # overlap them), the loader 20 µs; 5 cycles of 200 µs, the last one ends with its
    # step (100 µs), before its loader.
    assert facts["breakdown"]["xla_pct"] == pytest.approx(100 * 6 * 33.5 / 1100, abs=0.01)
    assert facts["breakdown"]["data_phase_pct"] == pytest.approx(100 * 5 * 20 / 1100, abs=0.01)
    assert facts["top_ops"][0]["name"] == SGEMM


def test_old_kineto_categories_and_string_thread_ids_read_alike(tmp_path: Path) -> None:
    # Kineto before 2022 (torch 1.8-1.10): "Operator", "Runtime", "Kernel", "Memcpy" and
    # thread ids as strings ("tid": "stream 7").
    renamed = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel",
               "gpu_memcpy": "Memcpy", "user_annotation": "Operator"}  # fmt: skip
    old = []
    for original in steps(2):
        event = dict(original)
        if event.get("ph") == "X":
            event["cat"] = renamed.get(str(event["cat"]), event["cat"])
            stream = event["pid"] != kt.PID
            event["tid"] = f"stream {event['tid']}" if stream else str(event["tid"])
        old.append(event)
    new_graph = flamegraph_from_path(kt.write(tmp_path / "new.json", steps(2)))
    old_graph = flamegraph_from_path(kt.write(tmp_path / "old.json", old))
    assert folded(old_graph) == folded(new_graph)
    assert [w.step for w in step_windows(load_torch_trace(tmp_path / "old.json"))] == [1, 2]


def test_a_gpu_trace_side_is_the_step_view_and_its_steps_add_up(tmp_path: Path) -> None:
    from exporter.analysis.sides.load import load_side

    path = kt.write(tmp_path / "t.json", steps(5, extra=True))
    side = load_side(str(path))
    assert (side.scope, side.kind, side.step_source) == ("step", "device", "host_step_annotations")
    assert list(side.whole.root.children) == [("GPU 0", "", 0), ("host", "", 0)]
    device = flamegraph_from_path(path, "device").root.total
    host = flamegraph_from_path(path, "host").root.total
    assert side.whole.root.total == device + host
    assert sum(g.root.total for g in side.steps) == device + host  # nothing outside the steps
    assert side.step_ns == [200_000] * 4 + [100_000]


def test_a_directory_of_traces_as_tensorboard_trace_handler_writes_them(tmp_path: Path) -> None:
    for side, extra in (("base", False), ("head", True)):
        (tmp_path / side / "nested").mkdir(parents=True)
        kt.write(tmp_path / side / "worker0.1700000000001.pt.trace.json", steps(6, extra))
        kt.write(tmp_path / side / "nested" / "worker1.1700000000002.pt.trace.json.gz",
                 steps(6, extra), gz=True)  # fmt: skip
        (tmp_path / side / "notes.json").write_text("{}")  # JSON, not a trace: ignored
    one = flamegraph_from_path(tmp_path / "base" / "worker0.1700000000001.pt.trace.json")
    both = flamegraph_from_path(tmp_path / "base")
    assert both.root.total == 2 * one.root.total
    done = CliRunner().invoke(
        main, ["compare", str(tmp_path / "base"), str(tmp_path / "head"), "--format", "json"]
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["base"]["steps"] == 12 and len(report["base"]["files"]) == 2
    assert any("cumsum" in json.dumps(r) for r in report["regressions"])
    done = CliRunner().invoke(
        main, ["analyze", str(tmp_path / "base"), "--no-xprof", "--format", "json"]
    )
    assert done.exit_code == 0, done.output
    facts = json.loads(done.output)["facts"]
    assert facts["steps"]["count"] == 12 and len(facts["hosts"]) == 2
