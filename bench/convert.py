"""Benchmark: XProf capture -> flame graphs (device + host) -> pprof, against XProf.

Two capture sizes (a small one of about 47k events, as a short real capture has, and a
large one of 2 million), each a synthetic TPU-shaped capture with nested ``while`` ops
that XProf's own tools read. For each size, in fresh child processes:

- mlprof in process: open, device and host graphs, pprof of each (events/s, peak RSS
  growth over the interpreter);
- ``mlprof flamegraph`` as a whole process (CPU seconds, imports included);
- the same in process with the pure-Python decoder (``MLPROF_DECODER=python``): what
  the compiled decode core (``exporter/profiles/_xwire.c``) saves;
- XProf on the same file (a copy: it writes caches beside it): ``op_profile`` (the tool
  whose numbers the device graph must equal) and ``trace_viewer``.

Then two real JAX CPU captures (``tests/integration/analysis_workload.py compute``, a few
thousand host events, and ``bench/python_traced_workload.py``, ~47k with the Python
tracer on): ``mlprof flamegraph --kind host`` as a whole process against XProf's
``trace_viewer`` as a whole process (the interpreter, its import and the conversion,
nothing else), taken in turn, wall and CPU, with the start-up floors of the same run: the
bare interpreter, ``import numpy`` (one OpenBLAS thread, as the CLI runs it; the host
graph's columns and nesting are numpy arrays) and that plus click and the XSpace schema
(protobuf parses a plane's metadata): the libraries the command cannot start without.

Child processes compile each module once into a private bytecode cache, as an installed
package has its ``.pyc`` files: this tree runs with ``PYTHONDONTWRITEBYTECODE=1``, so a
module edited since its ``.pyc`` was written would otherwise be compiled again in every
measured process (10 ms for ``xplane.py``). Each figure's first process is a warm-up.

Every figure prints with its ratio to XProf measured in the same run. Targets: at least
3M events/s in process on the large capture, faster than XProf's ``op_profile``; issue
20's: the CLI's device graph of the large capture at most 0.1x ``op_profile``'s CPU (whole
processes), the real capture's host graph CLI faster than ``trace_viewer``.

    .venv/bin/python bench/convert.py            # both sizes and the real capture, minutes
    .venv/bin/python bench/convert.py --quick    # the small size only, seconds
    .venv/bin/python bench/convert.py --real --repeat 15   # the real captures only (issue 33)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_EVENTS_PER_S = 3_000_000
TARGET_CLI_VS_OP_PROFILE = 0.1  # issue 20: whole-process CPU, large capture
SIZES = {"small": 47_000, "large": 2_000_000}
XPROF_TOOLS = ("op_profile", "trace_viewer")
# XProf's converter as a whole process: the interpreter, its import, one tool.
_XPROF_PROCESS = """import sys
from xprof.convert import raw_to_tool_data
options = {"use_saved_result": False}
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], sys.argv[2], options)
sys.exit(0 if data else "xprof produced no data")
"""


def _status_mib(field: str) -> float:
    """A /proc/self/status memory field in MiB (VmRSS now, VmHWM peak since exec).

    ``ru_maxrss`` is not used: Linux carries it over from the parent across exec.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_mlprof(path: Path) -> dict[str, float]:
    """Convert in this (fresh) process; report time and memory."""
    from exporter.profiles.pprof import encode_pprof
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

    baseline = _status_mib("VmRSS")
    start = time.perf_counter()
    cpu = time.process_time()
    with load_capture(path) as capture:
        device = device_flamegraph(capture)
        host = host_flamegraph(capture)
        events = capture.events_read
    sizes = [len(encode_pprof(g)) for g in (device, host) if g is not None]
    return {
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
        "events": events,
        "baseline_rss_mib": baseline,
        "peak_rss_mib": _status_mib("VmHWM"),
        "pprof_bytes": sum(sizes),
        "device_ns": device.root.total if device else 0,
    }


def worker_xprof(path: Path, tool: str) -> dict[str, float]:
    """One XProf tool on the file, in this (fresh) process."""
    from xprof.convert import raw_to_tool_data

    baseline = _status_mib("VmRSS")
    start = time.perf_counter()
    cpu = time.process_time()
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(path)], tool, {"use_saved_result": False})
    seconds = time.perf_counter() - start
    if not data:
        raise SystemExit(f"xprof produced no {tool} data")
    out: dict[str, float] = {
        "seconds": seconds,
        "cpu_seconds": time.process_time() - cpu,
        "baseline_rss_mib": baseline,
        "peak_rss_mib": _status_mib("VmHWM"),
    }
    if tool == "op_profile":
        total = json.loads(data)["byProgramExcludeIdle"]["metrics"]["rawTime"]
        out["device_ns"] = float(total) / 1000
    return out


def _child(args: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run a worker; its figures plus ``process_cpu_seconds`` of the whole child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--worker", *args],
        capture_output=True, text=True, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} worker failed:\n{done.stderr[-3000:]}")
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_cpu_seconds"] = (after.ru_utime - before.ru_utime) + (
        after.ru_stime - before.ru_stime
    )
    out["process_seconds"] = wall
    return out


def _process(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(CPU seconds (user + sys), wall seconds) of a whole ``python ARGS`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], check=True, capture_output=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def _cli(path: Path, out: Path, *extra: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a whole ``mlprof flamegraph`` process."""
    return _process(["-m", "exporter.cli", "flamegraph", str(path), "-o", str(out), *extra])


def _xprof_process(path: Path, tool: str, tmp: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of XProf's ``tool`` on a copy of ``path``, a whole process."""
    copy = Path(tempfile.mkdtemp(dir=tmp)) / path.name  # a fresh dir: XProf caches beside it
    shutil.copy(path, copy)
    return _process(["-c", _XPROF_PROCESS, str(copy), tool])


def _cli_cpu(path: Path, out: Path) -> float:
    return _cli(path, out)[0]


def _write(path: Path, events: int) -> int:
    from exporter.testing.synthetic import write_tpu_capture

    devices = 4
    ops_per_step = 10_000 if events >= 400_000 else 1_000
    steps = max(1, -(-events // (devices * ops_per_step)))
    synthetic = write_tpu_capture(
        path,
        devices=devices,
        steps=steps,
        ops_per_step=ops_per_step,
        distinct_ops=400,
        while_every=50,
        while_body=8,
    )
    return synthetic.event_count


def bench_size(name: str, events: int, repeat: int, tmp: Path) -> bool:
    path = tmp / name / "mlprof" / "tpu-vm-0.xplane.pb"
    start = time.perf_counter()
    count = _write(path, events)
    size_mib = path.stat().st_size / 2**20
    print(
        f"\n[{name}] {count:,} events, {size_mib:.1f} MiB (written in "
        f"{time.perf_counter() - start:.1f}s)"
    )
    runs = [_child(["mlprof", str(path)]) for _ in range(max(1, repeat))]
    seconds = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    ours = runs[0]
    rate = ours["events"] / cpu  # CPU time: the wall clock of a shared machine lies
    growth = max(r["peak_rss_mib"] - r["baseline_rss_mib"] for r in runs)
    _cli(path, tmp / name / "out.folded")  # warm-up: the bytecode cache
    cli = statistics.median(_cli_cpu(path, tmp / name / "out.folded") for _ in range(repeat))
    pure = [_child(["mlprof", str(path)], {"MLPROF_DECODER": "python"}) for _ in range(repeat)]
    pure_cpu = statistics.median(r["cpu_seconds"] for r in pure)
    refs = {}
    for tool in XPROF_TOOLS:
        copy = tmp / name / tool / path.name  # a fresh dir: XProf caches beside its input
        copy.parent.mkdir(parents=True)
        shutil.copy(path, copy)
        refs[tool] = _child(["xprof", str(copy), tool])
    op = refs["op_profile"]
    print(
        f"mlprof in process : {cpu:.3f}s CPU ({seconds:.3f}s wall, median of {len(runs)}), "
        f"{rate / 1e6:.2f}M events/s of CPU, peak RSS +{growth:.0f} MiB over the interpreter"
    )
    print(
        f"mlprof, python dec: {pure_cpu:.3f}s CPU in process (MLPROF_DECODER=python); "
        f"compiled/python {cpu / pure_cpu:.2f}"
    )
    print(f"mlprof flamegraph : {cli:.3f}s CPU, the whole process (interpreter and imports)")
    for tool, ref in refs.items():
        print(
            f"xprof {tool:<12}: {ref['cpu_seconds']:.3f}s CPU in process, "
            f"{ref['process_cpu_seconds']:.3f}s whole process, peak RSS "
            f"+{ref['peak_rss_mib'] - ref['baseline_rss_mib']:.0f} MiB; xprof/mlprof CPU: "
            f"in process {ref['cpu_seconds'] / cpu:.2f}, whole process "
            f"{ref['process_cpu_seconds'] / cli:.2f}"
        )
    agree = abs(op["device_ns"] - ours["device_ns"]) <= 1
    print(
        f"device total      : mlprof {ours['device_ns']:,} ns, op_profile "
        f"{op['device_ns']:,.0f} ns -> {'equal' if agree else 'DIFFERENT'}"
    )
    ok = agree and cpu < op["cpu_seconds"]
    if name == "large":
        ok = ok and rate >= TARGET_EVENTS_PER_S
        share = cli / op["process_cpu_seconds"]
        print(
            f"issue 20 target  : CLI device graph {share:.2f}x op_profile's whole-process CPU "
            f"(target <= {TARGET_CLI_VS_OP_PROFILE:g}x) -> "
            f"{'met' if share <= TARGET_CLI_VS_OP_PROFILE else 'NOT met'}"
        )
    return ok


def _real_capture(script: str, args: list[str]) -> Path:
    done = subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        capture_output=True, text=True, check=False,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the JAX workload failed: {done.stderr[-600:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("DONE"))
    return Path(line.split()[-1])


def bench_real_cpu_capture(name: str, path: Path, repeat: int, tmp: Path) -> bool:
    """The host graph CLI on a real JAX CPU capture against XProf's ``trace_viewer``,
    both whole processes, and the start-up floors, taken in turn (a shared machine's load
    drifts over all of them); the first round is a warm-up."""
    ours = _child(["mlprof", str(path)])
    print(
        f"\n[real JAX CPU capture: {name}] {ours['events']:,.0f} events, "
        f"{path.stat().st_size / 2**10:.0f} KiB"
    )
    one_blas_thread = {"OPENBLAS_NUM_THREADS": "1"}  # as the CLI imports numpy
    processes: dict[str, Callable[[], tuple[float, float]]] = {
        "mlprof flamegraph --kind host": lambda: _cli(path, tmp / "real.folded", "--kind", "host"),
        "xprof trace_viewer": lambda: _xprof_process(path, "trace_viewer", tmp),
        "floor: python -c pass": lambda: _process(["-c", "pass"]),
        "floor: import numpy": lambda: _process(["-c", "import numpy"], one_blas_thread),
        "floor: + click, xplane_pb2": lambda: _process(
            ["-c", "import numpy, click, exporter.proto.xplane_pb2"], one_blas_thread
        ),
    }
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in processes}
    for i in range(repeat + 1):
        for label, run in processes.items():
            measured = run()
            if i:
                runs[label].append(measured)
    ref_cpu = statistics.median(cpu for cpu, _ in runs["xprof trace_viewer"])
    ref_wall = statistics.median(wall for _, wall in runs["xprof trace_viewer"])
    for label, figures in runs.items():
        cpu = statistics.median(c for c, _ in figures)
        wall = statistics.median(w for _, w in figures)
        print(
            f"{label:<29}: {wall:.3f}s wall, {cpu:.3f}s CPU (whole process, median of "
            f"{repeat}); /trace_viewer wall {wall / ref_wall:.2f}, CPU {cpu / ref_cpu:.2f}"
        )
    cli_wall = statistics.median(wall for _, wall in runs["mlprof flamegraph --kind host"])
    return cli_wall < ref_wall


def bench_real_cpu_captures(repeat: int, tmp: Path) -> list[bool]:
    """Two real captures: the analysis tests' ``compute`` workload (a few thousand host
    events: start-up is most of the process) and one with the Python tracer on (~47k)."""
    small = _real_capture("tests/integration/analysis_workload.py", [str(tmp / "real"), "compute"])
    traced = _real_capture("bench/python_traced_workload.py", [str(tmp / "traced")])
    return [
        bench_real_cpu_capture("compute workload", small, repeat, tmp),
        bench_real_cpu_capture("Python tracer on", traced, repeat, tmp),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small capture only")
    parser.add_argument("--real", action="store_true", help="the real JAX CPU captures only")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median shown)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, path, *rest = args.worker
        sys.path.insert(0, str(ROOT))
        result = worker_mlprof(Path(path)) if kind == "mlprof" else worker_xprof(Path(path), *rest)
        print(json.dumps(result))
        return
    sys.path.insert(0, str(ROOT))
    sizes = {"small": SIZES["small"]} if args.quick else {} if args.real else SIZES
    with tempfile.TemporaryDirectory(prefix="mlprof-bench-") as tmp:
        # Read by the children only (this process read both at its start).
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "bytecode")
        verdicts = [bench_size(n, e, args.repeat, Path(tmp)) for n, e in sizes.items()]
        if not args.quick:
            verdicts += bench_real_cpu_captures(args.repeat, Path(tmp))
    print(
        f"\ntargets: device total equal to op_profile, faster than op_profile, >= "
        f"{TARGET_EVENTS_PER_S / 1e6:.0f}M events/s on the large capture, the real capture's "
        f"host graph CLI faster than trace_viewer -> "
        f"{'PASS' if all(verdicts) else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
