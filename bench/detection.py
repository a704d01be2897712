"""Power and false-alarm rate of ``mlprof compare``, on captures taken in separate processes.

Every capture is one process of ``bench/detection_workload.py`` (a JAX MLP training loop
on CPU), as two real runs a user compares are. Pairs:

* ``same``: two captures of the unchanged workload (every pair of the ``same`` set);
* ``added K``: an unchanged capture against one with an extra jitted function costing
  K % of the step (K calibrated in the workload's own process, and printed as measured
  in the capture);
* ``slower_op K``: an existing op's loop running K % of the step longer;
* ``uniform``: every computation of the step done twice;
* ``input K``: the data phase K % of the step longer.

Per view (``default``: the comparison without ``--kind``; ``device``; ``host``) it prints
the detection rate (a regression verdict that names the changed work: ``extra_work``,
``train_step``'s loop, ``input_pipeline``, or the step-time verdict for ``uniform``), the
false-alarm rate (same-workload pairs with any regression or step-time verdict), how
often ``--fail-on-regression 3`` agrees with the verdicts, and compare wall time against
the time to read both sides (the reference, measured in the same run).

    .venv/bin/python bench/detection.py                       # ~10 min on 2 cores
    .venv/bin/python bench/detection.py --quick               # 4 same, 3 pairs per change
    .venv/bin/python bench/detection.py --keep /tmp/caps      # reuse captures across runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "bench" / "detection_workload.py"
GATE_PCT = 3.0
# (variant, K): the changes measured, and the name that a detection must carry.
CHANGES = [
    ("added", 2.0), ("added", 5.0), ("added", 10.0), ("added", 20.0),
    ("slower_op", 5.0), ("slower_op", 20.0),
    ("input", 5.0), ("input", 20.0),
    ("uniform", 100.0),
]  # fmt: skip
NAMES = {"added": "extra_work", "slower_op": "jit_train_step;while", "input": "input_pipeline"}


def capture(out: Path, variant: str, k_pct: float) -> dict[str, Any]:
    manifest = out / "capture.json"
    if manifest.exists():
        return dict(json.loads(manifest.read_text()))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out), variant, str(k_pct)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"workload failed:\n{done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("DONE"))
    _, path, step_ms, unit_ms, iterations, traced_ms = line.split()
    record = {
        "path": path,
        "variant": variant,
        "k_pct": k_pct,
        "calibrated_step_ms": float(step_ms),
        "unit_ms": float(unit_ms),
        "iterations": int(iterations),
        "traced_step_ms": float(traced_ms),
    }
    manifest.write_text(json.dumps(record))
    return record


def detected(result: Any, variant: str) -> bool:
    """Whether the comparison's verdict names the change that was made."""
    if variant == "uniform":
        return bool(result.step_verdict.verdict == "slower")
    top = result.top_regression
    return top is not None and NAMES[variant] in top.to_json()["frame"]


def expected_gate(data: dict[str, Any], pct: float) -> bool:
    """What ``--fail-on-regression pct`` must do, from the comparison's JSON alone."""
    verdict = data["step_verdict"]
    slower = verdict["verdict"] == "slower" and (verdict["change_pct"] or 0) > pct
    return slower or any(e["regression"] and e["step_pct"] > pct for e in data["regressions"])


def any_verdict(result: Any) -> bool:
    return result.top_regression is not None or result.step_verdict.verdict != "unchanged"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--same", type=int, default=12, help="captures of the unchanged workload")
    parser.add_argument("--pairs", type=int, default=10, help="pairs per change")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep (and reuse) captures in this directory")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    n_same, n_pairs = (4, 3) if args.quick else (args.same, args.pairs)

    from exporter.analysis.compare import compare_sides
    from exporter.analysis.sides import load_sides

    with tempfile.TemporaryDirectory(prefix="mlprof-detection-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        same = [capture(root / f"same-{i}", "same", 0.0) for i in range(n_same)]
        changed = {
            (variant, k): [
                capture(root / f"{variant}-{k:g}-{i}", variant, k) for i in range(n_pairs)
            ]
            for variant, k in CHANGES
        }
        print(f"captures ready in {time.perf_counter() - started:.0f}s ({root})", flush=True)

        views = {"default": None, "device": "device", "host": "host"}
        cache: dict[str, Any] = {}

        def sides(path: str) -> Any:
            if path not in cache:
                t0 = time.perf_counter()
                cache[path] = (load_sides(path, ["device", "host"]), time.perf_counter() - t0)
                from exporter.analysis.sides import load_side

                t0 = time.perf_counter()
                cache[path][0]["default"] = load_side(path, None)
                cache[path] = (cache[path][0], cache[path][1] + time.perf_counter() - t0)
            return cache[path]

        pairs: list[tuple[str, float, dict[str, Any], dict[str, Any]]] = [
            ("same", 0.0, a, b) for a, b in itertools.combinations(same, 2)
        ]
        for (variant, k), heads in changed.items():
            pairs += [(variant, k, same[i % n_same], head) for i, head in enumerate(heads)]

        rows: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
        read_s, compare_s = [], []
        for variant, k, base, head in pairs:
            (b_sides, b_s), (h_sides, h_s) = sides(base["path"]), sides(head["path"])
            read_s.append(b_s + h_s)
            for view, kind in views.items():
                key = kind or "default"
                t0 = time.perf_counter()
                result = compare_sides(b_sides[key], h_sides[key])
                elapsed = time.perf_counter() - t0
                if view == "default":
                    compare_s.append(elapsed)
                gate = bool(result.gate_reasons(GATE_PCT))
                top = result.top_regression
                rows[(view, variant, k)].append({
                    "detected": variant != "same" and detected(result, variant),
                    "any": any_verdict(result),
                    "gate": gate,
                    # The gate agrees when it fails exactly on a verdict above its limit,
                    # read from the JSON a user sees.
                    "agrees": gate == expected_gate(result.to_json(), GATE_PCT),
                    "step_change_pct": result.step_verdict.change_pct,
                    "top": None if top is None else top.to_json()["frame"],
                    "top_step_pct": None if top is None else top.step_pct,
                    "measured_k": measured_k(result, variant),
                })  # fmt: skip

        out: dict[str, Any] = {"views": {}}
        print(f"\n{len(pairs)} pairs; same-workload pairs: {n_same * (n_same - 1) // 2}")
        for view in views:
            print(f"\n[{view}]  change      pairs  detected  any-verdict  gate-agrees  measured K")
            out["views"][view] = {}
            for variant, k in [("same", 0.0), *CHANGES]:
                got = rows[(view, variant, k)]
                if not got:
                    continue
                det = sum(r["detected"] for r in got)
                anyv = sum(r["any"] for r in got)
                agree = sum(r["agrees"] for r in got)
                ks = [r["measured_k"] for r in got if r["measured_k"] is not None]
                label = "same" if variant == "same" else f"{variant} {k:g}%"
                mk = f"{statistics.median(ks):5.1f}%" if ks else "    -"
                print(
                    f"  {label:16s} {len(got):5d}  {det:4d} ({100 * det / len(got):3.0f}%)"
                    f"  {anyv:4d} ({100 * anyv / len(got):3.0f}%)"
                    f"  {agree:4d}/{len(got):<4d}  {mk}"
                )
                out["views"][view][label] = {
                    "pairs": len(got), "detected": det, "any_verdict": anyv,
                    "gate_agrees": agree, "rows": got,
                    "measured_k_median": statistics.median(ks) if ks else None,
                }  # fmt: skip
        ratio = statistics.median(compare_s) / statistics.median(read_s)
        print(
            f"\ncompare (default view) median {1e3 * statistics.median(compare_s):.1f} ms a pair; "
            f"reading both sides (reference, same run) {1e3 * statistics.median(read_s):.0f} ms: "
            f"{ratio:.3f}x"
        )
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))


def measured_k(result: Any, variant: str) -> float | None:
    """The change's size as the capture shows it: % of the base's median step."""
    if variant in ("same", "uniform"):
        return None
    name = NAMES[variant]
    base_step = result.step_verdict.base_median_ms
    if not base_step:
        return None
    moved = 0.0
    for entry in result.regressions:
        if entry.basis == "self" and name in entry.to_json()["frame"]:
            moved += entry.excess_ms
    return 100 * moved / base_step


if __name__ == "__main__":
    main()
