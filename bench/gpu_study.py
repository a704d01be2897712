"""The GPU study's driver: each part in its own process, under its own timeout, inside one
overall budget (5 minutes on the lent machine). ``bench/gpu_study.sh`` installs what the
machine lacks and runs this; see that script and docs/gpu-study.md.

    python bench/gpu_study.py [--out DIR] [--budget S] [--parts a,b] [--dry-run]

Parts, in order (each ``bench/gpu_study_<part>.py``): ``mfu``, ``torch``, ``nvml``,
``device_check``, ``detection``. A part is given the time left minus the least the
parts after it need, capped at its own maximum; it watches that budget itself, and is
killed (its process group) a little after it. A part that fails, hangs or crashes is
recorded as such and the next one runs. Without an NVIDIA GPU (or with ``--dry-run``)
every part runs on the CPU at reduced sizes, and ``xprof`` cannot be imported, as on
the lent machine (a stub that raises ImportError comes first on ``PYTHONPATH``).

Results under ``--out`` (``$OUT`` by default, where the device tool returns files; at
most 8 files come back): ``summary.json`` (per part: status, seconds, check counts,
figures), one ``<part>.json`` per part (every check and figure), ``study.log`` (all
output) and ``samples.tar.gz`` (a JAX GPU capture or two, the torch trace and the
allocator snapshot: real inputs for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_study_part import BENCH, ROOT, has_gpu, stop_group

# name: (least seconds worth starting it with, most it may take)
# detection comes last: it takes captures while its time lasts, so it gets what is left.
PARTS: dict[str, tuple[float, float]] = {
    "mfu": (15.0, 40.0),
    "torch": (20.0, 50.0),
    "nvml": (15.0, 35.0),
    "device_check": (45.0, 100.0),
    "detection": (60.0, 160.0),
}
BUDGET_S = 280.0
# A part's own budget is its allotment less this: the time to write its JSON.
GRACE_S = 8.0
# A part past its allotment has this long to end after SIGTERM (its children, its JSON).
STOP_S = 4.0
SAMPLES_MAX_BYTES = 15 * 2**20  # the device tool returns files up to 16 MiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = os.environ.get("OUT") or str(ROOT / "bench" / "out" / "gpu-study")
    parser.add_argument("--out", type=Path, default=Path(default_out))
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds, all parts")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--dry-run", action="store_true", help="CPU only, reduced sizes")
    args = parser.parse_args()
    names = [p for p in args.parts.split(",") if p]
    unknown = [p for p in names if p not in PARTS]
    if unknown:
        print(f"gpu_study: unknown parts {unknown} (known: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    gpu = not args.dry_run and has_gpu()
    mode = "gpu" if gpu else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    # A larger budget (a dry run on a loaded machine) gives every part its share of it.
    scale = max(1.0, args.budget / BUDGET_S)
    work = Path(tempfile.mkdtemp(prefix="mlprof-gpu-study-"))
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # parts and neighbours share the GPU
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if not gpu:
        env["JAX_PLATFORMS"] = "cpu"
        env["PYTHONPATH"] = f"{without_xprof(work)}{os.pathsep}{env['PYTHONPATH']}"
    results: dict[str, Any] = {}
    with (args.out / "study.log").open("w") as log:
        say(
            log,
            f"gpu_study: mode {mode} ({'dry run' if not gpu else 'NVIDIA GPU found'}), "
            f"budget {args.budget:.0f} s, parts {', '.join(names)}, work {work}",
        )
        for i, name in enumerate(names):
            later = scale * sum(PARTS[p][0] for p in names[i + 1 :])
            least, most = (scale * s for s in PARTS[name])
            allot = min(most, deadline - time.monotonic() - later)
            if allot < least:
                results[name] = {
                    "status": "skipped",
                    "seconds": 0.0,
                    "why": f"{allot:.0f} s left for it, needs {least:.0f}",
                }
                say(log, f"== {name}: skipped ({results[name]['why']})")
                continue
            results[name] = run(name, mode, allot, work / name, args.out, env, log)
        tar_samples(work, args.out / "samples.tar.gz", log)
        spent = args.budget - (deadline - time.monotonic())
        summary = {
            "mode": mode,
            "budget_s": args.budget,
            "seconds": round(spent, 1),
            "parts": results,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        report(log, summary)
    return 0


def without_xprof(work: Path) -> Path:
    """A directory whose ``xprof`` package refuses to import: the lent machine has none."""
    stub = work / "without-xprof" / "xprof"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        'raise ImportError("xprof is not on the lent machine (the GPU study\'s dry run)")\n'
    )
    return stub.parent


def say(log: TextIO, line: str) -> None:
    print(line, flush=True)
    log.write(line + "\n")
    log.flush()


def run(
    name: str, mode: str, allot: float, work: Path, out: Path, env: dict[str, str], log: TextIO
) -> dict[str, Any]:
    say(log, f"\n== {name}: up to {allot:.0f} s")
    path = out / f"{name}.json"
    path.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(BENCH / f"gpu_study_{name}.py"),
        "--json",
        str(path),
        "--mode",
        mode,
        "--budget",
        f"{allot - GRACE_S:.0f}",
        "--work",
        str(work),
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            say(log, raw.decode(errors="replace").rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = "ok"
    try:
        proc.wait(timeout=allot)
    except subprocess.TimeoutExpired:
        status = "timeout"
    stop_group(proc, STOP_S)  # the part, past its time, and any child it left behind
    reader.join(timeout=5)
    seconds = round(time.monotonic() - started, 1)
    result: dict[str, Any] = {"status": status, "seconds": seconds, "rc": proc.returncode}
    try:
        part = json.loads(path.read_text())
    except (OSError, ValueError):
        result["status"] = status if status != "ok" else "no result"
        say(log, f"== {name}: {result['status']} after {seconds} s (no {path.name})")
        return result
    counts = part["counts"]
    if status == "ok" and counts.get("FAIL"):
        result["status"] = "failed checks"
    result.update({"counts": counts, "figures": brief(name, part["figures"])})
    say(log, f"== {name}: {result['status']} in {seconds} s: {counts}")
    return result


def brief(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader wants first (all of them are in <part>.json)."""
    if name == "detection":
        out: dict[str, Any] = {}
        for view in ("step", "device"):
            if view in figures:
                v = figures[view]
                out[view] = {
                    "floors_in_force": v["floors_in_force"],
                    "floors_measured": v["floors_measured"],
                    "curve": {
                        k: f"{c['forward']}/{c['comparisons']} fwd, {c['reverse']}/"
                        f"{c['comparisons']} rev, any {c['any']}/{c['orientations']}"
                        for k, c in v["curve"].items()
                    },
                }
        return out
    if name == "nvml":
        return {k: v for k, v in figures.items() if k != "pairs"}
    if name == "device_check":
        return {k: v for k, v in figures.items() if k != "log_tail"}
    return figures


def tar_samples(work: Path, target: Path, log: TextIO) -> None:
    files = sorted(p for p in work.glob("*/samples/*") if p.is_file())
    kept, size = [], 0
    for path in files:
        if size + path.stat().st_size <= SAMPLES_MAX_BYTES:
            kept.append(path)
            size += path.stat().st_size
    with tarfile.open(target, "w:gz") as tar:
        for path in kept:
            tar.add(path, arcname=f"{path.parent.parent.name}/{path.name}")
    left = [p.name for p in files if p not in kept]
    say(
        log,
        f"\nsamples: {len(kept)} files ({size / 2**20:.1f} MiB) in {target.name}"
        + (f"; left out (size): {left}" if left else ""),
    )


def report(log: TextIO, summary: dict[str, Any]) -> None:
    say(
        log,
        f"\n== GPU study ({summary['mode']}): {summary['seconds']} s of {summary['budget_s']:.0f}",
    )
    say(log, f"  {'part':14s}{'status':16s}{'seconds':>8s}   checks")
    for name, r in summary["parts"].items():
        counts = r.get("counts") or {}
        text = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or r.get("why", "")
        say(log, f"  {name:14s}{r['status']:16s}{r['seconds']:8.1f}   {text}")


if __name__ == "__main__":
    sys.exit(main())
