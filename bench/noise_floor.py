"""Measure the noise between captures of the same unchanged JAX CPU workload.

Captures the ``compute`` workload of ``tests/integration/analysis_workload.py`` N times,
each in a fresh process, then compares every pair as ``mlprof compare`` does:

* share mode (whole graphs, as when a side has no steps): the largest change of a single
  frame's self share, in points. Its maximum over all pairs is what
  ``exporter.analysis.compare.noise.SHARE_NOISE_FLOOR_PTS`` must cover;
* per-step mode: how many frames the noise model calls a regression (it must be none),
  and the smallest q-value and largest share move seen.

    .venv/bin/python bench/noise_floor.py              # 6 captures, 15 pairs, ~1 min
    .venv/bin/python bench/noise_floor.py --quick      # 3 captures
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tests" / "integration" / "analysis_workload.py"


def capture(out: Path) -> Path:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out), "compute"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"workload failed:\n{done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("DONE"))
    return Path(line.split()[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--captures", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 3 if args.quick else args.captures

    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import Side, load_side

    with tempfile.TemporaryDirectory(prefix="mlprof-noise-") as tmp:
        started = time.perf_counter()
        paths = [capture(Path(tmp) / f"c{i}") for i in range(n)]
        print(f"{n} captures of the same workload in {time.perf_counter() - started:.1f}s")
        worst_share: dict[str, tuple[float, str]] = {}
        for kind in ("host", "device"):
            sides = [load_side(str(p), kind) for p in paths]  # type: ignore[arg-type]
            flagged = 0
            smallest_q, largest_sig = 1.0, 0.0
            largest_at = {0.01: 0.0, 0.001: 0.0}  # largest move with q below each level
            share_max = (0.0, "")
            for a, b in itertools.combinations(sides, 2):
                per_step = compare_sides(a, b)
                for entry in per_step.regressions + per_step.improvements:
                    if entry.regression:
                        flagged += 1
                    if entry.q_value is not None:
                        smallest_q = min(smallest_q, entry.q_value)
                        for level, seen in largest_at.items():
                            if entry.q_value < level:
                                largest_at[level] = max(seen, abs(entry.delta_pts))
                    if entry.significant:
                        largest_sig = max(largest_sig, abs(entry.delta_pts))
                whole_a = Side(a.spec, a.source, a.kind, a.whole)
                whole_b = Side(b.spec, b.source, b.kind, b.whole)
                share = compare_sides(whole_a, whole_b)
                for entry in share.regressions + share.improvements:
                    if entry.basis == "self" and abs(entry.delta_self_pts) > share_max[0]:
                        share_max = (abs(entry.delta_self_pts), entry.frame.name)
            worst_share[kind] = share_max
            pairs = n * (n - 1) // 2
            print(
                f"{kind:6s} per-step: {flagged} regressions flagged in {pairs} pairs "
                f"(smallest q {smallest_q:.3g}; largest significant move {largest_sig:.2f} pts; "
                + ", ".join(
                    f"largest move with q < {k:g}: {v:.2f} pts" for k, v in largest_at.items()
                )
                + ")"
            )
            print(
                f"{kind:6s} share:    largest self-share move of one frame "
                f"{share_max[0]:.2f} pts ({share_max[1]})"
            )
        from exporter.analysis.compare.noise import SHARE_NOISE_FLOOR_PTS

        worst = max(v[0] for v in worst_share.values())
        print(
            f"noise floor in use {SHARE_NOISE_FLOOR_PTS:g} pts; measured worst {worst:.2f} pts "
            f"(ratio {worst / SHARE_NOISE_FLOOR_PTS:.2f})"
        )


if __name__ == "__main__":
    main()
