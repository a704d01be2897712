"""Benchmark: analysis and comparison against the project's conversion and XProf's tools.

On a synthetic TPU-shaped capture (2 million op events by default) and on a real JAX CPU
capture, each in a fresh child process (wall time, peak RSS):

* ``convert``: the project's own flame-graph conversion of the file (device + host),
  the reference the analysis is held to (aim: analysis within 2x of it); this and
  ``analyze`` are the median of three runs;
* ``analyze``: ``mlprof analyze`` without XProf (facts, step breakdown, rules, graphs);
* ``compare``: two captures of the same shape, per step (every step a sample);
* ``analyze + XProf``: the same with the XProf converters the report runs on this
  capture (``xprof_tools.plan_tools``; none over ``XPROF_MAX_CAPTURE_MB``), CPU seconds
  of mlprof and of the converters' child together;
* each converter the report runs, alone in its own child (CPU seconds, peak RSS), beside
  mlprof's own analysis of the same capture in the same run (ratios).

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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 2.0  # analysis time / conversion time


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(who: int) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def worker(kind: str, paths: list[Path]) -> dict[str, Any]:
    """One measurement in this fresh process (imports done before the clock starts)."""
    sys.path.insert(0, str(ROOT))
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.facts.xprof_tools import run_xprof_tools
    from exporter.analysis.report.document import analyze
    from exporter.analysis.sides.load import load_side
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

    started = time.perf_counter()
    cpu = _cpu_s(resource.RUSAGE_SELF)
    if kind == "convert":
        with load_capture(paths[0]) as capture:
            device_flamegraph(capture)
            host_flamegraph(capture)
    elif kind in ("analyze", "analyze_xprof"):
        report = analyze(str(paths[0]), xprof=kind == "analyze_xprof")
        assert report.facts.steps is not None
        if kind == "analyze_xprof":
            answer = report.facts.xprof
            return {
                "seconds": time.perf_counter() - started,
                "cpu_s": _cpu_s(resource.RUSAGE_SELF) - cpu + _cpu_s(resource.RUSAGE_CHILDREN),
                "peak_rss_mib": _peak_rss_mib(),
                "child_peak_rss_mib": _children_rss_mib(),
                "asked": answer.get("asked", []),
                "over_limit": report.facts.unavailable.get("xprof", "")
                if answer.get("capture_mb", 0) > answer.get("limit_mb", 0)
                else "",
                "available": bool(answer.get("available")),
            }
    elif kind == "compare":
        compare_sides(load_side(str(paths[0])), load_side(str(paths[1])))
    elif kind.startswith("xprof:"):
        tool = kind.removeprefix("xprof:")
        answer = run_xprof_tools(paths[:1], (tool,), timeout_s=600)
        error = (answer.get("tools") or {}).get(tool, {}).get("error")
        if not answer.get("available") or error:
            raise SystemExit(f"XProf {tool}: {answer.get('reason') or error}")
        return {
            "seconds": time.perf_counter() - started,
            "cpu_s": _cpu_s(resource.RUSAGE_CHILDREN),
            "peak_rss_mib": _children_rss_mib(),
        }
    return {
        "seconds": time.perf_counter() - started,
        "cpu_s": _cpu_s(resource.RUSAGE_SELF) - cpu,
        "peak_rss_mib": _peak_rss_mib(),
    }


def _children_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def child(kind: str, *paths: Path) -> dict[str, Any]:
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


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
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
        f"  analyze : {analyze['seconds']:.2f}s ({analyze['cpu_s']:.2f}s CPU), peak RSS "
        f"{analyze['peak_rss_mib']:.0f} MiB = {ratio:.2f}x convert (aim <= {TARGET_RATIO:g}x)"
    )
    print(
        f"  compare : {compare['seconds']:.2f}s, peak RSS {compare['peak_rss_mib']:.0f} MiB "
        f"for two captures = {compare['seconds'] / convert['seconds']:.2f}x one convert"
    )
    if xprof:
        measure_xprof(a, analyze)
    return ratio <= TARGET_RATIO


def measure_xprof(path: Path, analyze: dict[str, Any]) -> None:
    """The converters the report runs, each alone, against mlprof's analysis (same run)."""
    full = child("analyze_xprof", path)
    if full["over_limit"]:
        print(f"  XProf   : none run: {full['over_limit']}")
    cpu, rss = analyze["cpu_s"], analyze["peak_rss_mib"]
    print(f"  XProf converters the report runs ({len(full['asked'])}), each in its own child:")
    for tool in full["asked"]:
        one = child(f"xprof:{tool}", path)
        print(
            f"    {tool:<24}: {one['cpu_s']:6.2f}s CPU, peak RSS {one['peak_rss_mib']:6.0f} MiB"
            f" = {one['cpu_s'] / cpu:5.2f}x mlprof analyze's CPU, "
            f"{one['peak_rss_mib'] / rss:5.2f}x its peak RSS "
            f"({one['peak_rss_mib'] * 2**20 / path.stat().st_size:.1f}x the capture's size)"
        )
    print(
        f"  analyze : {cpu:.2f}s CPU without the converters, {full['cpu_s']:.2f}s with them "
        f"(mlprof and the converters' children) = {full['cpu_s'] / cpu:.2f}x; peak RSS "
        f"{rss:.0f} MiB without, with them {full['peak_rss_mib']:.0f} MiB and "
        f"{full['child_peak_rss_mib']:.0f} MiB in the largest child"
        + ("" if full["available"] or not full["asked"] else " (XProf did not answer)")
    )


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
    from exporter.testing.synthetic import write_tpu_capture

    events = 100_000 if args.quick else args.events
    devices, ops_per_step = 4, 10_000 if events >= 400_000 else 1_000
    steps = max(1, -(-events // (devices * ops_per_step)))
    ok = True
    with tempfile.TemporaryDirectory(prefix="mlprof-bench-analysis-") as tmp:
        synthetic = [Path(tmp) / f"s{seed}" / "tpu-vm-0.xplane.pb" for seed in (0, 1)]
        for seed, path in enumerate(synthetic):
            made = write_tpu_capture(  # the shape of issue 20's figures
                path,
                devices=devices,
                steps=steps,
                ops_per_step=ops_per_step,
                seed=seed,
                while_every=50,
                while_body=8,
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
