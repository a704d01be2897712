"""Synthetic captures for the comparison's between-run tests (never shipped).

Each :func:`capture` is one process of a step: the machine's own speed, each op's own
move between runs (``wobble``, log-normal), then each step's own jitter, as the
captures of separate processes on a loaded machine differ (bench/detection.py).
"""

from __future__ import annotations

import random

from exporter.analysis.sides.load import Side
from exporter.profiles.flamegraph import FlameGraph

__all__ = ["OPS", "capture"]

OPS = {"dot.1": 4e6, "fusion.2": 2e6, "ynn_fusion": 1.5e6, "copy": 1e6, "dot.3": 1.5e6}


def capture(
    seed: int,
    ops: dict[str, float] = OPS,
    wobble: float = 0.2,
    extra: dict[str, float] | None = None,
    phase: tuple[str, float] | None = None,
    slower: float = 1.0,
    jitter: float = 0.03,
    fixed_speed: float | None = None,
    speeds: tuple[float, float] = (0.7, 1.5),
) -> Side:
    """One process: ``ops`` under ``jit_step`` (ns per step), each moved by its own
    log-normal factor (``wobble``) and the machine's speed (drawn from ``speeds``,
    divided by ``slower``, or ``fixed_speed``); ``extra``: ns per step added to an op;
    ``phase``: a frame beside the program, (name, ns per step); ``jitter``: each step's
    own wobble. 12 steps."""
    rng = random.Random(seed)
    speed = rng.uniform(*speeds) * slower if fixed_speed is None else fixed_speed
    moved = {op: rng.lognormvariate(0, wobble) for op in ops}
    graphs = []
    for _ in range(12):
        graph = FlameGraph(sample_type="device_time", unit="nanoseconds")
        for op, ns in ops.items():
            value = (ns * moved[op] + (extra or {}).get(op, 0.0)) * speed
            graph.add(["jit_step", op], round(value * (1 + rng.uniform(-jitter, jitter))))
        if phase is not None:
            graph.add([phase[0]], round(phase[1] * speed * (1 + rng.uniform(-jitter, jitter))))
        graphs.append(graph)
    whole = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for g in graphs:
        whole.merge(g)
    return Side(f"c{seed}", "capture", "device", whole, graphs, [g.root.total for g in graphs],
                "device_steps")  # fmt: skip
