"""The flame graphs against independent references on the same files.

- XProf's own converters (``op_profile``, ``hlo_stats``) on device captures: synthetic
  TPU captures written the way real ones are, and a hand-made plane with nested ops.
- JAX's ``ProfileData`` on a real CPU capture: per-thread busy time and per-event time.
- The input pprof of a real JAX device-memory profile, and npm's ``pprof-format``
  decoder (no protobuf) on the pprof we write.

Each test's name says which reference it holds to. XProf writes cache files beside its
input, so it always gets a copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.frames import FrameLabel, label_native, parse_python_tracer
from exporter.profiles.memory import load_memory_profile
from exporter.profiles.pprof import decode_pprof, encode_pprof
from exporter.profiles.xplane import Capture, device_flamegraph, host_flamegraph, load_capture
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture
from tests.harness import ROOT, Proc, wait_until
from tests.xspace_builder import PlaneBuilder

pytestmark = pytest.mark.integration

JS = ROOT / "tests" / "js"
WORKLOAD = ROOT / "tests" / "integration" / "jax_reference_workload.py"
PS_PER_NS = 1000


# -- XProf ------------------------------------------------------------------------------
def _xprof(path: Path, tool: str, tmp: Path) -> Any:
    """XProf's ``tool`` on a copy of ``path`` (it writes caches beside its input)."""
    from xprof.convert import raw_to_tool_data

    copy = tmp / tool / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, copy)
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], tool, {"use_saved_result": False})
    return json.loads(data)


def _xprof_self_ns(path: Path, tmp: Path) -> dict[str, float]:
    """Per HLO op, XProf's total self time (ns) from ``hlo_stats``."""
    table = _xprof(path, "hlo_stats", tmp)
    cols = [c["id"] for c in table["cols"]]
    name, self_us = cols.index("hlo_op_name"), cols.index("total_self_time")
    out: dict[str, float] = defaultdict(float)
    for row in table["rows"]:
        out[row["c"][name]["v"]] += row["c"][self_us]["v"] * 1000
    return dict(out)


def _op_profile_total_ns(path: Path, tmp: Path) -> float:
    profile = _xprof(path, "op_profile", tmp)
    return float(profile["byProgramExcludeIdle"]["metrics"]["rawTime"]) / PS_PER_NS


def _self_by_op(graph: FlameGraph, ops: set[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for _, node in graph.paths():
        if node.name in ops:
            out[node.name] += node.self_value
    return dict(out)


@pytest.fixture(scope="module")
def nested_tpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic 2-chip TPU capture whose steps run while loops with nested bodies."""
    path = tmp_path_factory.mktemp("tpu") / "tpu-vm-0.xplane.pb"
    synthetic = tpu_capture(
        devices=2, steps=4, ops_per_step=300, distinct_ops=40, while_every=25, while_body=6
    )
    path.write_bytes(synthetic.space.SerializeToString())
    return path


def test_device_total_equals_xprof_op_profile_total(nested_tpu: Path, tmp_path: Path) -> None:
    graph = device_flamegraph(load_capture(nested_tpu))
    assert graph is not None
    assert graph.root.total == pytest.approx(_op_profile_total_ns(nested_tpu, tmp_path), abs=1)


def test_per_op_self_time_matches_xprof_hlo_stats(nested_tpu: Path, tmp_path: Path) -> None:
    reference = _xprof_self_ns(nested_tpu, tmp_path)
    graph = device_flamegraph(load_capture(nested_tpu))
    assert graph is not None
    ours = _self_by_op(graph, set(reference))
    assert set(ours) == set(reference)
    assert "while.loop" in ours  # the while's self time excludes its body
    for op, ns in reference.items():
        assert ours[op] == pytest.approx(ns, rel=0.01), op


def test_nested_ops_of_the_issue_match_xprof_op_profile_and_hlo_stats(tmp_path: Path) -> None:
    # 3 x (copy 100 us + while 1000 us holding fusions of 300 us and 400 us): XProf
    # counts 3.3 ms of device time and 0.9 ms of self time for the while.
    space = xplane_pb2.XSpace()
    tpu = PlaneBuilder(space, "/device:TPU:0")
    ops = tpu.line("XLA Ops")
    meta = {
        name: tpu.meta(name, program_id=7, symbol_id=i + 1, hlo_category=cat, tf_op=scope)
        for i, (name, cat, scope) in enumerate(
            [
                ("copy.1", "data formatting", "jit(f)/copy"),
                ("while.2", "control flow", "jit(f)/while"),
                ("fusion.3", "loop fusion", "jit(f)/while/body/add"),
                ("fusion.4", "loop fusion", "jit(f)/while/body/mul"),
            ]
        )
    }
    for i in range(3):
        t = i * 2_000_000
        tpu.event(ops, meta["copy.1"], t, 100_000)
        tpu.event(ops, meta["while.2"], t + 100_000, 1_000_000)
        tpu.event(ops, meta["fusion.3"], t + 150_000, 300_000)
        tpu.event(ops, meta["fusion.4"], t + 500_000, 400_000)
    path = tmp_path / "nested.xplane.pb"
    path.write_bytes(space.SerializeToString())
    graph = device_flamegraph(load_capture(path))
    assert graph is not None
    assert graph.root.total == 3_300_000 == _op_profile_total_ns(path, tmp_path)
    reference = _xprof_self_ns(path, tmp_path)
    assert reference["while.2"] == 900_000
    assert _self_by_op(graph, set(reference)) == pytest.approx(reference)


# -- JAX ProfileData on a real CPU capture -------------------------------------------------
@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real JAX CPU capture and memory profile (see jax_reference_workload.py)."""
    out = tmp_path_factory.mktemp("jax-ref")
    proc = Proc.python(
        [str(WORKLOAD), str(out)], out / "workload.log", env={"PYTHONPATH": str(ROOT)}
    )
    try:
        wait_until(
            lambda: (
                "READY" in proc.output()
                or (None if proc.alive() else pytest.fail(f"workload died:\n{proc.output()}"))
            ),
            timeout=120,
            what="the JAX reference workload",
        )
        yield out
    finally:
        proc.stop()


def _capture(out: Path) -> Path:
    (path,) = out.glob("logs/plugins/profile/*/*.xplane.pb")
    return path


def _union(spans: list[tuple[float, float]]) -> float:
    busy, last = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > last:
            busy += end - max(start, last)
            last = end
    return busy


def _label(name: str) -> tuple[str, str, int]:
    label = parse_python_tracer(name) or label_native(name)
    return (label.name, label.file, label.line)


def _reference_threads(path: Path) -> list[tuple[str, float, dict[tuple[str, str, int], float]]]:
    """Per host thread (pools joined): name, busy ns, and per frame label the ns during
    which an event of that label is open, from ProfileData. Each line's time is the
    union of its events; a pool's lines (``name/<id>``) are threads that may run at the
    same time (on a loaded machine they do), so their times add up, as a flame graph
    sums threads."""
    from jax.profiler import ProfileData

    threads: dict[str, list[list[tuple[str, float, float]]]] = defaultdict(list)
    order: list[str] = []
    data = ProfileData.from_file(str(path))
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for number, line in enumerate(plane.lines):
            base, _, pool_id = line.name.rpartition("/")
            key = base if base and pool_id.lstrip("-").isdigit() else f"{line.name}#{number}"
            if key not in threads:
                order.append(key)
            threads[key].append(
                [(e.name, e.start_ns, e.end_ns) for e in line.events if e.duration_ns > 0]
            )
    out = []
    for key in order:
        busy = 0.0
        per_label: dict[tuple[str, str, int], float] = defaultdict(float)
        for events in threads[key]:
            busy += _union([(s, e) for _, s, e in events])
            by_label: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
            for name, start, end in events:
                by_label[_label(name)].append((start, end))
            for label, spans in by_label.items():
                per_label[label] += _union(spans)
        out.append((key.split("#")[0], busy, dict(per_label)))
    return out


def _outermost(thread: Frame) -> dict[tuple[str, str, int], int]:
    """Per frame identity, the total of its frames that have no same-identity ancestor."""
    out: dict[tuple[str, str, int], int] = defaultdict(int)
    stack: list[tuple[Frame, frozenset[tuple[str, str, int]]]] = [(thread, frozenset())]
    while stack:
        node, above = stack.pop()
        for child in node.children.values():
            if child.key not in above:
                out[child.key] += child.total
            stack.append((child, above | {child.key}))
    return dict(out)


def test_host_thread_busy_time_and_event_time_equal_jax_profile_data(real: Path) -> None:
    reference = _reference_threads(_capture(real))
    graph = host_flamegraph(load_capture(_capture(real)))
    assert graph is not None
    graph.check()
    ours = [
        (frame.name.split(" #")[0], frame.total, _outermost(frame))
        for frame in graph.root.children.values()
    ]
    # Python threads share the name "python": one frame each, matched as a multiset.
    assert sorted(name for name, _, _ in ours) == sorted(name for name, _, _ in reference)
    assert sum(name == "python" for name, _, _ in ours) >= 3
    assert sorted((n, t) for n, t, _ in ours) == sorted((n, round(t)) for n, t, _ in reference)
    for name, total, frames in ours:
        match = [r for r in reference if r[0] == name and round(r[1]) == total]
        assert match, name
        expected = {k: round(v) for k, v in match[0][2].items()}
        assert frames == expected, name
    # The step annotation keeps all its time (it used to lose its head to an overlap).
    train = sum(f.get(("train", "", 0), 0) for _, _, f in ours)
    assert train == round(sum(r[2].get(("train", "", 0), 0) for r in reference)) > 0


# -- pprof: the input file, and npm's decoder on what we write -----------------------------
def _pprof_frames(profile: Any, index: int) -> dict[tuple[str, str, int], int]:
    """Per function identity (name, file, start line): the sum of the samples holding it."""
    table = profile.string_table
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    out: dict[tuple[str, str, int], int] = defaultdict(int)
    for sample in profile.sample:
        seen = set()
        for loc_id in sample.location_id:
            for line in locations[loc_id].line:
                fn = functions[line.function_id]
                key = (table[fn.name], table[fn.filename], fn.start_line)
                if key not in seen:
                    seen.add(key)
                    out[key] += sample.value[index]
    return {k: v for k, v in out.items() if v}


def _graph_frames(graph: FlameGraph) -> dict[tuple[str, str, int], int]:
    out = _outermost(graph.root)
    return {k: v for k, v in out.items() if v and k[1]}  # Python frames (device: no file)


def test_memory_frames_sum_exactly_to_the_input_pprof(real: Path) -> None:
    path = real / "memory.prof"
    profile = decode_pprof(path.read_bytes())
    graph = load_memory_profile(path)
    # space/bytes is the input's second sample type, allocations/count the first.
    assert _graph_frames(graph) == _pprof_frames(profile, 1)
    assert _graph_frames(graph.companions[0]) == _pprof_frames(profile, 0)
    # `make` of alloc_a.py and of alloc_b.py are two frames with their own bytes.
    makes = {k: v for k, v in _graph_frames(graph).items() if k[0] == "make"}
    assert {(Path(f).name, line, v) for (_, f, line), v in makes.items()} == {
        ("alloc_a.py", 4, 256 * 128 * 4),
        ("alloc_b.py", 6, (128 + 64) * 64 * 4),
    }


def _npm_summary(path: Path) -> dict[str, Any]:
    if not (JS / "node_modules" / "pprof-format").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, timeout=300)
    done = subprocess.run(
        ["node", str(JS / "pprof_summary.mjs"), str(path)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_pprof_we_write_decodes_the_same_with_npm_pprof_format(
    real: Path, nested_tpu: Path, tmp_path: Path
) -> None:
    memory = load_memory_profile(real / "memory.prof")
    device = device_flamegraph(load_capture(nested_tpu))
    assert device is not None
    for name, graph in (("memory", memory), ("device", device)):
        out = tmp_path / f"{name}.pb.gz"
        out.write_bytes(encode_pprof(graph))
        summary = _npm_summary(out)
        parts = [*graph.companions, graph]
        assert summary["types"] == [[p.sample_type, p.unit] for p in parts]
        assert summary["totals"] == [p.root.total for p in parts]
        frames = {tuple(k.split("\t")): v for k, v in summary["frames"].items()}
        for index, part in enumerate(parts):
            expected = {(n, f, str(line)): v for (n, f, line), v in _outermost(part.root).items()}
            got = {(n, f, line): v[index] for (n, f, line), v in frames.items() if v[index]}
            assert got == {k: v for k, v in expected.items() if v}, name


def test_a_frame_label_keeps_file_and_line_in_the_pprof(tmp_path: Path) -> None:
    graph = FlameGraph(sample_type="wall", unit="nanoseconds")
    graph.add([FrameLabel("foo", "a.py", 10)], 100)
    graph.add([FrameLabel("foo", "b.py", 3)], 50)
    out = tmp_path / "g.pb.gz"
    out.write_bytes(encode_pprof(graph))
    assert _npm_summary(out)["frames"] == {"foo\ta.py\t10": [100], "foo\tb.py\t3": [50]}


def test_host_capture_of_the_synthetic_generator_reads_in_jax_profile_data(
    tmp_path: Path,
) -> None:
    # The synthetic capture is a valid XSpace for JAX's own reader too.
    from jax.profiler import ProfileData

    path = tmp_path / "s.xplane.pb"
    path.write_bytes(tpu_capture(devices=1, steps=2, ops_per_step=10).space.SerializeToString())
    data = ProfileData.from_file(str(path))
    names = [p.name for p in data.planes]
    assert "/device:TPU:0" in names and "/host:CPU" in names
    assert Capture.from_space(xplane_pb2.XSpace.FromString(path.read_bytes())).device_planes
