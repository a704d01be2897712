"""Benchmark: PyTorch CUDA memory snapshot -> memory pprof, against a bare ``pickle.load``.

Writes a snapshot shaped like a real one (Python and C++ stacks, every block state, a
history of alloc/free events: ~20 MB by default), then measures in fresh child processes:

- reference: ``pickle.load`` of the file, unrestricted (what ``_memory_viz`` does first);
- mlprof in-process: restricted unpickling + conversion + serialising (``convert_file``);
- mlprof as the sidecar runs it: ``torch_memory_pprof`` (a limited child process).

Each prints seconds and peak RSS with its ratio to the reference. Targets: conversion
<= 2x the bare unpickle's time and <= 1.5x its peak RSS (the restrictions and the walk
over blocks must cost less than reading the file at all).

    .venv/bin/python bench/torch_memory.py            # 50k blocks, 100k events
    .venv/bin/python bench/torch_memory.py --quick    # 5k blocks, 5k events, seconds

The quick snapshot is mostly blocks, the walk over which is Python: expect the time
target missed there; real snapshots are mostly history events, which only unpickle.
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_TIME_RATIO = 2.0
TARGET_RSS_RATIO = 1.5


def _peak_rss_mib() -> float:
    """VmHWM of this process (``ru_maxrss`` carries the parent's over across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker(kind: str, path: Path) -> dict[str, float]:
    if kind == "pickle":
        start = time.perf_counter()
        with path.open("rb") as handle:
            pickle.load(handle)  # the benchmark's own file
    elif kind == "inprocess":
        from exporter.profiles.torch_memory import convert_file

        start = time.perf_counter()
        convert_file(path)
    else:
        from exporter.profiles.torch_memory import torch_memory_pprof

        start = time.perf_counter()
        torch_memory_pprof(path)
        seconds = time.perf_counter() - start
        # The converter's own peak: the largest waited-for child (KiB on Linux).
        child_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {"seconds": seconds, "peak_rss_mib": child_mib}
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": _peak_rss_mib()}


def _child(kind: str, path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", kind, str(path)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5k blocks: a smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("path", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.worker:
        print(json.dumps(worker(args.worker, args.path)))
        return

    from tests.torch_snapshots import random_snapshot

    blocks, events = (5_000, 5_000) if args.quick else (50_000, 100_000)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "snapshot.pickle"
        path.write_bytes(pickle.dumps(random_snapshot(1, blocks, 4, events)))
        size_mib = path.stat().st_size / 2**20
        print(f"snapshot: {blocks} blocks, {events} trace events, {size_mib:.1f} MiB")
        runs = {
            kind: min((_child(kind, path) for _ in range(args.repeat)), key=lambda r: r["seconds"])
            for kind in ("pickle", "inprocess", "sidecar")
        }
    reference = runs["pickle"]
    for kind, label in (
        ("pickle", "pickle.load (reference)"),
        ("inprocess", "mlprof convert_file"),
        ("sidecar", "mlprof torch_memory_pprof (child)"),
    ):
        result = runs[kind]
        print(
            f"{label:36s} {result['seconds']:7.3f} s "
            f"({result['seconds'] / reference['seconds']:.2f}x)  "
            f"peak RSS {result['peak_rss_mib']:7.1f} MiB "
            f"({result['peak_rss_mib'] / reference['peak_rss_mib']:.2f}x)"
        )
    ours = runs["inprocess"]
    time_ratio = ours["seconds"] / reference["seconds"]
    rss_ratio = ours["peak_rss_mib"] / reference["peak_rss_mib"]
    met = {True: "met", False: "MISSED"}
    print(
        f"targets: time <= {TARGET_TIME_RATIO}x: {met[time_ratio <= TARGET_TIME_RATIO]}, "
        f"peak RSS <= {TARGET_RSS_RATIO}x: {met[rss_ratio <= TARGET_RSS_RATIO]}"
    )


if __name__ == "__main__":
    main()
