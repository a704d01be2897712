"""Benchmark: a large GPU-shaped torch.profiler trace through the CLI, beside HTA's parse.

Writes a Kineto-shaped trace (``tests/kineto_traces.py``, ``--steps`` steps of 3-8
kernel launches each, two streams, a memcpy a step: about 15 events a step) and runs,
each as a child process, measuring wall and CPU seconds and peak RSS (``os.wait4``):

- ``mlprof flamegraph TRACE -o out.folded`` (the device graph: kernels under their ops);
- ``mlprof flamegraph TRACE --kind host -o out.folded``;
- ``mlprof analyze TRACE --no-xprof --format json -o report.json``;
- with ``MLPROF_HTA_PYTHON`` set (a Python that imports ``hta``): HTA's
  ``TraceAnalysis`` load and ``get_gpu_kernel_breakdown``, the reference.

The device graph's total is checked against the trace's own kernel durations, so a
malformed trace fails loudly instead of being measured.

    .venv/bin/python bench/torch_trace_read.py --steps 20000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.test_torch_trace_hta import HTA_SCRIPT  # noqa: E402

WRITER = """
import sys
from pathlib import Path
from tests import kineto_traces as kt
from tests.integration.test_torch_trace_hta import gpu_trace
events = gpu_trace(seed=1, step_count=int(sys.argv[2]))
kt.write(Path(sys.argv[1]), events)
print(sum(round(e["dur"] * 1000) for e in events if e.get("cat") in ("kernel", "gpu_memcpy")))
"""


def measure(command: list[str]) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command[:3]} failed: {err[-500:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args()
    mlprof = str(Path(sys.executable).with_name("mlprof"))
    with tempfile.TemporaryDirectory(prefix="torch-trace-bench-") as tmp:
        # Written by a child: this process stays small, so the children's peak RSS (which
        # Linux starts from the forking process's) is theirs.
        path = Path(tmp) / "rank-0.pt.trace.json"
        kernel_ns = int(
            subprocess.check_output(
                [sys.executable, "-c", WRITER, str(path), str(args.steps)], cwd=ROOT
            )
        )
        size_mb = path.stat().st_size / 1e6
        print(f"trace: {size_mb:.1f} MB, {args.steps} steps")
        out = Path(tmp) / "out.folded"
        results = {
            "device": measure([mlprof, "flamegraph", str(path), "-o", str(out)]),
        }
        total = sum(int(line.rsplit(" ", 1)[1]) for line in out.read_text().splitlines())
        assert total == kernel_ns, (total, kernel_ns)
        results["host"] = measure(
            [mlprof, "flamegraph", str(path), "--kind", "host", "-o", str(out)]
        )
        report = Path(tmp) / "report.json"
        results["analyze"] = measure(
            [mlprof, "analyze", str(path), "--no-xprof", "--format", "json", "-o", str(report)]
        )
        steps = json.loads(report.read_text())["facts"]["steps"]["count"]
        assert steps == args.steps, steps
        hta = os.environ.get("MLPROF_HTA_PYTHON")
        if hta:
            results["hta_kernel_breakdown"] = measure([hta, "-c", HTA_SCRIPT, tmp])
        for name, figures in results.items():
            print(f"{name:22s} {json.dumps(figures)}")


if __name__ == "__main__":
    main()
