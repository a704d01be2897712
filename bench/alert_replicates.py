"""How an alert's capture time is best spent: N short captures or one long one.

The sidecar's alert-triggered capture (``MLPROF_ALERT_CAPTURES``) may split its time
into N captures taken one after the other on the same running workload, so that the
report compares N replicates a side with its baseline's. This bench measures that
choice at equal capture time (default 3 s: ``1x3`` one 3 s capture, ``3x1`` three of
1 s), on real JAX CPU processes of ``bench/transformer_workload.py`` (a causal
transformer block whose data phase is numpy work):

* every process is one run of the workload, compiled and calibrated in itself; it takes
  every design's captures in turn (the order alternates between processes, so neither
  design always comes first), each capture a ``jax.profiler`` trace of that many
  seconds of steps, as the sidecar's remote captures are windows of a running loop;
* processes are taken round-robin (an unchanged one, one with an added jitted function
  costing K % of its step, another unchanged one), so the machine's load drifts over
  both alike;
* a comparison is one process's captures (base) against another's (head), both
  orientations: unchanged against unchanged, any verdict (a regression, an
  improvement, a step verdict) is a false alarm; unchanged against added, forward is a
  detection when the top regression names ``extra_work``, reverse when the top
  improvement does (``bench/detection.py``'s rules).

    .venv/bin/python bench/alert_replicates.py                 # 4 rounds, ~6 min on 2 busy cores
    .venv/bin/python bench/alert_replicates.py --rounds 8 --designs 1x3,3x1,2x1.5
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
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from detection import any_verdict, named  # noqa: E402  (bench/ is on the path above)

DESIGNS = "1x3,3x1"
K_PCT = 10.0
ROUNDS = 4
ADDED_FRAME = "extra_work"


def _design(text: str) -> tuple[int, float]:
    count, _, seconds = text.partition("x")
    return int(count), float(seconds)


def child(out: Path, variant: str, k_pct: float, designs: list[str], reverse: bool) -> None:
    """One workload process: every design's captures, one window after another."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import transformer_workload as workload

    run = workload.setup(variant, k_pct)
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 0
    step = 0
    taken: dict[str, list[str]] = {}
    for design in reversed(designs) if reverse else designs:
        count, seconds = _design(design)
        for index in range(count):
            logdir = out / f"{design}-{index}"
            jax.profiler.start_trace(str(logdir), profiler_options=options)
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    run.step(step)
                step += 1
            jax.profiler.stop_trace()
            (path,) = logdir.glob("plugins/profile/*/*.xplane.pb")
            taken.setdefault(design, []).append(str(path))
    print("DONE " + json.dumps({"captures": taken, "step_ms": 1e3 * run.step_s}), flush=True)


def take(out: Path, variant: str, k_pct: float, designs: list[str], reverse: bool) -> Any:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--child", str(out), variant, str(k_pct),
               ",".join(designs), "1" if reverse else "0"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=900, check=False
    )
    if done.returncode:
        raise SystemExit(f"workload failed:\n{done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("DONE "))
    return {"variant": variant, **json.loads(line.removeprefix("DONE "))}


def evaluate(processes: list[dict[str, Any]], designs: list[str]) -> dict[str, Any]:
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import load_side

    sides: dict[str, Any] = {}

    def side(path: str) -> Any:
        if path not in sides:
            sides[path] = load_side(path, None)
        return sides[path]

    same = [p for p in processes if p["variant"] == "same"]
    added = [p for p in processes if p["variant"] == "added"]
    out: dict[str, Any] = {}
    for design in designs:
        false_alarms = orientations = 0
        step_verdicts = frame_verdicts = 0
        found = {"forward": 0, "reverse": 0}
        pairs_added = 0
        steps_per_capture = [len(side(c).step_ns) for p in processes for c in p["captures"][design]]
        stated: dict[str, list[float]] = {"step_change_pct": [], "frame_excess_pct": []}

        def judge(
            base: dict[str, Any],
            head: dict[str, Any],
            design: str = design,
            stated: dict[str, list[float]] = stated,
        ) -> Any:
            result = compare_sides(
                [side(c) for c in base["captures"][design]],
                [side(c) for c in head["captures"][design]],
            )
            for key, found in stated.items():
                if result.min_detectable.get(key) is not None:
                    found.append(result.min_detectable[key])
            return result

        for one, other in combinations(same, 2):
            for base, head in ((one, other), (other, one)):
                result = judge(base, head)
                orientations += 1
                if any_verdict(result):
                    false_alarms += 1
                    stepped = result.step_verdict.verdict not in ("unchanged", "unknown")
                    step_verdicts += stepped
                    frame_verdicts += not stepped
        for unchanged in same:
            for changed in added:
                pairs_added += 1
                found["forward"] += named(judge(unchanged, changed).regressions, ADDED_FRAME)
                found["reverse"] += named(judge(changed, unchanged).improvements, ADDED_FRAME)
        out[design] = {
            "false_alarms": false_alarms,
            "orientations": orientations,
            "step_verdicts": step_verdicts,
            "frame_only_verdicts": frame_verdicts,
            "added_pairs": pairs_added,
            "detected_forward": found["forward"],
            "detected_reverse": found["reverse"],
            "steps_per_capture_median": statistics.median(steps_per_capture),
            **{
                f"min_{key.split('_')[0]}_pct_median": statistics.median(found) if found else None
                for key, found in stated.items()
            },
        }
    return out


def print_table(results: dict[str, Any], k_pct: float) -> None:
    print(
        f"\n  design   steps/capture  same: any verdict (step / frame)   "
        f"added {k_pct:g}%: fwd    rev     min_detectable step / frame (median %)"
    )
    for design, r in results.items():
        fa, n = r["false_alarms"], r["orientations"]
        pairs = max(1, r["added_pairs"])

        def pct(value: Any) -> str:
            return "-" if value is None else f"{value:.1f}"

        print(
            f"  {design:7s} {r['steps_per_capture_median']:8.0f}      "
            f"{fa:3d}/{n:<3d} ({100 * fa / max(1, n):3.0f}%) ({r['step_verdicts']} / "
            f"{r['frame_only_verdicts']})            "
            f"{r['detected_forward']:3d}/{pairs} ({100 * r['detected_forward'] / pairs:3.0f}%) "
            f"{r['detected_reverse']:3d}/{pairs} ({100 * r['detected_reverse'] / pairs:3.0f}%)  "
            f"{pct(r['min_step_pct_median'])} / {pct(r['min_frame_pct_median'])}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        out, variant, k_pct, designs, reverse = sys.argv[2:7]
        child(Path(out), variant, float(k_pct), designs.split(","), reverse == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="processes of each kind / 2")
    parser.add_argument("--designs", default=DESIGNS, help="COUNTxSECONDS,... at equal time")
    parser.add_argument("--k", type=float, default=K_PCT, help="the added work, % of the step")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    designs = args.designs.split(",")
    started = time.perf_counter()
    load = os.getloadavg()[0]
    processes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mlprof-alert-replicates-") as tmp:
        for r in range(args.rounds):
            for i, (variant, k) in enumerate((("same", 0.0), ("added", args.k), ("same", 0.0))):
                where = Path(tmp) / f"{r}-{i}-{variant}"
                processes.append(take(where, variant, k, designs, reverse=(r + i) % 2 == 1))
            print(f"  round {r + 1}/{args.rounds} captured "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip
        results = evaluate(processes, designs)
    steps = [p["step_ms"] for p in processes if p["variant"] == "same"]
    print(
        f"\n{len(processes)} processes ({2 * args.rounds} unchanged, {args.rounds} with "
        f"{args.k:g}% added); calibrated step of the unchanged ones {min(steps):.0f}-"
        f"{max(steps):.0f} ms (median {statistics.median(steps):.0f}); load average "
        f"{load:.1f} -> {os.getloadavg()[0]:.1f}; {time.perf_counter() - started:.0f}s"
    )
    print_table(results, args.k)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "processes": processes}, indent=1))


if __name__ == "__main__":
    main()
