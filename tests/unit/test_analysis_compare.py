"""The noise model on per-step samples, either side of each threshold, and the JSON
contract of a comparison."""

from __future__ import annotations

import random

import numpy as np
import pytest

from exporter.analysis import noise
from exporter.analysis.compare import compare_sides
from exporter.analysis.sides import Side
from exporter.profiles.flamegraph import FlameGraph

REQUIRED_ENTRY_KEYS = {
    "frame",
    "name",
    "self_base",
    "self_head",
    "total_base",
    "total_head",
    "delta_self_pts",
    "delta_total_pts",
    "significant",
    "p_value",
}


def step_graph(ops: dict[str, float], rng: random.Random, jitter: float = 0.03) -> FlameGraph:
    graph = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for name, ns in ops.items():
        graph.add(["jit_step", name], max(1, round(ns * (1 + rng.uniform(-jitter, jitter)))))
    return graph


def side(ops: dict[str, float], steps: int, seed: int, name: str, scale: float = 1.0) -> Side:
    rng = random.Random(seed)
    graphs = [step_graph({k: v * scale for k, v in ops.items()}, rng) for _ in range(steps)]
    whole = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for g in graphs:
        whole.merge(g)
    return Side(name, "capture", "device", whole, graphs, [10**7] * steps, "device_steps")


BASE = {"matmul": 6_000_000.0, "softmax": 2_000_000.0, "copy": 1_000_000.0, "fusion": 1_000_000.0}


def with_growth(op: str, share_pts: float) -> dict[str, float]:
    """BASE where ``op`` grew so that its share rises by about ``share_pts`` points."""
    total = sum(BASE.values())
    before = BASE[op] / total
    target = before + share_pts / 100
    grown = target * (total - BASE[op]) / (1 - target)
    return BASE | {op: grown}


def entry(comparison, name):  # type: ignore[no-untyped-def]
    return next(e for e in comparison.regressions if e.frame.name == name and e.basis == "self")


def test_a_large_significant_growth_is_the_top_regression() -> None:
    result = compare_sides(side(BASE, 20, 1, "base"), side(with_growth("copy", 15), 20, 2, "head"))
    assert result.normalisation == "per_step" and result.verdict_possible
    top = result.top_regression
    assert top is not None and top.frame.name == "copy"
    assert top.significant and top.regression
    assert top.delta_self_pts == pytest.approx(15, abs=1)
    assert top.q_value is not None and top.q_value < noise.FDR_ALPHA
    assert top.effect == pytest.approx(1.0)
    assert result.failing(10) and not result.failing(20)


def test_same_distribution_is_nothing_significant() -> None:
    result = compare_sides(side(BASE, 20, 1, "base"), side(BASE, 20, 2, "head"))
    assert not [e for e in result.regressions + result.improvements if e.significant]
    assert result.top_regression is None and result.failing(0) == []


def test_uniform_slowdown_moves_no_share_and_is_no_regression() -> None:
    # Another process on the machine slows every op by half: the step is slower, yet no
    # frame's share of it moved.
    result = compare_sides(side(BASE, 20, 1, "base"), side(BASE, 20, 2, "head", scale=1.5))
    assert result.step_time()["change_pct"] == 0.0  # the cycle lengths were given equal
    assert not [e for e in result.regressions if e.regression]


@pytest.mark.parametrize(
    ("grow_pts", "regression"),
    [(noise.MIN_DELTA_PTS["device"] * 0.7, False), (noise.MIN_DELTA_PTS["device"] * 1.6, True)],
)
def test_minimum_share_move_either_side(grow_pts: float, regression: bool) -> None:
    result = compare_sides(
        side(BASE, 20, 1, "base"), side(with_growth("fusion", grow_pts), 20, 2, "head")
    )
    found = entry(result, "fusion")
    assert found.significant  # the rank test sees it either way
    assert found.regression is regression


def test_below_the_minimum_steps_there_is_no_verdict() -> None:
    few = noise.MIN_STEPS - 1
    result = compare_sides(side(BASE, few, 1, "base"), side(with_growth("copy", 30), few, 2, "h"))
    assert not result.verdict_possible
    assert entry(result, "copy").p_value is not None
    assert not entry(result, "copy").significant and result.top_regression is None
    assert any("fewer than" in n for n in result.notes)
    enough = compare_sides(
        side(BASE, noise.MIN_STEPS, 1, "b"), side(with_growth("copy", 30), noise.MIN_STEPS, 2, "h")
    )
    assert enough.verdict_possible and enough.top_regression is not None


@pytest.mark.parametrize(
    ("grow_pts", "significant"),
    [(noise.SHARE_NOISE_FLOOR_PTS - 2, False), (noise.SHARE_NOISE_FLOOR_PTS + 3, True)],
)
def test_without_steps_a_change_counts_only_beyond_the_noise_floor(
    grow_pts: float, significant: bool
) -> None:
    base, head = side(BASE, 20, 1, "base"), side(with_growth("copy", grow_pts), 20, 2, "head")
    base.steps, head.steps = [], []
    result = compare_sides(base, head)
    assert result.normalisation == "share" and result.noise_floor_pts == noise.SHARE_NOISE_FLOOR_PTS
    found = entry(result, "copy")
    assert found.significant is significant and found.p_value is None
    assert any("no step markers" in n for n in result.notes)


def test_json_contract() -> None:
    result = compare_sides(side(BASE, 20, 1, "base"), side(with_growth("copy", 15), 20, 2, "head"))
    data = result.to_json(top=3)
    assert {"kind", "normalisation", "base", "head", "regressions", "improvements"} <= set(data)
    assert data["normalisation"] == "per_step" and data["kind"] == "device"
    assert {"source", "steps", "total"} <= set(data["base"])
    assert data["base"]["steps"] == 20
    first = data["regressions"][0]
    assert set(first) >= REQUIRED_ENTRY_KEYS
    assert first["frame"] == "jit_step;copy" and first["name"] == "copy"
    assert first["significant"] is True and 0 <= first["p_value"] < 0.01
    # Per step: the values are means per step, the shares of each side's own total.
    assert first["self_base"] == pytest.approx(1_000_000, rel=0.05)
    assert len(data["regressions"]) <= 3
    deltas = [e["delta_self_pts"] for e in data["improvements"]]
    assert all(d < 0 for d in deltas)


def test_rank_tests_constant_rows_are_no_change() -> None:
    base = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    head = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [6.0, 7.0, 8.0, 9.0, 10.0]])
    result = noise.rank_tests(base, head, np.array([0, 1]))
    assert result.p_values[0] == 1.0 and result.effects[0] == 0.0
    assert result.p_values[1] < 0.01 and result.effects[1] == 1.0
