"""Benchmark: a comparison's per-capture read (whole graph + per-step graphs), A/B.

A compare (and a replicate comparison reads 8 or more captures a side) decodes each
capture once into the step view's sides: device and host, each a whole graph and one
graph per step cycle (``exporter.analysis.sides.load.capture_side``, as
``_decode_capture_kinds`` calls it, the side cache aside). Measured, in fresh child
processes taken in turn (CPU seconds of the read in process, median of ``--repeat``),
each with glibc keeping freed blocks as ``mlprof compare`` runs (``exporter.heap``;
``MLPROF_MALLOC=default`` measures with glibc's defaults):

- ``now``: the product as it is: per-step graphs built frame by frame for all windows
  at once (``exporter.profiles.tree_graphs.graphs_by_frame``), the whole graph as the
  windows' sum from the same pass (``windowed_flamegraphs(total=True)``), the windows'
  nodes, self time and the ``split`` rule compiled (``_treegraphs.c``), a CPU capture's
  XLA events from the compiled core's stat columns;
- ``before``: the read as issue 33 found it, replayed in the same run: host step
  annotations read event by event (the twin), lines whose events overlap nested by the
  ``split`` rule's Python loop (the twin of ``_treegraphs.split``), segments' nodes
  and their self time split across the windows in numpy (``FrameTree.assign``,
  ``nesting.window_self``), a CPU capture's XLA events read through protobuf
  (``xla_host``'s twin), an op's frame labels made for each op, graphs built node by
  node per window (``graphs_by_node``, kept as the reference; the CPU device view's
  too) and the whole
  graph merged from every window's graph, or past 200 steps (cycles sampled) a
  whole-capture conversion and a second pass for the sampled cycles;
- ``whole``: the compiled whole-capture conversion of the same file (device and host
  graphs, no windows): the floor a read with steps is held to.

Captures: synthetic TPU-shaped ones (``write_tpu_capture``, 4 chips, ~200k events: 50
steps, and 400 steps, which a side samples) and a real JAX CPU capture with the Python tracer on
(``bench/python_traced_workload.py``, ~47k host events, 160 steps). Target (issue 33):
``now`` at most 0.3x ``before``.

    .venv/bin/python bench/compare_read.py             # both captures, 5 runs each
    .venv/bin/python bench/compare_read.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.3  # issue 33: a compare's per-capture read cost, now / before


def _before() -> None:
    """Replay the read as it was: node-by-node graphs; the whole graph merged from every
    step's graph, or, past 200 steps (cycles sampled), a whole-capture conversion and a
    second pass for the sampled cycles."""
    from exporter.analysis.sides import xla_host
    from exporter.profiles import nesting, steps, tree_graphs, xplane
    from exporter.profiles.convert import flamegraph_from_capture

    xplane.graphs_by_frame = tree_graphs.graphs_by_node  # type: ignore[assignment]
    steps._host_step_columns = steps._host_step_events  # host steps read event by event
    nesting._compiled_split = None  # the split rule's Python loop (its twin)
    nesting._compiled_window_self = None  # self time per window in numpy (its twin)
    xplane.segment_nodes = lambda *_: None  # type: ignore[assignment]  # assign's numpy
    xla_host._column_rows = xla_host._parsed_rows  # a CPU capture's XLA events by protobuf
    xla_host.graphs_by_frame = tree_graphs.graphs_by_node  # type: ignore[assignment]

    def op_tuple(self: Any, info: Any, program: Any, outer: Any) -> int:
        key = (info, program, outer)  # an op's labels made for each op, as they were
        found: int | None = self._op_tuples.get(key)
        if found is None:
            names = xplane._op_labels(info, program, outer)
            found = self._op_tuples[key] = self.tuple_id(tuple(map(xplane.FrameLabel, names)))
        return found

    xplane.FrameTree.op_tuple = op_tuple  # type: ignore[method-assign]
    windowed = steps.windowed_flamegraphs

    def read(capture: Any, kind: Any, cycles: Any) -> tuple[Any, list[Any]]:
        if any(a.end_ns != b.start_ns for a, b in pairwise(cycles)):
            return flamegraph_from_capture(capture, kind), windowed(capture, kind, cycles)
        far = 1 << 62
        edges = [steps.StepWindow(-far, cycles[0].start_ns, None), *cycles,
                 steps.StepWindow(cycles[-1].end_ns, far, None)]  # fmt: skip
        graphs = windowed(capture, kind, edges)
        whole = graphs[0].copy()
        for graph in graphs[1:]:
            whole.merge(graph)
        whole.time_nanos, whole.duration_nanos = capture.time_range()
        return whole, graphs[1:-1]

    steps.whole_and_windowed_flamegraphs = read  # type: ignore[assignment]


def worker(mode: str, path: Path) -> dict[str, float]:
    """One read in this fresh process (imports and a first read before the clock)."""
    sys.path.insert(0, str(ROOT))
    from exporter.analysis.sides.load import capture_side
    from exporter.heap import keep_freed_memory
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

    keep_freed_memory()  # as `mlprof compare` does (exporter.heap), every mode alike

    if mode == "before":
        _before()

    def read() -> int:
        with load_capture(path) as capture:
            if mode == "whole":
                graphs = [device_flamegraph(capture), host_flamegraph(capture)]
                return sum(1 for g in graphs if g is not None)
            cache: dict[str, Any] = {}
            steps = 0
            for kind in ("device", "host"):
                steps += len(capture_side(capture, kind, cache)[2])  # type: ignore[arg-type]
            return steps

    read()  # warm: the file in the page cache, lazy imports done
    cpu = time.process_time()
    steps = read()
    return {"cpu_s": time.process_time() - cpu, "steps": steps}


def _child(mode: str, path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", mode, str(path)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{mode} worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench(name: str, path: Path, repeat: int) -> bool:
    runs: dict[str, list[dict[str, float]]] = {"now": [], "before": [], "whole": []}
    for _ in range(repeat):  # in turn, so a shared machine's load drifts over all alike
        for mode, found in runs.items():
            found.append(_child(mode, path))
    cpu = {mode: statistics.median(r["cpu_s"] for r in found) for mode, found in runs.items()}
    ratio = cpu["now"] / cpu["before"]
    print(f"\n[{name}] {path.stat().st_size / 2**20:.1f} MiB, {runs['now'][0]['steps']:.0f} "
          f"step graphs (device + host views), CPU s of the read, median of {repeat}:")  # fmt: skip
    print(f"  now    (graphs by frame, whole from the same pass): {cpu['now']:.3f}")
    print(f"  before (graphs by node, whole merged)             : {cpu['before']:.3f}")
    print(f"  whole-capture conversion (compiled, no windows)   : {cpu['whole']:.3f}")
    print(
        f"  now/before {ratio:.2f} (target <= {TARGET}), now/whole "
        f"{cpu['now'] / cpu['whole']:.2f}, before/whole {cpu['before'] / cpu['whole']:.2f}"
    )
    return ratio <= TARGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]))))
        return
    sys.path.insert(0, str(ROOT))
    from exporter.testing.synthetic import write_tpu_capture

    verdicts = []
    with tempfile.TemporaryDirectory(prefix="mlprof-compare-read-") as tmp:
        tpu = Path(tmp) / "tpu" / "tpu-vm-0.xplane.pb"
        write_tpu_capture(tpu, devices=4, steps=50, ops_per_step=1000, distinct_ops=400,
                          while_every=50, while_body=8)  # fmt: skip
        verdicts.append(bench("synthetic TPU capture", tpu, args.repeat))
        # Past MAX_STEP_SAMPLES (200) steps a side samples its cycles.
        long = Path(tmp) / "long" / "tpu-vm-0.xplane.pb"
        write_tpu_capture(long, devices=4, steps=400, ops_per_step=125, distinct_ops=400,
                          while_every=50, while_body=8)  # fmt: skip
        verdicts.append(bench("synthetic TPU capture, 400 steps (sampled)", long, args.repeat))
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "python_traced_workload.py"), tmp + "/real"],
            capture_output=True, text=True, check=False,
            env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"the JAX workload failed: {done.stderr[-600:]}")
        real = Path(done.stdout.split("DONE ", 1)[1].strip())
        verdicts.append(bench("real JAX CPU capture, Python tracer", real, args.repeat))
    print(f"\ntarget: a compare's per-capture read <= {TARGET}x before -> "
          f"{'PASS' if all(verdicts) else 'FAIL'}")  # fmt: skip


if __name__ == "__main__":
    main()
