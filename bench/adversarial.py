"""Benchmark: hostile input shapes through ``mlprof flamegraph``, before and after.

The shapes of issue 11 (A.2), each converted by a whole ``mlprof flamegraph`` process
(CPU seconds and peak RSS), for this checkout and, with ``--before REV``, for the
``exporter`` package of another git revision in the same run (ratios printed):

- ``many-programs`` (N = 6,000 and 20,000): a device plane with N programs x N distinct
  ops, placed by their ``XLA Modules`` runs (the old reader asked ``np.bincount`` for
  programs x ops cells: 3 GiB at N = 20,000);
- ``nested-host``: one host thread with events nested 20,000 deep;
- ``deep-pprof``: a memory pprof with 3,000 stacks, one of each depth up to 3,000.

Costs must grow with the input (events + distinct frames), not with its square. Runs
of the old code are capped (``--timeout``, ``--max-rss-gib``) and reported as such.

    .venv/bin/python bench/adversarial.py --before 85a02fe
    .venv/bin/python bench/adversarial.py --quick      # smaller shapes, seconds
"""

from __future__ import annotations

import argparse
import gzip
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300
# The child: run the CLI from the given code root and report its own peak RSS at exit
# (RUSAGE_CHILDREN's ru_maxrss is the largest child so far, not this one).
_CHILD = (
    "import atexit, sys\n"
    "def peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    print('PEAK_KB', status.split('VmHWM:')[1].split()[0], file=sys.stderr)\n"
    "atexit.register(peak)\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "from exporter.cli import main\n"
    "main()\n"
)


def _device_many_programs(path: Path, n: int) -> None:
    from exporter.proto import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/device:TPU:0")
    base_ns = time.time_ns() - 60 * 10**9
    modules = plane.lines.add(id=1, name="XLA Modules", timestamp_ns=base_ns)
    ops = plane.lines.add(id=2, name="XLA Ops", timestamp_ns=base_ns)
    for i in range(n):
        meta = plane.event_metadata[i + 1]
        meta.id, meta.name = i + 1, f"jit_f{i}({i})"
    first_op = 1 << 20
    for j in range(n):
        meta = plane.event_metadata[first_op + j]
        meta.id, meta.name = first_op + j, f"fusion.{j}"
    for i in range(n):  # each program runs two ops; ops carry no program_id
        t = i * 3000
        modules.events.add(metadata_id=i + 1, offset_ps=t, duration_ps=2000)
        ops.events.add(metadata_id=first_op + (i * 7919) % n, offset_ps=t, duration_ps=1000)
        ops.events.add(metadata_id=first_op + (i * 104729 + 1) % n, offset_ps=t + 1000,
                       duration_ps=1000)  # fmt: skip
    path.write_bytes(space.SerializeToString())


def _host_nested(path: Path, depth: int) -> None:
    from exporter.proto import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    line = plane.lines.add(id=1, name="python", timestamp_ns=time.time_ns() - 60 * 10**9)
    for j in range(depth):  # event j holds event j + 1
        meta = plane.event_metadata[j + 1]
        meta.id, meta.name = j + 1, f"$mod.py:{j} f{j}"
        line.events.add(
            metadata_id=j + 1, offset_ps=j * 1000, duration_ps=(2 * depth - 2 * j) * 1000
        )
    path.write_bytes(space.SerializeToString())


def _deep_pprof(path: Path, depth: int) -> None:
    from exporter.proto import profile_pb2

    profile = profile_pb2.Profile()
    profile.string_table.extend(["", "allocations", "count", "space", "bytes", "deep.py"])
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    for j in range(depth):
        profile.string_table.append(f"f{j}")
        profile.function.add(id=j + 1, name=6 + j, system_name=6 + j, filename=5, start_line=j + 1)
        profile.location.add(id=j + 1).line.add(function_id=j + 1, line=j + 2)
    for k in range(1, depth + 1):  # one stack of each depth: f0 -> f1 -> ... -> f(k-1)
        profile.sample.add(location_id=list(range(k, 0, -1)), value=[1, 1024])
    path.write_bytes(gzip.compress(profile.SerializeToString(), 9))


def _run(code_root: Path, path: Path, max_rss_gib: float, timeout: float) -> str:
    """'cpu s, peak MiB' of one mlprof flamegraph process, or why it did not finish."""
    limit = int(max_rss_gib * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(code_root), "flamegraph", str(path),
             "-o", str(path.with_suffix(".folded"))],
            capture_output=True, text=True, timeout=timeout, preexec_fn=cap, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"did not finish in {timeout:.0f}s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peaks = [int(x.split()[1]) for x in done.stderr.splitlines() if x.startswith("PEAK_KB ")]
    peak = peaks[-1] / 1024 if peaks else float("nan")
    if done.returncode != 0:
        lines = [x for x in done.stderr.strip().splitlines() if not x.startswith("PEAK_KB ")]
        last = (lines or ["?"])[-1][:120]
        return f"failed after {time.perf_counter() - start:.1f}s: {last}"
    return f"{cpu:.2f}s CPU, peak RSS {peak:.0f} MiB"


def _old_tree(rev: str, tmp: Path) -> Path:
    out = tmp / f"before-{rev}"
    out.mkdir()
    archive = subprocess.run(
        ["git", "archive", rev, "exporter"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="also run this git revision's code")
    parser.add_argument("--quick", action="store_true", help="smaller shapes")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run")
    parser.add_argument("--max-rss-gib", type=float, default=4.0, help="memory cap per run")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    scale = 4 if args.quick else 1
    shapes = {
        "many-programs": (_device_many_programs, 6000 // scale, "xplane.pb"),
        "many-programs-large": (_device_many_programs, 20_000 // scale, "xplane.pb"),
        "nested-host": (_host_nested, 20_000 // scale, "xplane.pb"),
        "deep-pprof": (_deep_pprof, 3000 // scale, "pprof.gz"),
    }
    with tempfile.TemporaryDirectory(prefix="mlprof-adversarial-") as tmp_dir:
        tmp = Path(tmp_dir)
        old = _old_tree(args.before, tmp) if args.before else None
        for name, (make, size, suffix) in shapes.items():
            path = tmp / f"{name}.{suffix}"
            make(path, size)
            now = _run(ROOT, path, args.max_rss_gib, args.timeout)
            print(f"{name} (n={size}, {path.stat().st_size / 1024:.0f} KiB)")
            print(f"  this checkout : {now}")
            if old is not None:
                then = _run(old, path, args.max_rss_gib, args.timeout)
                print(f"  {args.before:<13} : {then}")


if __name__ == "__main__":
    main()
