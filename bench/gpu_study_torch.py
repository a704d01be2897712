"""GPU study part ``torch``: a torch.profiler CUDA trace and a CUDA allocator snapshot, each
turned into flame graphs by the product and checked against torch's own readings.

A small training loop (``record_function("data_loader")``/``("train_step")``, a
``schedule`` with ``prof.step()``, ``with_stack=True``, ``profile_memory=True``) runs
under ``sdk.run()``: the trace goes through ``run.torch_trace_handler()`` into the
shared directory and the allocator history through ``run.record_memory_history()`` and
``run.memory_snapshot()``, as a user's would. References, same process:

- ``prof.key_averages()``: every ``cpu_op``'s self and total CPU time equal to the host
  graph's to 1 ns a call (``tests/integration/test_torch_trace_profiler.py``'s check);
  every kernel's device time equal to the device graph's per-kernel total to 1 us a
  call (torch's floats in us);
- the trace's own ``dur`` summed per kernel name, what Holistic Trace Analysis's
  ``get_gpu_kernel_breakdown`` sums (HTA itself is not on the lent machine, which has no
  network: ``holistictraceanalysis`` needs pandas < 3 in its own interpreter);
- ``torch.cuda._memory_viz``: per Python stack the live bytes, blocks and requested
  bytes of the snapshot equal our memory profile's
  (``tests/integration/test_torch_memory_viz.py``'s reading of both).

On the dry run's CPU the loop runs on the CPU (no kernels: the device checks SKIP) and
the snapshot is ``tests/torch_snapshots.training_snapshot()``, hand-built as PyTorch
writes them.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_study_part import ROOT, Part, run_part

sys.path.insert(0, str(ROOT))
WAIT, WARMUP, ACTIVE = 1, 1, 8


def body(part: Part) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from exporter import sdk

    cuda = part.gpu and torch.cuda.is_available()
    if part.gpu:
        part.check(cuda, "torch sees the GPU", torch.version.cuda or "no CUDA build")
    dev = "cuda" if cuda else "cpu"
    width, batch = (4096, 8192) if cuda else (128, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    traces: list[Path] = []
    with sdk.run("gpu-study-torch", shared_dir=part.work / "shared") as run:
        history = run.record_memory_history() if cuda else False
        model = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        ).to(dev, dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        data = torch.randn(batch, width, device=dev, dtype=dtype)
        handler = run.torch_trace_handler("gpu-study")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(
            activities=activities,
            schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
            on_trace_ready=lambda p: traces.append(handler(p)),
            with_stack=True,
            record_shapes=True,
            profile_memory=True,
        ) as prof:
            for _ in range(WAIT + WARMUP + ACTIVE):
                with record_function("data_loader"):
                    x = data * 1.0 + 0.01
                with record_function("train_step"):
                    optimizer.zero_grad()
                    loss = (model(x).float() ** 2).mean()
                    loss.backward()
                    optimizer.step()
                prof.step()
        if cuda:
            torch.cuda.synchronize()
        averages = prof.key_averages()
        snapshot = run.memory_snapshot() if history else None
    trace = next((p for p in traces if p), None)
    if not part.check(trace is not None, "trace written by run.torch_trace_handler()"):
        return
    assert trace is not None
    part.figures["trace_mib"] = trace.stat().st_size / 2**20
    keep = part.work / "samples"
    keep.mkdir(exist_ok=True)
    (keep / "torch.pt.trace.json").write_bytes(trace.read_bytes())
    check_host(part, trace, averages)
    if cuda:
        check_device(part, trace, averages)
        check_cli(part, trace, gpu=True)
    else:
        # No kernels in a CPU trace: the device graph's path runs on a GPU-shaped trace
        # built as Kineto writes them (tests/kineto_traces.py), torch's readings aside.
        check_cli(part, trace, gpu=False)
        shaped = gpu_shaped_trace(part.work / "gpu-shaped.pt.trace.json")
        check_device(part, shaped, None)
        check_cli(part, shaped, gpu=True, what="GPU-shaped trace")
    check_snapshot(part, snapshot, keep)


def _own_and_total(graph: Any) -> tuple[dict[str, int], dict[str, int]]:
    from tests.integration.test_torch_trace_profiler import _per_name

    own, total = _per_name(graph)
    return dict(own), dict(total)


def check_host(part: Part, trace_path: Path, averages: Any) -> None:
    from exporter.profiles.torch_trace import flamegraph_from_trace, load_torch_trace

    trace = load_torch_trace(trace_path)
    own, total = _own_and_total(flamegraph_from_trace(trace, "host"))
    kinds = dict(zip(trace.name, trace.category, strict=True))
    refs = {e.key: e for e in averages}
    compared, off = 0, []
    for name, kind in kinds.items():
        if kind != "cpu_op" or name not in refs:
            continue
        ref = refs[name]
        slack = ref.count  # torch's us floats against our ns: 1 ns a call at most
        if (
            abs(total.get(name, 0) - round(ref.cpu_time_total * 1000)) > slack
            or abs(own.get(name, 0) - round(ref.self_cpu_time_total * 1000)) > slack
        ):
            off.append(name)
        compared += 1
    part.figures["host_ops_compared"] = compared
    part.check(
        compared >= 10 and not off,
        "host graph: self/total CPU per op = key_averages()",
        f"{compared} ops, {len(off)} off: {off[:5]}",
    )


def gpu_shaped_trace(path: Path) -> Path:
    from tests import kineto_traces as kt

    events = [e for i in range(ACTIVE) for e in kt.training_step(i, 100.0 * i, 1000 + 10 * i)]
    return kt.write(path, events)


def check_device(part: Part, trace_path: Path, averages: Any | None) -> None:
    from exporter.profiles.torch_trace import flamegraph_from_trace, load_torch_trace

    events = json.loads(trace_path.read_text())["traceEvents"]
    kernels: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "kernel":
            kernels[e["name"]] += round(e["dur"] * 1000)
            calls[e["name"]] += 1
    trace = load_torch_trace(trace_path)
    own, _ = _own_and_total(flamegraph_from_trace(trace, "device"))
    off = [k for k in kernels if abs(own.get(k, 0) - kernels[k]) > calls[k]]
    part.figures["kernels"] = len(kernels)
    part.figures["kernel_ms"] = sum(kernels.values()) / 1e6
    part.check(
        bool(kernels) and not off,
        "device graph: per-kernel total = the trace's dur sums (HTA's breakdown)",
        f"{len(kernels)} kernels, {sum(kernels.values()) / 1e6:.2f} ms, {len(off)} off: {off[:3]}",
    )
    part.add(
        "SKIP",
        "against Holistic Trace Analysis",
        "not on the lent machine (no network); its kernel breakdown sums the trace's "
        "dur per kernel name, checked above",
    )
    if averages is None:
        part.add(
            "SKIP",
            "device graph: per-kernel total = key_averages() device time",
            "no GPU: the trace is GPU-shaped, not torch's",
        )
        return
    refs = {e.key: e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")}
    both = [k for k in kernels if k in refs]
    off_ref = []
    for k in both:
        ref = refs[k]
        ref_us = getattr(ref, "self_device_time_total", None)
        if ref_us is None:
            ref_us = ref.self_cuda_time_total
        if abs(own.get(k, 0) - ref_us * 1000) > 1000 * ref.count:
            off_ref.append(k)
    part.check(
        bool(both) and not off_ref,
        "device graph: per-kernel total = key_averages() device time",
        f"{len(both)} of {len(kernels)} kernels named alike, {len(off_ref)} off: {off_ref[:3]}",
    )


def check_cli(part: Part, trace: Path, gpu: bool, what: str = "trace") -> None:
    mlprof = [sys.executable, "-m", "exporter.cli"]
    folded = subprocess.run(
        [*mlprof, "flamegraph", str(trace), "--format", "folded"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    lines = [x for x in folded.stdout.splitlines() if x.strip()]
    gpu_lines = [x for x in lines if x.startswith("GPU")]
    ok = folded.returncode == 0 and bool(lines) and (bool(gpu_lines) or not gpu)
    part.check(
        ok,
        f"mlprof flamegraph of the {what}",
        f"{len(lines)} stacks, {len(gpu_lines)} on a GPU"
        if folded.returncode == 0
        else folded.stderr.strip()[-300:],
    )
    done = subprocess.run(
        [*mlprof, "analyze", str(trace), "--no-xprof", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    if not part.check(done.returncode == 0, f"mlprof analyze of the {what}", done.stderr[-300:]):
        return
    facts = json.loads(done.stdout)["facts"]
    steps = facts.get("steps", {})
    part.figures[f"analyze {what}"] = {"steps": steps, "breakdown": facts.get("breakdown")}
    part.check(
        steps.get("count") == ACTIVE,
        f"analyze of the {what}: the ProfilerStep cycles are the steps",
        f"{steps.get('count')} steps, median {steps.get('median_ms')} ms",
    )


def check_snapshot(part: Part, snapshot: Path | None, keep: Path) -> None:
    from exporter.profiles.torch_memory import torch_memory_pprof
    from exporter.proto import profile_pb2
    from tests import torch_snapshots as ts
    from tests.integration.test_torch_memory_viz import REFERENCE, _ours, _reference

    if snapshot is None:
        if part.gpu:
            part.add("FAIL", "allocator snapshot by run.memory_snapshot()", "none written")
        else:
            part.add(
                "SKIP",
                "allocator snapshot by run.memory_snapshot()",
                "no CUDA: the hand-built training snapshot stands in",
            )
        snapshot = ts.write(part.work / "training.pickle", ts.training_snapshot())
    else:
        part.check(True, "allocator snapshot by run.memory_snapshot()", snapshot.name)
    (keep / "allocator.pickle").write_bytes(snapshot.read_bytes())
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, str(snapshot)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if not part.check(done.returncode == 0, "torch.cuda._memory_viz reads it", done.stderr[-300:]):
        return
    reference = json.loads(done.stdout)[str(snapshot)]
    profile = profile_pb2.Profile.FromString(torch_memory_pprof(snapshot))
    want_requested, want_blocks, want_live = _reference(reference["memory"])
    requested, blocks, live = _ours(profile)
    with snapshot.open("rb") as handle:
        data = pickle.load(handle)  # our own file, just written
    segments = data["segments"] if isinstance(data, dict) else data
    part.figures["snapshot"] = {
        "segments": len(segments),
        "live_bytes": live,
        "stacks": len(blocks),
        "blocks": sum(blocks.values()),
    }
    part.check(
        want_live > 0 and live == want_live,
        "memory graph: live bytes = _memory_viz",
        f"{live} vs {want_live}",
    )
    part.check(
        blocks == want_blocks and requested == want_requested,
        "memory graph: blocks and requested bytes per stack = _memory_viz",
        f"{len(blocks)} stacks, {sum(blocks.values())} blocks",
    )


if __name__ == "__main__":
    run_part("torch", body)
