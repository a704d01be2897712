"""Replicates judged alike in both orientations (issue 29: "both orientations are judged
alike"): every capture is scaled against the captures of both sides, so a change read
backwards gets the mirrored test, not a weaker one."""

from __future__ import annotations

import random

import pytest

from exporter.analysis.compare.comparison import compare_sides
from exporter.analysis.sides.load import Side
from exporter.profiles.flamegraph import FlameGraph

OPS = {"dot.1": 4e6, "fusion.2": 2e6, "ynn_fusion": 1.5e6, "copy": 1e6, "dot.3": 1.5e6}


def capture(seed: int, grown: float = 0.0) -> Side:
    """One process: its own machine speed (x0.6-x2.5) and each op's own wobble."""
    rng = random.Random(seed)
    speed = rng.uniform(0.6, 2.5)
    wobble = {op: rng.lognormvariate(0, 0.2) for op in OPS}
    graphs = []
    for _ in range(12):
        graph = FlameGraph(sample_type="device_time", unit="nanoseconds")
        for op, ns in OPS.items():
            extra = grown * 1e7 if op == "fusion.2" else 0.0
            value = (ns * wobble[op] + extra) * speed * (1 + rng.uniform(-0.05, 0.05))
            graph.add(["jit_step", op], round(value))
        graphs.append(graph)
    whole = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for g in graphs:
        whole.merge(g)
    return Side(f"c{seed}", "capture", "device", whole, graphs, [g.root.total for g in graphs],
                "device_steps")  # fmt: skip


def _fusion(entries):  # type: ignore[no-untyped-def]
    return next(e for e in entries if e.frame.name == "fusion.2" and e.basis == "self")


@pytest.mark.parametrize("seed", range(4))
def test_a_grown_op_read_backwards_gets_the_mirrored_test(seed: int) -> None:
    base = [capture(100 * seed + i) for i in range(4)]
    head = [capture(100 * seed + 50 + i, grown=0.2) for i in range(4)]  # +2 ms, 20 %
    forward, reverse = compare_sides(base, head), compare_sides(head, base)
    grew, shrank = _fusion(forward.regressions), _fusion(reverse.improvements)
    # The same captures, the same test: p-values equal, verdicts mirrored (before, each
    # orientation scaled the captures against its own base side's pool).
    assert grew.p_value == pytest.approx(shrank.p_value, rel=1e-6)
    assert grew.regression == shrank.regression
