"""``facts.gpu_kernels``: the kernel table against XProf's ``kernel_stats`` converter on
the same capture, launch overhead against hand-placed gaps and an independent reading
with JAX's ``ProfileData``, and hostile input."""

from __future__ import annotations

import shutil
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts.capture import gather_facts
from exporter.analysis.facts.gpu_kernels import (
    gpu_kernel_facts,
    parse_kernel_details,
    read_kernels,
)
from exporter.profiles.xspace import load_capture, parse_xspace
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import write_tpu_capture
from exporter.testing.synthetic_gpu import gpu_capture, write_gpu_capture
from tests.xspace_builder import PlaneBuilder

DETAILS = "regs:32 static_shared:0 dynamic_shared:1024 grid:128,1,1 block:256,1,1 occ_pct:50.0"
# Malformed as real tracers never write it: regs past uint32, a 2-D grid, a word for the
# occupancy. XProf's parser skips each token; ours must read it the same way.
BAD_DETAILS = "regs:99999999999 static_shared:12 grid:4,4 block:32,1,1 occ_pct:abc junk"


def _kernels(path: Path, top: int = 10_000) -> dict[str, Any]:
    with load_capture(path) as capture:
        found = read_kernels(capture)
    return gpu_kernel_facts([found], "gpu", top=top)


def _xprof_kernel_stats(path: Path, where: Path) -> list[dict[str, Any]]:
    """XProf's kernel_stats rows on a copy of ``path`` (XProf writes caches beside it)."""
    import json

    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    folder = where / "xprof"
    folder.mkdir()
    copy = folder / path.name
    shutil.copyfile(path, copy)
    raw, _ = xspace_to_tool_data([str(copy)], "kernel_stats", {"use_saved_result": False})
    table = json.loads(raw)
    cols = [c["id"] for c in table["cols"]]
    return [dict(zip(cols, (c["v"] for c in row["c"]), strict=True)) for row in table["rows"]]


def _with_malformed_kernel(path: Path) -> None:
    """Add kernels with BAD_DETAILS to the capture's first GPU plane."""
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    plane = next(p for p in space.planes if p.name == "/device:GPU:0")
    stat_ids = {m.name: m.id for m in plane.stat_metadata.values()}
    ref = max(plane.stat_metadata) + 1
    plane.stat_metadata[ref].id, plane.stat_metadata[ref].name = ref, BAD_DETAILS
    meta = max(plane.event_metadata) + 1
    plane.event_metadata[meta].id, plane.event_metadata[meta].name = meta, "odd_kernel"
    line = next(x for x in plane.lines if x.name.startswith("Stream #7"))
    for i, dur in enumerate((1_234_567, 2_000_999, 1_500_001)):  # ps: ns are truncated
        event = line.events.add(metadata_id=meta, offset_ps=(10_000_000 + i * 10_000) * 1000,
                                duration_ps=dur)  # fmt: skip
        event.stats.add(metadata_id=stat_ids["kernel_details"], ref_value=ref)
    path.write_bytes(space.SerializeToString())


def _xprof_key(name: str, regs: float, shmem: float, block: str, grid: str) -> tuple[Any, ...]:
    return (name, int(regs), int(shmem), block, grid)


@pytest.mark.parametrize("gemm_every", [6, 0])
def test_kernel_table_equals_xprof_kernel_stats(tmp_path: Path, gemm_every: int) -> None:
    path = tmp_path / "gpu.xplane.pb"
    write_gpu_capture(path, steps=3, devices=2, gemm_every=gemm_every)
    _with_malformed_kernel(path)
    reference = _xprof_kernel_stats(path, tmp_path)
    # A reference with nothing in it could not disagree: XProf must see every kind.
    assert len(reference) >= 4, reference
    assert {r["kernel_name"] for r in reference} >= {"loop_add_fusion", "odd_kernel"}
    assert all(r["op_name"] == "" for r in reference)  # no HLO protos: one row per config
    ours = _kernels(path)
    assert ours["available"] is True
    # XProf keys a row by name and launch configuration (and the framework op it finds in
    # HLO protos, none here); ours also by HLO module and op: sum ours over those.
    grouped: dict[tuple[Any, ...], dict[str, Any]] = {}
    for k in ours["kernels"]:
        launch = k["launch"]
        key = (
            k["name"],
            launch["registers_per_thread"],
            launch["static_shared_memory_bytes"] + launch["dynamic_shared_memory_bytes"],
            ",".join(map(str, launch["block"])),
            ",".join(map(str, launch["grid"])),
        )
        into = grouped.setdefault(key, {"n": 0, "total": 0, "min": None, "max": 0, "occ": set()})
        into["n"] += k["occurrences"]
        into["total"] += k["total_ns"]
        into["min"] = k["min_ns"] if into["min"] is None else min(into["min"], k["min_ns"])
        into["max"] = max(into["max"], k["max_ns"])
        into["occ"].add(launch["occupancy_pct"])
    theirs = {
        _xprof_key(r["kernel_name"], r["registers_per_thread"], r["shmem_bytes"],
                   r["block_dim"], r["grid_dim"]): r
        for r in reference
    }  # fmt: skip
    assert set(grouped) == set(theirs)
    for key, mine in grouped.items():
        ref = theirs[key]
        assert mine["n"] == ref["occurrences"], key
        assert mine["total"] == round(ref["total_duration_us"] * 1000), key
        assert mine["min"] == round(ref["min_duration_us"] * 1000), key
        assert mine["max"] == round(ref["max_duration_us"] * 1000), key
        # XProf's average is the integer division of its total (ns) by the count.
        assert mine["total"] // mine["n"] == round(ref["avg_duration_us"] * 1000), key
        expected_occ = ref["occupancy_pct"] if key[0] != "odd_kernel" else None
        assert mine["occ"] == {expected_occ}, key
    odd = theirs[("odd_kernel", 0, 12, "32,1,1", "1,1,1")]
    assert odd["occurrences"] == 3 and odd["occupancy_pct"] == 0  # XProf's default


def test_kernel_table_matches_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "gpu.xplane.pb"
    made = write_gpu_capture(path, steps=2, devices=1)
    ours = _kernels(path)
    by_name: dict[str, list[int]] = defaultdict(list)
    for (name, _details), durations in made.kernel_ns.items():
        by_name[name] += durations
    totals = {n: sum(d) for n, d in by_name.items()}
    mine: dict[str, int] = defaultdict(int)
    for k in ours["kernels"]:
        mine[k["name"]] += k["total_ns"]
        assert k["hlo_module"] == "jit_train_step(42)" and k["hlo_op"]
    assert dict(mine) == totals
    assert ours["kernel_count"] == sum(len(d) for d in by_name.values())
    assert ours["total_ms"] == pytest.approx(sum(totals.values()) / 1e6)
    assert sum(k["share_pct"] for k in ours["kernels"]) == pytest.approx(100, abs=0.01)
    assert ours["kernels"] == sorted(ours["kernels"], key=lambda k: -k["total_ns"])
    # MemcpyH2D carries memcpy_details, no kernel_details: not a kernel.
    assert "MemcpyH2D" not in mine


# -- launch overhead ------------------------------------------------------------------
def _hand_built() -> xplane_pb2.XSpace:
    """Known gaps. Stream 1: k1 [0,10) k2 [30,40) k3 [100,110) k4 [112,120); stream 2 runs
    [50,70). Calls (cuLaunchKernel, correlation ids 1-4) start at k1 -5, k2 at 5 (before
    the stream idles at 10), k3 at 80 (the host began it 70 after k2 ended), k4 at 90."""
    space = xplane_pb2.XSpace()
    gpu = PlaneBuilder(space, "/device:GPU:0")
    s1, s2 = gpu.line("Stream #7(Compute)"), gpu.line("Stream #8(Compute)")
    for corr, (start, dur) in enumerate(((0, 10), (30, 10), (100, 10), (112, 8)), 1):
        gpu.event(s1, f"k{corr}", start, dur, kernel_details=DETAILS, correlation_id=corr)
    gpu.event(s2, "other", 50, 20, kernel_details=DETAILS, correlation_id=99)
    host = PlaneBuilder(space, "/host:CUPTI")
    thread = host.line("1234")
    for corr, start in ((1, -5), (2, 5), (3, 80), (4, 90)):
        host.event(thread, "cuLaunchKernel", start, 3, correlation_id=corr)
    return space


def test_launch_overhead_on_hand_placed_gaps() -> None:
    capture = parse_xspace(_hand_built().SerializeToString(), "hand")
    facts = gpu_kernel_facts([read_kernels(capture)], "gpu")
    launch = facts["launch_overhead"]
    # Gaps on stream 1: [10,30) launch (call at 5, before idle): 20; [40,100): the host
    # began at 80, so 40 ns host, 20 ns launch [80,100); [110,112): call at 90: 2 launch.
    # Stream 2 has no gap. Device-idle launch time: 20 + 20 + 2 (stream 2 runs [50,70),
    # inside the host part, so nothing is taken off).
    assert launch["launch_overhead_ms"] == pytest.approx(42e-6)
    assert launch["gaps"] == 3
    assert launch["launch_gaps"] == 2 and launch["host_gaps"] == 1
    assert launch["median_gap_us"] == pytest.approx(0.02)
    assert launch["median_launch_gap_us"] == pytest.approx((20 + 2) / 2 / 1e3)
    span = 120  # first kernel start to last kernel end
    assert launch["share_pct"] == pytest.approx(100 * 42 / span, abs=1e-3)
    top = {t["name"]: t for t in launch["top_latency"]}
    assert top["k3"]["mean_us"] == pytest.approx(0.02)  # 100 - 80
    assert top["k1"]["mean_us"] == pytest.approx(0.005)
    assert launch["top_latency"][0]["name"] == "k2"  # 30 - 5


def test_another_stream_running_takes_its_time_off_the_overhead() -> None:
    space = _hand_built()
    gpu = space.planes[0]
    other = next(line for line in gpu.lines if line.name.startswith("Stream #8"))
    other.events[0].offset_ps = 85_000  # now [85, 105): covers [85,100) of k3's wait
    capture = parse_xspace(space.SerializeToString(), "hand")
    launch = gpu_kernel_facts([read_kernels(capture)], "gpu")["launch_overhead"]
    assert launch["launch_overhead_ms"] == pytest.approx((20 + 5 + 2) * 1e-6)


def _profile_data_overhead(path: Path) -> dict[str, tuple[float, int]]:
    """Per GPU plane: device-idle launch wait (ns) and positive gaps, read independently
    with JAX's ProfileData (plain Python over its planes, lines and events)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(path))
    calls: dict[int, float] = {}
    for plane in data.planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                for e in line.events:
                    stats = dict(e.stats)
                    if e.name == "cuLaunchKernel" and "correlation_id" in stats:
                        calls[int(stats["correlation_id"])] = e.start_ns
    out = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        busy: list[tuple[float, float]] = []
        waits: list[tuple[float, float]] = []
        gaps = 0
        for line in plane.lines:
            kernels = sorted(
                (e.start_ns, e.end_ns, dict(e.stats).get("correlation_id"))
                for e in line.events
                if e.duration_ns > 0 and "kernel_details" in dict(e.stats)
            )
            busy += [(s, e) for s, e, _ in kernels]
            idle_from = None
            for start, end, corr in kernels:
                if idle_from is not None and start > idle_from:
                    gaps += 1
                    call = calls.get(corr)
                    if call is not None and call <= start:
                        waits.append((max(idle_from, call), start))
                idle_from = end if idle_from is None else max(idle_from, end)
        # Launch-wait time not covered by any kernel, point by point over the edges.
        edges = sorted({x for span in busy + waits for x in span})
        total = 0.0
        for lo, hi in pairwise(edges):
            mid = (lo + hi) / 2
            if any(a <= mid < b for a, b in waits) and not any(a <= mid < b for a, b in busy):
                total += hi - lo
        out[plane.name] = (total, gaps)
    return out


def test_launch_overhead_equals_an_independent_reading_with_profile_data(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpu.xplane.pb"
    made = write_gpu_capture(path, steps=2, kernels_per_step=30, devices=2, gemm_every=0,
                             start_ns=1_000_000)  # fmt: skip
    reference = _profile_data_overhead(path)
    with load_capture(path) as capture:
        found = read_kernels(capture)
    assert found is not None
    ours = {d["device"]: d for d in found.devices}
    launch = gpu_kernel_facts([found], "gpu")["launch_overhead"]
    assert set(ours) == set(reference) == {"/device:GPU:0", "/device:GPU:1"}
    for device, (wait_ns, gaps) in reference.items():
        assert wait_ns > 0 and gaps > 10  # short kernels: the stream waits for the host
        assert ours[device]["launch_overhead_ms"] == pytest.approx(wait_ns / 1e6, abs=1e-9)
        # one compute stream: the simulation's own account of its waits
        assert made.launch_wait_ns[device] == wait_ns
    assert launch["gaps"] == sum(g for _, g in reference.values()) == sum(made.gaps.values())
    assert launch["launch_gaps"] == sum(made.launch_gaps.values())
    assert launch["share_pct"] > 10


def test_per_step_overhead_in_a_report(tmp_path: Path) -> None:
    path = tmp_path / "gpu.xplane.pb"
    write_gpu_capture(path, steps=4, kernels_per_step=20, gemm_every=0)
    facts = gather_facts([path], xprof=False)
    assert facts.backend == "gpu" and facts.steps is not None and facts.steps["count"] == 4
    kernels = facts.to_json()["gpu_kernels"]
    per_step = kernels["launch_overhead"]["per_step"]
    assert per_step["steps"] == 4
    # Every kernel lies inside a step cycle, so the per-step figure is the whole one's.
    assert per_step["launch_overhead_ms_per_step"] * 4 == pytest.approx(
        kernels["launch_overhead"]["launch_overhead_ms"], rel=1e-6
    )
    assert 0 < per_step["share_of_step_pct"] < 100


# -- other backends and hostile input -------------------------------------------------
def test_no_gpu_plane_is_unavailable_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "tpu.xplane.pb"
    write_tpu_capture(path, steps=3)
    kernels = gather_facts([path], xprof=False).to_json()["gpu_kernels"]
    assert kernels["available"] is False
    assert "no GPU device plane" in kernels["reason"] and "TPU" in kernels["reason"]


def test_without_launch_calls_the_overhead_is_unavailable() -> None:
    space = gpu_capture(steps=1, kernels_per_step=4).space
    keep = [p for p in space.planes if p.name != "/host:CUPTI"]
    del space.planes[:]
    space.planes.extend(keep)
    facts = gpu_kernel_facts([read_kernels(parse_xspace(space.SerializeToString(), "x"))], "gpu")
    assert facts["available"] is True and facts["kernel_count"] == 4
    assert facts["launch_overhead"]["available"] is False
    assert "no kernel launch calls" in facts["launch_overhead"]["reason"]


def test_hostile_events_are_skipped_not_fatal() -> None:
    space = xplane_pb2.XSpace()
    gpu = PlaneBuilder(space, "/device:GPU:0")
    stream = gpu.line("Stream #1(Compute)")
    gpu.event(stream, "good", 0, 10, kernel_details=DETAILS, correlation_id=1)
    gpu.event(stream, "negative", 20, -5, kernel_details=DETAILS)
    gpu.event(stream, "instant", 30, 0, kernel_details=DETAILS)
    gpu.event(stream, "far", 5e15, 10, kernel_details=DETAILS)  # 5e18 ps: past 2**62
    gpu.event(stream, "no_details", 40, 10)  # the plane has kernel_details: not a kernel
    gpu.event(stream, "bad_details", 50, 10, kernel_details="grid:-1,x block:" + "9" * 40)
    host = PlaneBuilder(space, "/host:CUPTI")
    thread = host.line("1")
    host.event(thread, "cuLaunchKernel", 100, 3, correlation_id=1)  # after its kernel
    host.event(thread, "cuLaunchKernel", 0, 3, correlation_id=-7)
    derived = gpu.line("XLA Ops", line_id=0xDEADBEEF)
    gpu.event(derived, "fusion", 0, 100, kernel_details=DETAILS)
    facts = gpu_kernel_facts([read_kernels(parse_xspace(space.SerializeToString(), "h"))], "gpu")
    names = {k["name"]: k for k in facts["kernels"]}
    assert set(names) == {"good", "bad_details"}
    assert facts["skipped_events"] == 1
    assert names["bad_details"]["launch"]["grid"] == [1, 1, 1]
    assert names["bad_details"]["launch"]["block"] == [1, 1, 1]
    assert facts["launch_overhead"]["available"] is False  # the only call is after its kernel


def test_a_plane_without_kernel_details_counts_lasting_events() -> None:
    space = xplane_pb2.XSpace()
    gpu = PlaneBuilder(space, "/device:GPU:0")
    stream = gpu.line("Stream #1(Compute)")
    gpu.event(stream, "gemm", 0, 50, hlo_op="dot.1", hlo_module="jit_f(3)")
    gpu.event(stream, "gemm", 60, 30, hlo_op="dot.1", hlo_module="jit_f(3)")
    gpu.event(stream, "Memcpy", 100, 5, memcpy_details="size:8")
    facts = gpu_kernel_facts([read_kernels(parse_xspace(space.SerializeToString(), "p"))], "gpu")
    assert "no memcpy" in facts["kernel_basis"]
    (row,) = facts["kernels"]
    assert (row["name"], row["hlo_op"], row["hlo_module"]) == ("gemm", "dot.1", "jit_f(3)")
    assert (row["occurrences"], row["total_ns"], row["min_ns"], row["max_ns"]) == (2, 80, 30, 50)
    assert row["launch"] is None


def test_kernel_details_parse_as_xprof_parses_them() -> None:
    config = parse_kernel_details(DETAILS)
    assert config is not None
    assert config.to_json() == {
        "registers_per_thread": 32, "static_shared_memory_bytes": 0,
        "dynamic_shared_memory_bytes": 1024, "grid": [128, 1, 1], "block": [256, 1, 1],
        "threads_per_block": 256, "occupancy_pct": 50.0,
    }  # fmt: skip
    odd = parse_kernel_details(BAD_DETAILS)
    assert odd is not None and odd.registers_per_thread == 0 and odd.grid == (1, 1, 1)
    assert parse_kernel_details("") is None and parse_kernel_details("x" * 5000) is None
    assert parse_kernel_details("occ_pct:nan") == parse_kernel_details("regs:0")


def test_the_report_shows_the_kernel_table_and_launch_overhead(tmp_path: Path) -> None:
    from exporter.analysis.report.document import analyze
    from exporter.analysis.report.render import report_html, report_text

    path = tmp_path / "gpu.xplane.pb"
    write_gpu_capture(path, steps=3, kernels_per_step=20, gemm_every=0)
    report = analyze(str(path), xprof=False)
    kernels = report.to_json()["facts"]["gpu_kernels"]
    top = kernels["kernels"][0]
    page = report_html(report)
    assert page.count('<table id="gpu-kernels">') == 1 and top["name"] in page  # once
    assert "grid 1024,1,1 block 128,1,1, 16 regs, 0 B shared, occupancy 100%" in page
    text = report_text(report)
    assert f"GPU kernels: {kernels['kernel_count']} (" in text
    assert f"  kernel {top['name']} ({top['hlo_op']}): {top['occurrences']} x " in text
    per_step = kernels["launch_overhead"]["per_step"]
    assert f"{per_step['share_of_step_pct']:.1f}% of step time" in text
    assert "LaunchBoundRule" in {f.rule for f in report.findings}
