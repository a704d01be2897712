"""GPU study part ``detection``: JAX GPU captures in separate processes -> the detection curve
and the device-plane floors (issue 29's last paragraph).

Every capture is its own process of ``gpu_study_workload.py`` (XProf trace, K % of the
step calibrated in that process), taken round-robin so the machine's drift falls on
all variants alike, as ``bench/detection.py`` takes them: the unchanged workload x6;
new work (``extra_work``) at 2, 5 and 10 %; the step's own loop grown by 10 %; the data
phase +10 %; and the unchanged workload beside a GPU-hogging neighbour (``--hog``). A
persistent compilation cache spares each process but the first its compile. Captures
stop when the part's budget runs low (the schedule puts one of each change first).

Then, for the step view (the default: device work and host phases) and the device view
alone, ``compare_sides`` on every pair, both orientations (``bench/detection.py``'s
reading, and its ``draws`` for 2 captures a side):

- the curve: each change vs each unchanged capture, detected when the top regression
  (forward) or improvement (reverse) names it; the unchanged pairs' false-alarm rate
  (any verdict: ``detection.any_verdict``);
- the floors the unchanged pairs measure, beside the ones in force
  (``exporter/analysis/compare/noise.py``: device 1 % new, 2 % grown, 5 % step; guesses
  until now): the step ratio's spread, the largest *significant* excess of a new frame
  and of a grown one (what a floor must stay above to keep same-workload pairs quiet);
- the neighbour: what a comparison says of an unchanged workload on a shared GPU.

Dry run: the same on JAX CPU (``--size cpu``), 3 unchanged captures; there the device
view is the XLA host view.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import detection  # bench/detection.py: draws, any_verdict
from gpu_study_part import BENCH, ROOT, Part, run_part, wait_line

sys.path.insert(0, str(ROOT))
WORKLOAD = BENCH / "gpu_study_workload.py"
# One of each change first: a budget that runs out still leaves every change measured.
SCHEDULE_GPU = (
    ("same", 0.0),
    ("added", 5.0),
    ("same", 0.0),
    ("grown", 10.0),
    ("same", 0.0),
    ("input", 10.0),
    ("same", 0.0),
    ("added", 2.0),
    ("same", 0.0),
    ("added", 10.0),
    ("same", 0.0),
    ("neighbour", 0.0),
)
# The dry run's: three unchanged captures, not six.
SCHEDULE_CPU = tuple(c for i, c in enumerate(SCHEDULE_GPU) if i not in (6, 8, 10))
# What a detection must name, anywhere in the top entry's frame path.
NAMES = {
    "added": re.compile(r"extra_work"),
    "grown": re.compile(r"block_step.*while|while.*block_step", re.I),
    "input": re.compile(r"load_batch"),
}
VIEWS = {"step": None, "device": "device"}
# Kept for the evaluation (loading and comparing the captures): this share of the part's
# budget, at most EVAL_RESERVE_S (12 GPU captures, 2 views: ~250 comparisons).
EVAL_RESERVE_S = 40.0
EVAL_SHARE = 0.3
CAPTURE_TIMEOUT_S = 90.0
_SEED = 20261205


def child_env(part: Part) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # the neighbour shares the GPU's memory
        "JAX_COMPILATION_CACHE_DIR": str(part.work / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    if not part.gpu:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def reserve_s(part: Part) -> float:
    return min(EVAL_RESERVE_S, EVAL_SHARE * part.budget_s)


def capture(part: Part, out: Path, variant: str, k_pct: float) -> dict[str, Any]:
    size = "gpu" if part.gpu else "cpu"
    env = child_env(part)
    hog = None
    arg = "same" if variant == "neighbour" else variant
    try:
        if variant == "neighbour":
            hog = subprocess.Popen(
                [sys.executable, str(WORKLOAD), "--hog", str(CAPTURE_TIMEOUT_S), "--size", size],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            line = wait_line(hog, b"HOGGING", CAPTURE_TIMEOUT_S / 2)
            if b"HOGGING" not in line:
                raise RuntimeError(f"the neighbour did not start: {line[:200]!r}")
        timeout = max(5.0, min(CAPTURE_TIMEOUT_S, part.left_s() - reserve_s(part)))
        done = subprocess.run(
            [sys.executable, str(WORKLOAD), str(out), arg, str(k_pct), "--size", size],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    finally:
        if hog is not None:
            hog.terminate()
            hog.wait(timeout=30)
    if done.returncode:
        raise RuntimeError(f"workload failed: {done.stderr.strip()[-500:]}")
    fields = {x.split()[0]: x.split()[1:] for x in done.stdout.splitlines() if x.strip()}
    path, step_ms, unit_ms, iterations, traced_ms = fields["DONE"]
    return {
        "path": path,
        "variant": variant,
        "k_pct": k_pct,
        "calibrated_step_ms": float(step_ms),
        "unit_ms": float(unit_ms),
        "iterations": int(iterations),
        "traced_step_ms": float(traced_ms),
        "platform": " ".join(fields.get("PLATFORM", [])),
    }


def body(part: Part) -> None:
    schedule = SCHEDULE_GPU if part.gpu else SCHEDULE_CPU
    records: list[dict[str, Any]] = []
    for i, (variant, k) in enumerate(schedule):
        if part.left_s() < reserve_s(part) + 10:
            part.add("INFO", "captures stopped", f"budget: {i} of {len(schedule)} taken")
            break
        started = time.monotonic()
        try:
            record = capture(part, part.work / f"{i:02d}-{variant}-{k:g}", variant, k)
        except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
            part.add("FAIL", f"capture {i} ({variant} {k:g} %)", str(exc)[:300])
            continue
        record["seconds"] = round(time.monotonic() - started, 1)
        records.append(record)
        print(
            f"[detection] capture {i}: {variant} {k:g} %: step {record['traced_step_ms']:.2f}"
            f" ms traced, {record['seconds']} s, {record['platform']}",
            flush=True,
        )
    part.figures["captures"] = records
    same = [r for r in records if r["variant"] == "same"]
    if not part.check(len(same) >= 2, "unchanged captures to compare", f"{len(same)}"):
        return
    if part.gpu:
        part.check(
            all(r["platform"].startswith("gpu") for r in records),
            "captures ran on the GPU",
            records[0]["platform"],
        )
    keep = part.work / "samples"
    keep.mkdir(exist_ok=True)
    for record in (same[0], *[r for r in records if r["variant"] == "added"][:1]):
        shutil.copy(record["path"], keep / f"jax-{record['variant']}-{record['k_pct']:g}.xplane.pb")
    if not part.gpu:
        gpu_shaped(part)
    for view, kind in VIEWS.items():
        if part.left_s() < 5:
            part.add("INFO", f"{view} view", "not evaluated: budget spent")
            continue
        try:
            evaluate(part, view, kind, records)
        except (ValueError, OSError) as exc:
            part.add("FAIL", f"{view} view", f"{type(exc).__name__}: {exc}"[:300])


def evaluate(part: Part, view: str, kind: str | None, records: list[dict[str, Any]]) -> None:
    from exporter.analysis.compare import noise
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import load_side

    started = time.monotonic()
    sides = {r["path"]: load_side(r["path"], kind) for r in records}
    read_s = (time.monotonic() - started) / len(records)
    same = [r for r in records if r["variant"] == "same"]
    if view == "device" and part.gpu:
        check_kernels(part, sides[same[0]["path"]])
    cells: list[tuple[int, str, float, list[dict[str, Any]], list[dict[str, Any]]]] = []
    for a in range(len(same)):
        for b in range(a + 1, len(same)):
            cells.append((1, "same", 0.0, [same[a]], [same[b]]))
    rng = random.Random(_SEED)
    for a_idx, b_idx in detection.draws(rng, list(range(len(same))), None, 2, 10):
        cells.append((2, "same", 0.0, [same[i] for i in a_idx], [same[i] for i in b_idx]))
    for head in records:
        if head["variant"] != "same":
            cells += [(1, head["variant"], head["k_pct"], [s], [head]) for s in same]
    rows: list[dict[str, Any]] = []
    compare_s: list[float] = []
    for n, variant, k, base_records, head_records in cells:
        if part.left_s() < 3:
            part.add("INFO", f"{view} view", f"comparisons stopped at {len(rows)}: budget")
            break
        base = [sides[r["path"]] for r in base_records]
        head = [sides[r["path"]] for r in head_records]
        for orientation, (one, other) in (("forward", (base, head)), ("reverse", (head, base))):
            t0 = time.monotonic()
            result = compare_sides(one, other)
            compare_s.append(time.monotonic() - t0)
            rows.append(reading(result, n, variant, k, orientation))
    noise_view = result.noise_view if rows else view
    floors_in_force = {
        "new_pct": noise.MIN_NEW_STEP_PCT[noise_view],
        "grown_pct": noise.MIN_GROWN_STEP_PCT[noise_view],
        "step_noise_pct": noise.STEP_NOISE_PCT[noise_view],
    }
    summary = summarise(rows)
    measured = floors(rows)
    part.figures[view] = {
        "noise_view": noise_view,
        "floors_in_force": floors_in_force,
        "floors_measured": measured,
        "curve": summary,
        "read_s_per_capture": read_s,
        "compare_s_median": statistics.median(compare_s) if compare_s else None,
        "rows": rows,
    }
    print(
        f"\n[detection] {view} view (noise view {noise_view}; floors in force: new "
        f"{floors_in_force['new_pct']:g} %, grown {floors_in_force['grown_pct']:g} %, "
        f"step x{1 + floors_in_force['step_noise_pct'] / 100:g})"
    )
    print("  n  change        comparisons  forward      reverse      any verdict   excess seen %")
    for label, s in summary.items():
        print(
            f"  {label:16s} {s['comparisons']:6d}     "
            f"{s['forward']:3d} ({s['forward_pct']:3.0f}%)  "
            f"{s['reverse']:3d} ({s['reverse_pct']:3.0f}%)  "
            f"{s['any']:3d}/{s['orientations']:<3d} ({s['any_pct']:3.0f}%)  "
            f"{s['excess_median_pct'] if s['excess_median_pct'] is not None else '-'}"
        )
    print(f"  floors measured on {measured['pairs']} unchanged pairs: {measured}", flush=True)
    false_alarms = summary.get("1 same", {}).get("any", 0)
    part.add(
        "INFO",
        f"{view} view: unchanged pairs with a verdict",
        f"{false_alarms}/{summary.get('1 same', {}).get('orientations', 0)}",
    )
    part.add(
        "INFO",
        f"{view} view: floors measured",
        f"step ratio p95 x{measured['step_ratio_p95']}, largest significant excess: new "
        f"{measured['new_significant_max_pct']} %, grown "
        f"{measured['grown_significant_max_pct']} %",
    )
    part.add(
        "INFO",
        f"{view} view: compare time",
        f"median {1e3 * statistics.median(compare_s):.0f} ms a comparison; reading a "
        f"capture {1e3 * read_s:.0f} ms (reference, same run)",
    )


def gpu_shaped(part: Part) -> None:
    """Dry run: the GPU path of the device view (kernels found, the ``device`` noise view
    and its floors) on synthetic GPU-shaped captures (``exporter/testing/synthetic_gpu.py``)."""
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import load_side
    from exporter.testing.synthetic_gpu import write_gpu_capture

    sides = []
    for seed in (1, 2):
        path = part.work / f"gpu-shaped-{seed}.xplane.pb"
        write_gpu_capture(path, steps=8, seed=seed)
        sides.append(load_side(str(path), "device"))
    check_kernels(part, sides[0])
    result = compare_sides(sides[0], sides[1])
    row = reading(result, 1, "same", 0.0, "forward")
    part.check(
        result.noise_view == "device",
        "GPU-shaped captures compared in the device noise view",
        f"noise view {result.noise_view}, step {row['step_verdict']}, any verdict {row['any']}",
    )


def check_kernels(part: Part, side: Any) -> None:
    from tests.device_check import KERNEL

    names = {frame.name for _, frame in side.whole.paths()}
    kernels = sorted(n for n in names if KERNEL.search(n))
    part.check(
        bool(kernels),
        "device flame graph has GPU kernels",
        f"{len(kernels)} of {len(names)} frames, e.g. {kernels[:3]}",
    )


def reading(result: Any, n: int, variant: str, k: float, orientation: str) -> dict[str, Any]:
    """What one comparison said, as the curve and the floors need it."""
    entries = result.regressions if orientation == "forward" else result.improvements
    top = next((e for e in entries if e.regression), None)
    pattern = NAMES.get(variant)
    detected = (
        top is not None and pattern is not None and bool(pattern.search(top.to_json()["frame"]))
    )
    named_excess = None
    if pattern is not None:
        moved = [abs(e.step_pct) for e in entries if pattern.search(e.to_json()["frame"])]
        named_excess = max(moved, default=None)
    significant = [e for e in [*result.regressions, *result.improvements] if e.significant]
    md = result.min_detectable
    verdict = result.step_verdict
    ratio = (
        verdict.head_median_ms / verdict.base_median_ms
        if verdict.base_median_ms and verdict.head_median_ms
        else None
    )
    return {
        "n": n,
        "variant": variant,
        "k_pct": k,
        "orientation": orientation,
        "detected": detected,
        "any": detection.any_verdict(result),
        "top": top.to_json()["frame"] if top is not None else None,
        "step_verdict": verdict.verdict,
        "step_change_pct": verdict.change_pct,
        "step_ratio": ratio,
        "named_excess_pct": named_excess,
        "new_significant_max_pct": max(
            (abs(e.step_pct) for e in significant if e.new), default=None
        ),
        "grown_significant_max_pct": max(
            (abs(e.step_pct) for e in significant if not e.new), default=None
        ),
        "min_step_pct": md.get("step_change_pct"),
        "min_frame_pct": md.get("frame_excess_pct"),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    keys = sorted({(r["n"], r["variant"], r["k_pct"]) for r in rows})
    for n, variant, k in keys:
        got = [r for r in rows if (r["n"], r["variant"], r["k_pct"]) == (n, variant, k)]
        fwd = [r for r in got if r["orientation"] == "forward"]
        rev = [r for r in got if r["orientation"] == "reverse"]
        excess = [r["named_excess_pct"] for r in got if r["named_excess_pct"] is not None]
        label = f"{n} {variant}" + (f" {k:g}%" if variant not in ("same", "neighbour") else "")
        det_f, det_r, anyv = (
            sum(r["detected"] for r in fwd),
            sum(r["detected"] for r in rev),
            sum(r["any"] for r in got),
        )
        out[label] = {
            "comparisons": len(fwd),
            "forward": det_f,
            "reverse": det_r,
            "any": anyv,
            "orientations": len(got),
            "forward_pct": 100 * det_f / max(1, len(fwd)),
            "reverse_pct": 100 * det_r / max(1, len(rev)),
            "any_pct": 100 * anyv / max(1, len(got)),
            "excess_median_pct": round(statistics.median(excess), 2) if excess else None,
            "step_verdicts": sorted({r["step_verdict"] for r in got}),
        }
    return out


def floors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the unchanged pairs (one capture a side) show: the floors must stay above it."""
    same = [r for r in rows if r["variant"] == "same" and r["n"] == 1]
    logs = sorted(abs(math.log(r["step_ratio"])) for r in same if r["step_ratio"])

    def top(key: str) -> float | None:
        found = [r[key] for r in same if r[key] is not None]
        return round(max(found), 3) if found else None

    def ratio_at(q: float) -> float | None:
        if not logs:
            return None
        return round(math.exp(logs[min(len(logs) - 1, int(q * len(logs)))]), 4)

    return {
        "pairs": len(same) // 2,
        "step_ratio_median": ratio_at(0.5),
        "step_ratio_p95": ratio_at(0.95),
        "step_ratio_max": ratio_at(1.0),
        "new_significant_max_pct": top("new_significant_max_pct"),
        "grown_significant_max_pct": top("grown_significant_max_pct"),
    }


if __name__ == "__main__":
    run_part("detection", body)
