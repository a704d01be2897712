"""torch.profiler's own traces (CPU, made here by the real profiler) against torch itself.

A small training loop with ``record_function`` annotations and ``with_stack=True`` runs in
separate processes (``torch_trace_workload.py``): a base and a head that adds an
``aten::cumsum`` per step. References:

- ``prof.key_averages()``: torch's self and total CPU time per op, from the same run;
- the trace's own ``[memory]`` events, summed apart from the reader;
- the comparison's verdicts: the added op named, the step time judged.
"""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.cli import main
from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.torch_trace import flamegraph_from_trace, load_torch_trace, step_windows
from tests.harness import ROOT

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

WORKLOAD = ROOT / "tests" / "integration" / "torch_trace_workload.py"
STEPS = 16


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """base/ and head/ (``--extra-op``), each run in its own process, side by side."""
    root = tmp_path_factory.mktemp("torch-traces")
    runs = {"base": ["--memory"], "head": ["--memory", "--extra-op"]}
    procs = {}
    for name, flags in runs.items():
        (root / name).mkdir()
        command = [sys.executable, str(WORKLOAD), str(root / name), "--steps", str(STEPS), *flags]
        procs[name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for proc in procs.values():
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output.decode(errors="replace")[-2000:]
    return {name: root / name for name in runs}


def _per_name(graph: FlameGraph) -> tuple[dict[str, int], dict[str, int]]:
    """Self and total ns per frame name; a name's total counted at its outermost frames."""
    own: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    stack: list[tuple[Frame, frozenset[str]]] = [
        (t, frozenset()) for t in graph.root.children.values()
    ]
    while stack:
        frame, above = stack.pop()
        own[frame.name] += frame.self_value
        if frame.name not in above:
            total[frame.name] += frame.total
        stack.extend((c, above | {frame.name}) for c in frame.children.values())
    return own, total


def test_self_and_total_per_op_equal_torchs_key_averages(traces: dict[str, Path]) -> None:
    for directory in traces.values():
        trace = load_torch_trace(directory / "trace.pt.trace.json")
        averages = json.loads((directory / "key_averages.json").read_text())
        own, total = _per_name(flamegraph_from_trace(trace, "host"))
        kinds = dict(zip(trace.name, trace.category, strict=True))
        compared = 0
        for name, kind in kinds.items():
            if kind not in ("cpu_op", "user_annotation") or name not in averages:
                continue
            ref = averages[name]
            slack = ref["count"]  # torch's µs floats vs our ns: 1 ns per call at most
            assert abs(total[name] - round(ref["cpu_us"] * 1000)) <= slack, name
            if kind == "cpu_op":
                assert abs(own[name] - round(ref["self_cpu_us"] * 1000)) <= slack, name
            else:
                # torch's self time of an annotation leaves its Python frames in it; ours
                # gives them their own frames, so it is smaller, never larger.
                assert own[name] <= round(ref["self_cpu_us"] * 1000) + slack, name
            compared += 1
        assert compared >= 40  # every aten:: op of forward, backward and the optimizer


def test_steps_memory_and_cli_on_a_real_trace(traces: dict[str, Path], tmp_path: Path) -> None:
    path = traces["base"] / "trace.pt.trace.json"
    trace = load_torch_trace(path)
    windows = step_windows(trace)
    assert len(windows) == STEPS
    assert all(a.end_ns <= b.start_ns for a, b in pairwise(windows))
    events = json.loads(path.read_text())["traceEvents"]
    allocated = sum(
        e["args"]["Bytes"] for e in events if e.get("name") == "[memory]" and e["args"]["Bytes"] > 0
    )
    assert allocated > 0 and flamegraph_from_trace(trace, "memory").root.total == allocated
    packed = tmp_path / "renamed.bin"  # by content: no suffix, gzipped
    packed.write_bytes(gzip.compress(path.read_bytes()))
    done = CliRunner().invoke(main, ["flamegraph", str(packed)])
    assert done.exit_code == 0, done.output
    assert any(
        line.startswith("python;") and "aten::mm" in line for line in done.output.splitlines()
    )
    host = flamegraph_from_trace(trace, "host")
    mm = [f for _, f in host.paths() if f.name == "aten::mm"]
    assert mm and all(f.key == ("aten::mm", "", 0) for f in mm)


def test_compare_names_the_added_op_and_judges_the_step(traces: dict[str, Path]) -> None:
    base, head = (str(traces[n] / "trace.pt.trace.json") for n in ("base", "head"))
    done = CliRunner().invoke(main, ["compare", base, head, "--format", "json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["base"]["steps"] == report["head"]["steps"] == STEPS
    # The step is judged (a verdict on both medians); which way is the two processes'
    # business on a busy machine, but the verdict must agree with the medians' order.
    verdict = report["step_verdict"]
    assert verdict["base_median_ms"] > 0 and verdict["head_median_ms"] > 0, verdict
    if verdict["verdict"] == "slower":
        assert verdict["head_median_ms"] > verdict["base_median_ms"], verdict
    elif verdict["verdict"] == "faster":
        assert verdict["head_median_ms"] < verdict["base_median_ms"], verdict
    new = [r for r in report["regressions"] if "aten::cumsum" in json.dumps(r)]
    assert new, [r.get("frame") for r in report["regressions"]]


def test_analyze_step_time_equals_the_profiler_steps_in_the_json(traces: dict[str, Path]) -> None:
    path = traces["base"] / "trace.pt.trace.json"
    marks = sorted(
        (round(e["ts"] * 1000), round(e["dur"] * 1000))
        for e in json.loads(path.read_text())["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    # A cycle runs to the next step's start; the last one ends with its own step.
    cycles = [b[0] - a[0] for a, b in pairwise(marks)] + [marks[-1][1]]
    done = CliRunner().invoke(main, ["analyze", str(path), "--no-xprof", "--format", "json"])
    assert done.exit_code == 0, done.output
    steps = json.loads(done.output)["facts"]["steps"]
    assert steps["count"] == STEPS
    assert steps["median_ms"] == pytest.approx(statistics.median(cycles) / 1e6, abs=0.001)


def test_analyze_against_a_baseline_trace_names_the_added_op(traces: dict[str, Path]) -> None:
    base, head = (str(traces[n] / "trace.pt.trace.json") for n in ("base", "head"))
    done = CliRunner().invoke(
        main, ["analyze", head, "--baseline", base, "--no-xprof", "--format", "json"]
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    # The added op is a regression verdict of the baseline comparison. Which regression
    # heads the findings is not asked: the two traces come from two processes, and on a
    # busy machine an op of both can grow more than the added one adds (seen under
    # stress-ng: "aten::mm: self time grew" led).
    comparisons = report["baseline"]["comparisons"]
    added = [
        r
        for c in comparisons.values()
        for r in c["regressions"]
        if r["regression"] and "aten::cumsum" in r["frame"]
    ]
    assert added, {k: [r["frame"] for r in c["regressions"]] for k, c in comparisons.items()}
    assert report["baseline"]["top_regression"] is not None
