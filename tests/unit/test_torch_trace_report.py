"""A torch.profiler trace's report: NCCL kernels are its communication, and its findings
speak PyTorch (hand-built Kineto JSON in the documented schema, GPU-shaped, no GPU)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from exporter.analysis.facts.torch_traces import nccl_kind, trace_facts
from exporter.analysis.report.rules import apply_rules
from exporter.cli import main
from tests import kineto_traces as kt

# NCCL's kernel names: 2.19+ (ncclDevKernel_*) and before (ncclKernel_*).
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)"
# What XLA / JAX / XProf advice looks like: none of it belongs in a PyTorch report's
# words (the evidence keys stay as documented: ``xla_pct`` is the work's share).
FOREIGN = re.compile(r"XLA|JAX|jax\.|jit|TraceMe|flax|tf\.data|grain|xprof|HLO", re.IGNORECASE)
WORDED = ("title", "detail", "impact", "suggestion")


def words(findings: list[dict[str, Any]]) -> str:
    return " ".join(str(f[key]) for f in findings for key in WORDED)


def nccl_steps(count: int) -> list[dict[str, Any]]:
    """Steps of 200 µs (100 µs annotated): the GEMM (60-85 µs) and relu (86-92 µs) of
    ``kt.training_step`` on stream 7, an all-reduce on NCCL's stream 20 (50-90 µs,
    launched at 45 µs) and an all-gather on stream 21 (20-30 µs, launched at 15 µs)."""
    events: list[dict[str, Any]] = []
    for step in range(count):
        t, corr = 200.0 * step, 10 * step + 1
        events += kt.training_step(step + 1, t, corr)
        events += [
            kt.launch(t + 15, 2.0, corr + 5),
            kt.kernel(ALL_GATHER, t + 20, 10.0, corr + 5, stream=21),
            kt.launch(t + 45, 2.0, corr + 6),
            kt.kernel(ALL_REDUCE, t + 50, 40.0, corr + 6, stream=20),
        ]
    return events


def test_nccl_kernel_names_map_to_xprofs_collective_names() -> None:
    assert nccl_kind(ALL_REDUCE) == "all-reduce"
    assert nccl_kind(ALL_GATHER) == "all-gather"
    assert nccl_kind("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "send-recv"
    assert nccl_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce-scatter"


def test_nccl_kernels_are_the_traces_communication(tmp_path: Path) -> None:
    # Before: communication_pct was 0 on every trace (NCCL kernels counted as compute).
    path = kt.write(tmp_path / "rank0.pt.trace.json", nccl_steps(4))
    facts = trace_facts([path])
    b = facts.breakdown
    assert b is not None
    # Cycles: 3 of 200 µs and the last step's 100 µs = 700 µs. Per step the NCCL kernels
    # run 20-30 and 50-90 (50 µs); all kernels cover 20-30, 50-92 and the copy 93-95.5.
    total = 700.0
    assert b["communication_pct"] == pytest.approx(100 * 4 * 50 / total, abs=0.01)
    assert b["xla_pct"] == pytest.approx(100 * 4 * (10 + 42 + 2.5) / total, abs=0.01)
    assert b["compute_pct"] == pytest.approx(b["xla_pct"] - b["communication_pct"], abs=0.02)
    assert b["communication_ms_per_step"] == pytest.approx(4 * 50e-3 / 4)
    assert b["communication_by_kind_ms"] == {"all-reduce": 0.04, "all-gather": 0.01}
    # Compute kernels on stream 7 cover 60-85 and 86-90 of each all-reduce (29 of 40 µs);
    # nothing runs under the all-gather. HTA's comm/comp overlap, per NCCL kernel.
    overlap = b["communication_overlap"]
    assert overlap is not None
    assert overlap["async_ops"] == 8
    assert overlap["hidden_pct"] == pytest.approx(100 * 29 / 50)
    assert overlap["exposed_ms_per_step"] == pytest.approx(21e-3)
    assert facts.hosts[0]["communication_ms_per_step"] == pytest.approx(0.05)


def test_a_communication_bound_trace_is_told_in_pytorchs_words(tmp_path: Path) -> None:
    path = kt.write(tmp_path / "rank0.pt.trace.json", nccl_steps(4))
    findings = {f.rule: f for f in apply_rules(trace_facts([path]))}
    comm = findings["CommunicationBoundRule"]
    assert comm.evidence["communication_pct"] == pytest.approx(28.6)
    assert "all-reduce 0.04 ms" in comm.detail and "NCCL kernels" in comm.detail
    assert "NCCL" in comm.suggestion and "bucket_cap_mb" in comm.suggestion
    assert FOREIGN.findall(words([f.to_json() for f in findings.values()])) == []


def _input_bound_gpu(tmp_path: Path) -> Path:
    """Kernels 33.5 µs of each 200 µs cycle, torch's DataLoader annotation 60 µs."""
    events = []
    for step in range(8):
        t = 200.0 * step
        events += kt.training_step(step + 1, t, 10 * step + 1)
        events.append(
            kt.complete(
                "user_annotation",
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                t + 110,
                60.0,
            )
        )
    return kt.write(tmp_path / "gpu.pt.trace.json", events)


def _host_bound_cpu(tmp_path: Path) -> Path:
    """CPU only: an op 20 µs of each 100 µs step, Python the rest."""
    events = []
    for step in range(8):
        t = 100.0 * step
        events += [
            kt.complete("user_annotation", f"ProfilerStep#{step + 1}", t, 100.0),
            kt.complete("python_function", "train.py(12): train_step", t + 1, 98.0),
            kt.complete("cpu_op", "aten::mm", t + 70, 20.0 if step != 5 else 95.0),
        ]
    return kt.write(tmp_path / "cpu.pt.trace.json", events)


@pytest.mark.parametrize("make", [_input_bound_gpu, _host_bound_cpu])
def test_no_finding_or_summary_of_a_trace_speaks_xla_or_jax(tmp_path: Path, make: Any) -> None:
    # Before: "while no XLA computation runs", flax.jax_utils.prefetch_to_device, tf.data,
    # jax.profiler.TraceAnnotation, "xprof's trace viewer" in a PyTorch trace's report.
    path = make(tmp_path)
    done = CliRunner().invoke(main, ["analyze", str(path), "--no-xprof", "--format", "json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["facts"]["capture_format"] == "torch_trace"
    assert report["findings"], "the trace should have findings to word"
    assert FOREIGN.findall(words(report["findings"])) == []
    assert FOREIGN.findall(report["summary"]) == []
    rules = {f["rule"] for f in report["findings"]}
    if make is _input_bound_gpu:
        (wait,) = [f for f in report["findings"] if f["rule"] == "InputWaitRule"]
        assert "no GPU kernel runs" in wait["title"]
        assert "num_workers" in wait["suggestion"] and "pin_memory" in wait["suggestion"]
    else:
        assert "HostWaitRule" in rules
        (host,) = [f for f in report["findings"] if f["rule"] == "HostWaitRule"]
        assert "neither torch ops" in host["title"] and "record_function" in host["detail"]
    # Recompilation is unknown on a trace, said so, never "0 compilations".
    assert report["facts"]["recompilation"] is None
    assert "torch.compile" in report["facts"]["unavailable"]["recompilation"]
    page = CliRunner().invoke(
        main,
        ["analyze", str(path), "--no-xprof", "--format", "html", "-o", str(tmp_path / "r.html")],
    )
    assert page.exit_code == 0, page.output
    html = (tmp_path / "r.html").read_text()
    assert "XLA computing" not in html and "no XLA running" not in html
