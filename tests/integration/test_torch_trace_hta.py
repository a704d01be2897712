"""Kernel totals of a GPU-shaped torch.profiler trace against Holistic Trace Analysis.

HTA (``holistictraceanalysis`` on PyPI) is the independent reader of these traces. It
needs pandas < 3 and a Jupyter stack the project does not install, so it runs in its own
interpreter: set ``MLPROF_HTA_PYTHON`` to a Python that imports ``hta`` (the test is
skipped without it). HTA floors durations to whole microseconds, so the trace's are whole.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from exporter.profiles.convert import flamegraph_from_path
from tests import kineto_traces as kt

pytestmark = pytest.mark.integration

HTA_PYTHON = os.environ.get("MLPROF_HTA_PYTHON", "")
HTA_SCRIPT = """
import json, sys
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
_, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
print(json.dumps(dict(zip(per_kernel["name"], per_kernel["sum (us)"]))))
"""
KERNELS = ["ampere_sgemm_128x64_nn", "void at::native::reduce_kernel<512, 1>", "flash_fwd_kernel",
           "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]  # fmt: skip


def gpu_trace(seed: int, step_count: int = 20) -> list[dict[str, object]]:
    """Steps of launches from a few ops onto two streams, whole-µs kernel durations."""
    rng = random.Random(seed)
    events: list[dict[str, object]] = []
    correlation = 1
    for step in range(step_count):
        t = 1000.0 * step
        events.append(kt.complete("user_annotation", f"ProfilerStep#{step}", t, 900.0))
        gpu_t = t + 50
        for k in range(rng.randint(3, 8)):
            name = rng.choice(KERNELS)
            op_t = t + 10 + 100 * k
            events.append(kt.complete("cpu_op", f"aten::op{KERNELS.index(name)}", op_t, 40.0))
            events.append(kt.launch(op_t + 10, 5.0, correlation))
            dur = float(rng.randint(1, 60))
            gpu_t = max(gpu_t, op_t + 20)
            events.append(kt.kernel(name, gpu_t, dur, correlation, stream=7 + k % 2))
            gpu_t += dur
            correlation += 1
        events.append(kt.complete("cpu_op", "aten::copy_", t + 850, 20.0))
        events.append(kt.launch(t + 855, 3.0, correlation, "cudaMemcpyAsync"))
        events.append(kt.kernel("Memcpy DtoH (Device -> Pinned)", max(gpu_t, t + 860), 4.0,
                                correlation, cat="gpu_memcpy"))  # fmt: skip
        correlation += 1
    return events


@pytest.mark.skipif(not HTA_PYTHON, reason="MLPROF_HTA_PYTHON (a Python with hta) not set")
def test_kernel_totals_equal_htas_kernel_breakdown(tmp_path: Path) -> None:
    path = kt.write(tmp_path / "rank-0.pt.trace.json", gpu_trace(seed=7))
    done = subprocess.run(
        [HTA_PYTHON, "-c", HTA_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    hta_us = json.loads(done.stdout.strip().splitlines()[-1])
    graph = flamegraph_from_path(path, "device")
    ours: dict[str, int] = defaultdict(int)
    for _, frame in graph.paths():
        if not frame.children:
            ours[frame.name] += frame.self_value
    assert {name: ns / 1000 for name, ns in ours.items()} == hta_us
