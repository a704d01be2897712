"""Power and false-alarm rate of a comparison judged against the workload's own history.

Issue 29, item 3: with one capture a side nothing measures the noise between runs, so
fixed floors stand in for it (an op that grew is a verdict only beyond 30 % of the step
on a CPU). When the store holds earlier runs of the same workload, each frame's spread
between them can measure it instead (``compare_sides(history_sides=...)``). This bench
asks what that buys and what it costs, on captures ``bench/detection.py`` took, each
in its own process (``--keep DIR``; the transformer shape):

* **false alarms**: pairs of unchanged captures, both orientations, each judged against
  H other unchanged captures as the history (none of the pair among them): the share
  of orientations with any verdict (a frame's, or the step's);
* **power**: an unchanged base against a changed head (``grown``, ``input``, ``added``
  of K % of the step), and the reverse, the history H unchanged captures that are not
  the base: the share that names the changed work (forward: the top regression;
  reverse: the top improvement).

For H in ``--histories`` (0 is the fixed floors, the reference, judged in the same run on
the same pairs). The history is drawn at random from the unchanged captures that are
not in the comparison: captures taken over the same half hour under a load that drifted
(the set's own record of its load is in bench/detection.py's output), as a store's
earlier runs are taken at other times.

    .venv/bin/python bench/frame_history.py --keep /tmp/det3
    .venv/bin/python bench/frame_history.py --keep /tmp/det3 --histories 0,3,5,8 --pairs 60
    .venv/bin/python bench/frame_history.py --keep /tmp/det3 --write-fixture \
        tests/fixtures/transformer_sides.json.gz   # the unit tests' saved sides

``--write-fixture`` saves a small set of these captures' sides for
``tests/unit/test_frame_history.py``: 12 unchanged, 4 ``input 10`` and 4 ``grown 10``,
each capture's step graphs as folded stacks, cut to the stacks that hold at least
0.1 % of every one of them (a stack kept in some captures only would read as work that
appeared), gzipped JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from detection import NAMES, any_verdict, named  # noqa: E402

_SEED = 20261205


def _captures(root: Path, shape: str) -> dict[str, list[dict[str, Any]]]:
    """The set's captures by change: ``same``, ``grown 10``, ..."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for manifest in sorted(root.glob(f"{shape}-*/capture.json")):
        record = json.loads(manifest.read_text())
        variant = record["variant"]
        key = "same" if variant == "same" else f"{variant} {record['k_pct']:g}"
        found[key].append(record)
    return found


def collateral(result: Any, want: str) -> int:
    """Frame verdicts that name neither the changed work (``want``, a part of its path),
    nor work inside it, nor a frame holding it: unchanged work called changed (for
    ``same``, every frame verdict)."""
    related: set[int] = set()
    if want:
        for frame in result.tree.walk():
            stack = frame.stack()
            if want in ";".join(f.name for f in stack):
                related.update(f.index for f in stack)  # itself, what holds it
    return sum(
        1
        for entry in [*result.regressions, *result.improvements]
        if entry.regression
        and entry.frame.index not in related
        and not (want and want in entry.to_json()["frame"])
    )


FIXTURE_SETS = {"same": 12, "input 10": 4, "grown 10": 4}
FIXTURE_MIN_SHARE = 0.001


def write_fixture(path: Path, found: dict[str, list[dict[str, Any]]]) -> None:
    """The tests' saved sides (see the module doc)."""
    from exporter.analysis.sides.load import load_side

    def by_number(record: dict[str, Any]) -> int:
        return int(Path(record["path"]).parts[-5].rsplit("-", 1)[1])

    sides = {
        key: [load_side(r["path"], None) for r in sorted(found[key], key=by_number)[:count]]
        for key, count in FIXTURE_SETS.items()
    }
    common: set[str] | None = None
    for side in (s for group in sides.values() for s in group):
        folded = dict(line.rsplit(" ", 1) for line in side.whole.to_folded().splitlines())
        total = sum(int(v) for v in folded.values())
        kept = {k for k, v in folded.items() if int(v) >= FIXTURE_MIN_SHARE * total}
        common = kept if common is None else common & kept
    assert common is not None
    out = {
        key: [
            {
                "kind": s.kind, "view": s.view, "scope": s.scope, "step_source": s.step_source,
                "step_names": sorted(s.step_names), "step_ns": s.step_ns,
                "sample_type": s.whole.sample_type, "unit": s.whole.unit,
                "steps": [
                    {k: int(v) for k, v in (line.rsplit(" ", 1)
                                            for line in g.to_folded().splitlines()) if k in common}
                    for g in s.steps
                ],
            }
            for s in group
        ]
        for key, group in sides.items()
    }  # fmt: skip
    path.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), 9, mtime=0))
    print(f"{path}: {len(common)} stacks, {path.stat().st_size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", type=Path, required=True, help="bench/detection.py's captures")
    parser.add_argument("--shape", default="transformer")
    parser.add_argument("--histories", default="0,3,5,8")
    parser.add_argument("--sides", default="1", help="captures a side (replicates), e.g. 1,4")
    parser.add_argument(
        "--history-from",
        type=Path,
        help="draw the history from this set's unchanged captures (taken at another time "
        "and load) instead of the compared set's",
    )
    parser.add_argument("--pairs", type=int, default=40, help="pairs drawn per change and H")
    parser.add_argument("--changes", default="grown 10,input 10,added 5,grown 5")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--write-fixture", type=Path, help="save the tests' sides here and stop")
    args = parser.parse_args()
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import load_side

    found = _captures(args.keep, args.shape)
    if args.write_fixture:
        write_fixture(args.write_fixture, found)
        return
    same = found.get("same", [])
    pool = _captures(args.history_from, args.shape)["same"] if args.history_from else None
    history_pool = pool
    changes = [c for c in args.changes.split(",") if found.get(c)]
    histories = [int(h) for h in args.histories.split(",")]
    sides_n = [int(n) for n in args.sides.split(",")]
    if len(same) < 2 * max(sides_n) + (0 if pool else max(histories)):
        raise SystemExit(f"{len(same)} unchanged captures: too few for these sides and history")
    sides: dict[str, Any] = {}
    read_s: list[float] = []

    def side(record: dict[str, Any]) -> Any:
        if record["path"] not in sides:
            t0 = time.process_time()
            sides[record["path"]] = load_side(record["path"], None)
            read_s.append(time.process_time() - t0)
        return sides[record["path"]]

    rng = random.Random(_SEED)
    rows: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    compare_s: dict[tuple[int, int], list[float]] = defaultdict(list)
    # (captures a side, change, base, head, history)
    cells: list[tuple[int, str, list[int], list[int], list[int]]] = []
    everyone = list(range(len(same)))
    for n in sides_n:
        for change in ["same", *changes]:
            heads = same if change == "same" else found[change]
            if n > len(heads):
                continue
            for _ in range(args.pairs):
                a = rng.sample(everyone, n)
                b = rng.sample([i for i in range(len(heads)) if change != "same" or i not in a], n)
                rest = [i for i in everyone if i not in a and (change != "same" or i not in b)]
                if pool is not None:
                    rest = list(range(len(pool)))
                cells.append((n, change, a, b, rng.sample(rest, max(histories))))
    for h in histories:
        for n, change, a, b, past in cells:
            base = [side(same[i]) for i in a]
            head = [side((same if change == "same" else found[change])[i]) for i in b]
            earlier = [side((history_pool or same)[i]) for i in past[:h]]
            for orientation, (one, other) in (("forward", (base, head)), ("reverse", (head, base))):
                t0 = time.process_time()
                result = compare_sides(one, other, history_sides=earlier)
                compare_s[(n, h)].append(time.process_time() - t0)
                hit, want = False, ""
                if change != "same":
                    want = NAMES[args.shape][change.split()[0]]
                    entries = (
                        result.regressions if orientation == "forward" else result.improvements
                    )
                    hit = named(entries, want)
                md = result.min_detectable
                rows[(n, h, change)].append({
                    "orientation": orientation, "detected": hit, "any": any_verdict(result),
                    "collateral": collateral(result, want),
                    "step_verdict": result.step_verdict.verdict,
                    "frame_verdict": result.top_regression is not None
                    or any(e.regression for e in result.improvements),
                    "min_frame_pct": md.get("frame_excess_pct"),
                    "source": result.to_json()["noise"]["between_runs"]["source"],
                })  # fmt: skip
    print(f"[{args.shape}] {len(same)} unchanged captures; "
          + ", ".join(f"{len(found[c])} {c} %" for c in changes))  # fmt: skip
    print("  n  H  change      pairs  forward     reverse     any verdict (frame/step)  "
          "collateral  min frame (median % of step)")  # fmt: skip
    report: dict[str, Any] = {}
    for (n, h, change), got in sorted(rows.items()):
        fwd = [r for r in got if r["orientation"] == "forward"]
        rev = [r for r in got if r["orientation"] == "reverse"]
        df, dr = sum(r["detected"] for r in fwd), sum(r["detected"] for r in rev)
        anyv = sum(r["any"] for r in got)
        frame = sum(r["frame_verdict"] for r in got)
        step = sum(r["step_verdict"] not in ("unchanged", "unknown") for r in got)
        mins = [r["min_frame_pct"] for r in got if r["min_frame_pct"] is not None]
        shown = f"{statistics.median(mins):6.1f}" if mins else "     -"
        beside = sum(r["collateral"] > 0 for r in got)
        print(f"  {n}  {h}  {change:10s} {len(fwd):5d}  {df:3d} ({100 * df / len(fwd):3.0f}%)  "
              f"{dr:3d} ({100 * dr / len(rev):3.0f}%)  {anyv:3d}/{len(got):<3d} "
              f"({100 * anyv / len(got):3.0f}%; {frame}/{step})  {beside:3d}/{len(got):<3d}"
              f"     {shown}")  # fmt: skip
        report[f"{n} {h} {change}"] = {"forward": df, "reverse": dr, "pairs": len(fwd),
                                       "any_verdict": anyv, "frame": frame, "step": step,
                                       "collateral": beside, "orientations": len(got)}  # fmt: skip
    reading = statistics.median(read_s)
    for (n, h), times in sorted(compare_s.items()):
        t = statistics.median(times)
        print(f"  compare, {n} a side, H = {h}: median {1e3 * t:.0f} ms CPU; reading "
              f"one capture (reference, same run) {1e3 * reading:.0f} ms: "
              f"{t / reading:.2f}x")  # fmt: skip
        report[f"compare_s {n} {h}"] = {"compare_s": t, "read_s": reading}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
