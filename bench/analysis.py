"""Benchmark: analysis and comparison against the project's conversion and XProf's tools.

On a synthetic TPU-shaped capture (2 million op events by default) and on a real JAX CPU
capture, each in a fresh child process (wall time, peak RSS):

* ``convert``: the project's own flame-graph conversion of the file (device + host),
  the reference the analysis is held to (aim: analysis within 2x of it); this and
  ``analyze`` are the median of three runs;
* ``analyze``: ``mlprof analyze`` without XProf (facts, step breakdown, rules, graphs);
* ``compare``: two captures of the same shape, per step (every step a sample);
* ``xprof``: XProf's converters that a report runs (overview_page,
  input_pipeline_analyzer, framework_op_stats, hlo_stats, memory_profile,
  roofline_model) on the same file, in the same run.

    .venv/bin/python bench/analysis.py            # 2M events + a real capture, minutes
    .venv/bin/python bench/analysis.py --quick    # 100k events, no real capture
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 2.0  # analysis time / conversion time


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker(kind: str, paths: list[Path]) -> dict[str, float]:
    """One measurement in this fresh process (imports done before the clock starts)."""
    sys.path.insert(0, str(ROOT))
    from exporter.analysis.compare import compare_sides
    from exporter.analysis.report import analyze
    from exporter.analysis.sides import load_side
    from exporter.analysis.xprof_tools import run_xprof_tools
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

    if kind == "compare":
        import scipy.stats  # noqa: F401  (the rank test's import is not the comparison)
    started = time.perf_counter()
    if kind == "convert":
        with load_capture(paths[0]) as capture:
            device_flamegraph(capture)
            host_flamegraph(capture)
    elif kind == "analyze":
        report = analyze(str(paths[0]), xprof=False)
        assert report.facts.steps is not None
    elif kind == "compare":
        compare_sides(load_side(str(paths[0])), load_side(str(paths[1])))
    elif kind == "xprof":
        answer = run_xprof_tools(paths[:1], timeout_s=600)
        if not answer.get("available"):
            raise SystemExit(f"XProf: {answer.get('reason')}")
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {"seconds": time.perf_counter() - started, "peak_rss_mib": children}
    return {"seconds": time.perf_counter() - started, "peak_rss_mib": _peak_rss_mib()}


def child(kind: str, *paths: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", kind, *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def measure(label: str, a: Path, b: Path, xprof: bool, repeat: int = 3) -> bool:
    # convert and analyze alternate, so a slow spell of a shared machine hits both alike;
    # each figure is the run of median wall time
    pairs = [(child("convert", a), child("analyze", a)) for _ in range(repeat)]
    convert = _median([c for c, _ in pairs])
    analyze = _median([r for _, r in pairs])
    compare = child("compare", a, b)
    ratio = analyze["seconds"] / convert["seconds"]
    print(f"{label}:")
    print(
        f"  convert : {convert['seconds']:.2f}s, peak RSS {convert['peak_rss_mib']:.0f} MiB "
        "(reference)"
    )
    print(
        f"  analyze : {analyze['seconds']:.2f}s, peak RSS {analyze['peak_rss_mib']:.0f} MiB "
        f"= {ratio:.2f}x convert (aim <= {TARGET_RATIO:g}x)"
    )
    print(
        f"  compare : {compare['seconds']:.2f}s, peak RSS {compare['peak_rss_mib']:.0f} MiB "
        f"for two captures = {compare['seconds'] / convert['seconds']:.2f}x one convert"
    )
    if xprof:
        ref = child("xprof", a)
        print(
            f"  xprof   : {ref['seconds']:.2f}s for its six tools, peak RSS "
            f"{ref['peak_rss_mib']:.0f} MiB; analyze is "
            f"{ref['seconds'] / analyze['seconds']:.2f}x faster than XProf"
        )
    return ratio <= TARGET_RATIO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k events, no real capture")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--no-xprof", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.paths)))
        return
    sys.path.insert(0, str(ROOT))
    from exporter.profiles.synthetic import write_tpu_capture

    events = 100_000 if args.quick else args.events
    devices, ops_per_step = 4, 10_000 if events >= 400_000 else 1_000
    steps = max(1, -(-events // (devices * ops_per_step)))
    ok = True
    with tempfile.TemporaryDirectory(prefix="mlprof-bench-analysis-") as tmp:
        synthetic = [Path(tmp) / f"s{seed}" / "tpu-vm-0.xplane.pb" for seed in (0, 1)]
        for seed, path in enumerate(synthetic):
            made = write_tpu_capture(
                path, devices=devices, steps=steps, ops_per_step=ops_per_step, seed=seed
            )
        print(
            f"synthetic: {made.event_count:,} events, {devices} TPU planes x {steps} steps, "
            f"{synthetic[0].stat().st_size / 2**20:.1f} MiB"
        )
        ok &= measure("synthetic TPU capture", *synthetic, xprof=not args.no_xprof)
        if not args.quick:
            workload = ROOT / "tests" / "integration" / "analysis_workload.py"
            real = []
            for name in ("a", "b"):
                done = subprocess.run(
                    [sys.executable, str(workload), str(Path(tmp) / name), "compute"],
                    capture_output=True,
                    text=True,
                    check=False,
                    env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
                )
                if done.returncode != 0:
                    print(f"real capture skipped (JAX workload failed: {done.stderr[-300:]})")
                    break
                line = next(x for x in done.stdout.splitlines() if x.startswith("DONE"))
                real.append(Path(line.split()[2]))
            if len(real) == 2:
                print(f"real JAX CPU capture: {real[0].stat().st_size / 1024:.0f} KiB")
                # Informative: on a capture this small fixed costs dominate both sides.
                measure("real JAX CPU capture", *real, xprof=not args.no_xprof)
    verdict = "PASS" if ok else "FAIL"
    if args.quick:
        verdict += " (smoke run: the target is for --events 2M)"
    print(
        f"target: analysis of the synthetic capture within {TARGET_RATIO:g}x of its "
        f"conversion -> {verdict}"
    )


if __name__ == "__main__":
    main()
