"""Power and false-alarm rate of the straggler verdict, on captures taken in separate processes.

Every capture is one process of ``bench/detection_workload.py`` (a JAX MLP training loop
on CPU), as every host of a real job is its own process. Its variants:

* ``same``: the workload unchanged (the healthy hosts);
* ``added K``: one more jitted function every step costing K % of the step, as
  calibrated in the capture's own process: a host that *computes* longer;
* ``input K``: the data phase inside the step sleeps K % of the step longer: a host that
  *waits* longer (for its input), with the same XLA work.

Sessions are formed from these files, renamed the way XProf names the hosts of a session
(``10.0.0.<i>_8466.xplane.pb``): 3- and 4-host sessions of ``same`` captures only (a
straggler named there is a false alarm), and sessions of 2 or 3 ``same`` captures plus one
slowed capture (power: the slowed host is named; "right cause": the finding also says
"computing" for ``added``, "waiting" for ``input``). Each session goes through the
product's own per-host facts (``exporter.analysis.facts.capture``) and ``StragglerRule``, not
XProf, at the shipped MAD floor and at the other floors in :data:`FLOORS`, so the
trade-off is measured in one run on the same files.

The reference, measured in the same run: the spread of the per-process median step
times of the unchanged workload (what the MAD floor has to stand above). A busy machine
can slow one process of the unchanged workload by half or more; the product is right to
name such a host. So false alarms are also counted among the sessions whose processes
ran alike by their own wall clock (each process's median step inside the trace, timed by
the workload with ``perf_counter``, not read from the capture; "alike": none above
:data:`ALIKE` times their median, the bar ``tests/integration/
test_analysis_hosts_processes.py`` sets before it asks for no straggler).

``communication-bound`` is not measured: CPU captures hold no collectives (every
capture's communication is checked to be 0 and reported), so neither its power nor its
false alarms can be measured on this machine.

    .venv/bin/python bench/stragglers.py                  # ~3 min on 2 cores
    .venv/bin/python bench/stragglers.py --quick          # 13-40 s: 4 same, 1 slowed per K
    .venv/bin/python bench/stragglers.py --keep /tmp/caps # reuse captures across runs
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from detection import capture  # noqa: E402  (bench/detection.py: one process per capture)

from exporter.analysis.facts import capture as facts_module  # noqa: E402
from exporter.analysis.facts.hosts import STRAGGLER_MAD_FLOOR, STRAGGLER_Z  # noqa: E402
from exporter.analysis.report.rules import StragglerRule  # noqa: E402

# (variant, K %): the slowed hosts measured, and the cause the finding must say.
CHANGES = [("added", 5.0), ("added", 10.0), ("added", 20.0), ("added", 50.0),
           ("input", 20.0), ("input", 50.0)]  # fmt: skip
QUICK_CHANGES = [("added", 50.0), ("input", 50.0)]
CAUSE = {"added": "computing", "input": "waiting"}
# MAD floors compared in the same run (share of the median host's median step).
FLOORS = sorted({0.05, 0.10, 0.15, 0.20, STRAGGLER_MAD_FLOOR})
SESSIONS_PER_CELL = 300  # sampled (fixed seed) when there are more combinations
ALIKE = 1.12  # processes "ran alike": none's own median step above 1.12x their median


def host_facts(path: str) -> Any:
    """The product's facts of one capture file (one host)."""
    return facts_module._host_facts(Path(path), facts_module.CaptureFacts())


def verdict(hosts: Sequence[Any], floor: float) -> tuple[str | None, str | None]:
    """(the host StragglerRule names, the cause in its title) for one session."""
    named = [
        dataclasses.replace(h, path=Path(f"/session/10.0.0.{i + 1}_8466.xplane.pb"))
        for i, h in enumerate(hosts)
    ]
    facts = facts_module.CaptureFacts()
    facts_module._hosts(facts, named, mad_floor=floor)
    rule = StragglerRule()
    if not rule.conditions(facts, None):
        return None, None
    finding = rule.finding(facts, None)
    cause = next((c for c in ("computing", "waiting") if f"mostly {c}" in finding.title), None)
    return str(finding.extra["host"]), cause


def sample(combos: list[tuple[int, ...]], rng: random.Random) -> list[tuple[int, ...]]:
    return combos if len(combos) <= SESSIONS_PER_CELL else rng.sample(combos, SESSIONS_PER_CELL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--same", type=int, default=10, help="captures of the unchanged workload")
    parser.add_argument("--slowed", type=int, default=3, help="slowed captures per change")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep (and reuse) captures in this directory")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    n_same, n_slowed = (4, 1) if args.quick else (args.same, args.slowed)
    changes = QUICK_CHANGES if args.quick else CHANGES
    rng = random.Random(19)

    with tempfile.TemporaryDirectory(prefix="mlprof-stragglers-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        # Interleaved, not all unchanged first: the machine's load drifts over minutes,
        # and a drift between the two sets would read as (or hide) a slowdown.
        same: list[dict[str, Any]] = []
        slowed: dict[tuple[str, float], list[dict[str, Any]]] = {key: [] for key in changes}
        for i in range(max(n_same, n_slowed)):
            if i < n_same:
                same.append(capture(root / f"same-{i}", "same", 0.0))
            for variant, k in changes if i < n_slowed else []:
                slowed[(variant, k)].append(capture(root / f"{variant}-{k:g}-{i}", variant, k))
        print(f"captures ready in {time.perf_counter() - started:.0f}s ({root})", flush=True)
        same_hosts = [host_facts(c["path"]) for c in same]
        slowed_hosts = {key: [host_facts(c["path"]) for c in cs] for key, cs in slowed.items()}

    def median_ms(host: Any) -> float:
        return float(statistics.median((hi - lo) / 1e6 for lo, hi in host.cycles))

    # Captures kept (--keep) from before the workload printed its own clock have none.
    clocks = [float(c.get("traced_step_ms") or "nan") for c in same]

    def alike(combo: tuple[int, ...]) -> bool:
        typical = statistics.median(clocks[i] for i in combo)
        return all(clocks[i] <= ALIKE * typical for i in combo)  # False where unknown

    medians = [median_ms(h) for h in same_hosts]
    center = statistics.median(medians)
    rel = sorted(abs(m - center) / center for m in medians)
    comm_ns = sum(
        float(h.communication.sum())
        for h in [*same_hosts, *itertools.chain(*slowed_hosts.values())]
        if h.communication is not None
    )
    print(
        f"\nreference (same run): per-process median step of the unchanged workload, "
        f"{n_same} processes: median {center:.2f} ms, min {min(medians):.2f}, "
        f"max {max(medians):.2f}; |deviation| from their median: median "
        f"{100 * statistics.median(rel):.1f} %, max {100 * rel[-1]:.1f} %; by the "
        f"processes' own clocks: {', '.join(f'{c:.1f}' for c in sorted(clocks))} ms"
    )
    for (variant, k), hosts in slowed_hosts.items():
        got = ", ".join(f"{100 * (median_ms(h) / center - 1):+.0f}%" for h in hosts)
        print(f"  {variant} {k:g}%: slowed captures' median step vs that median: {got}")

    out: dict[str, Any] = {
        "reference": {"same_median_step_ms": medians, "z": STRAGGLER_Z},
        "shipped_floor": STRAGGLER_MAD_FLOOR,
        "floors": {},
    }
    print(
        f"\nStragglerRule (z > {STRAGGLER_Z}), sessions of 3 and 4 hosts; false alarm: any "
        "host named in an all-unchanged session; power: the slowed host named (and with "
        "the right cause: computing / waiting)"
    )
    header = "  floor  hosts  false alarms      (ran alike)        " + "  ".join(
        f"{v} {k:g}%".ljust(17) for v, k in changes
    )
    print(header)
    for floor in FLOORS:
        out["floors"][f"{floor:g}"] = {}
        for n_hosts in (3, 4):
            alarms = sample(list(itertools.combinations(range(n_same), n_hosts)), rng)
            flagged = [verdict([same_hosts[i] for i in c], floor)[0] is not None for c in alarms]
            fa = sum(flagged)
            calm = [f for f, c in zip(flagged, alarms, strict=True) if alike(c)]
            cells = [
                f"{fa:4d}/{len(alarms):<4d} ({100 * fa / max(1, len(alarms)):4.1f}%)",
                f"{sum(calm):3d}/{len(calm):<4d} ({100 * sum(calm) / max(1, len(calm)):4.1f}%)",
            ]
            record: dict[str, Any] = {
                "false_alarms": fa,
                "sessions": len(alarms),
                "false_alarms_alike": sum(calm),
                "sessions_alike": len(calm),
            }
            for variant, k in changes:
                others = sample(list(itertools.combinations(range(n_same), n_hosts - 1)), rng)
                named = right = total = 0
                for slow in slowed_hosts[(variant, k)]:
                    for c in others:
                        # The slowed host is the last: 10.0.0.<n_hosts>_8466.
                        host, cause = verdict([*(same_hosts[i] for i in c), slow], floor)
                        total += 1
                        named += host == f"{n_hosts}_8466"
                        right += host == f"{n_hosts}_8466" and cause == CAUSE[variant]
                cells.append(f"{100 * named / total:3.0f}% ({100 * right / total:3.0f}%)".ljust(17))
                record[f"{variant} {k:g}%"] = {"sessions": total, "named": named, "right": right}
            mark = " <- shipped" if floor == STRAGGLER_MAD_FLOOR else ""
            print(f"  {floor:5.2f}  {n_hosts:5d}  " + "  ".join(cells) + mark)
            out["floors"][f"{floor:g}"][str(n_hosts)] = record
    print(
        f"\ncommunication-bound: not measured; CPU captures hold no collectives (communication "
        f"in all {n_same + sum(len(v) for v in slowed_hosts.values())} captures: "
        f"{comm_ns / 1e6:.3f} ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
