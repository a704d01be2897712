"""Benchmark: XProf capture -> flame graphs (device + host) -> pprof, against XProf.

Generates a synthetic TPU-shaped capture (>= 2 million events by default), converts it
with mlprof in a child process (events/s, peak RSS), converts the same file with XProf's
own converter (``xspace_to_tool_data([...], "trace_viewer", ...)``) in another child, and
prints the figures and ratios. Targets: >= 1M events/s, faster than XProf, peak RSS
growth <= 2x the file size.

    .venv/bin/python bench/convert.py            # 2M events, a minute or two
    .venv/bin/python bench/convert.py --quick    # 100k events, seconds
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_EVENTS_PER_S = 1_000_000
TARGET_RSS_RATIO = 2.0


def _status_mib(field: str) -> float:
    """A /proc/self/status memory field in MiB (VmRSS now, VmHWM peak since exec).

    ``ru_maxrss`` is not used: Linux carries it over from the parent across exec.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss_mib() -> float:
    return _status_mib("VmHWM")


def _rss_mib() -> float:
    return _status_mib("VmRSS")


def worker_mlprof(path: Path) -> dict[str, float]:
    """Convert in this (fresh) process; report time and memory."""
    from exporter.profiles.pprof import encode_pprof
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

    baseline = _rss_mib()
    start = time.perf_counter()
    capture = load_capture(path)
    device = device_flamegraph(capture)
    host = host_flamegraph(capture)
    sizes = [len(encode_pprof(g)) for g in (device, host) if g is not None]
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "events": capture.events_read,
        "baseline_rss_mib": baseline,  # after imports
        "peak_rss_mib": _peak_rss_mib(),
        "pprof_bytes": sum(sizes),
        "device_nodes": device.node_count if device else 0,
    }


def worker_xprof(path: Path) -> dict[str, float]:
    """XProf's trace_viewer conversion of the same file, in this (fresh) process."""
    from xprof.convert import raw_to_tool_data

    baseline = _rss_mib()
    start = time.perf_counter()
    data, _ = raw_to_tool_data.xspace_to_tool_data(
        [str(path)], "trace_viewer", {"use_saved_result": False}
    )
    seconds = time.perf_counter() - start
    if not data:
        raise SystemExit("xprof produced no trace_viewer data")
    return {
        "seconds": seconds,
        "baseline_rss_mib": baseline,  # after imports
        "peak_rss_mib": _peak_rss_mib(),
        "output_bytes": len(data),
    }


def _child(kind: str, path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", kind, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k events: a smoke run")
    parser.add_argument("--events", type=int, default=2_000_000, help="op events to generate")
    parser.add_argument("--repeat", type=int, default=3, help="mlprof runs (median is shown)")
    parser.add_argument("--no-xprof", action="store_true", help="skip the XProf reference")
    parser.add_argument("--worker", choices=["mlprof", "xprof"], help=argparse.SUPPRESS)
    parser.add_argument("path", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        fn = worker_mlprof if args.worker == "mlprof" else worker_xprof
        print(json.dumps(fn(args.path)))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from exporter.profiles.synthetic import write_tpu_capture

    events = 100_000 if args.quick else args.events
    devices, ops_per_step = 4, 10_000 if events >= 400_000 else 1_000
    steps = max(1, -(-events // (devices * ops_per_step)))
    with tempfile.TemporaryDirectory(prefix="mlprof-bench-") as tmp:
        path = Path(tmp) / "mlprof" / "tpu-vm-0.xplane.pb"
        start = time.perf_counter()
        synthetic = write_tpu_capture(
            path, devices=devices, steps=steps, ops_per_step=ops_per_step, distinct_ops=400
        )
        size_mib = path.stat().st_size / 2**20
        event_count = synthetic.event_count
        del synthetic  # the children measure memory; keep the parent small
        print(
            f"capture: {event_count:,} events, {size_mib:.1f} MiB, {devices} TPU "
            f"planes x {steps} steps (generated in {time.perf_counter() - start:.1f}s)"
        )
        runs = [_child("mlprof", path) for _ in range(max(1, args.repeat))]
        seconds = statistics.median(r["seconds"] for r in runs)
        ours = runs[0]
        rate = ours["events"] / seconds
        growth = max(r["peak_rss_mib"] - r["baseline_rss_mib"] for r in runs)
        print(
            f"mlprof : {seconds:.3f}s (median of {len(runs)}), {rate / 1e6:.2f}M events/s, "
            f"peak RSS {ours['peak_rss_mib']:.0f} MiB (+{growth:.0f} MiB over the "
            f"{ours['baseline_rss_mib']:.0f} MiB interpreter = {growth / size_mib:.2f}x file), "
            f"pprof {ours['pprof_bytes'] / 1024:.0f} KiB"
        )
        ok = rate >= TARGET_EVENTS_PER_S and growth <= TARGET_RSS_RATIO * size_mib
        if not args.no_xprof:
            copy = Path(tmp) / "xprof" / path.name  # a fresh dir: XProf caches beside it
            copy.parent.mkdir()
            shutil.copy(path, copy)
            ref = _child("xprof", copy)
            print(
                f"xprof  : {ref['seconds']:.3f}s trace_viewer, "
                f"{ours['events'] / ref['seconds'] / 1e6:.2f}M events/s, peak RSS "
                f"{ref['peak_rss_mib']:.0f} MiB, output {ref['output_bytes'] / 2**20:.0f} MiB"
            )
            ratio = ref["seconds"] / seconds
            print(f"ratio  : mlprof is {ratio:.1f}x faster than XProf's converter")
            ok = ok and ratio > 1
        # Host-only (CPU) capture: nested Python-tracer events, the slower per-event path.
        host_path = Path(tmp) / "host" / "cpu-vm-0.xplane.pb"
        host_steps = max(1, events // 12)
        host_events = write_tpu_capture(host_path, devices=0, steps=host_steps).event_count
        host_runs = [_child("mlprof", host_path) for _ in range(max(1, args.repeat))]
        host_seconds = statistics.median(r["seconds"] for r in host_runs)
        host_rate = host_events / host_seconds
        print(
            f"host   : {host_events:,} nested host events in {host_seconds:.3f}s, "
            f"{host_rate / 1e6:.2f}M events/s (CPU capture, no device planes)"
        )
        verdict = "PASS" if ok else "FAIL"
        if args.quick:
            verdict += " (smoke run: fixed overheads dominate; the targets are for --events 2M)"
        print(
            f"targets: >= {TARGET_EVENTS_PER_S / 1e6:.0f}M events/s, faster than XProf, RSS "
            f"growth <= {TARGET_RSS_RATIO:g}x file -> {verdict}"
        )


if __name__ == "__main__":
    main()
