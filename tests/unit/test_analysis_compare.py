"""The noise model on per-step samples, either side of each threshold, and the JSON
contract of a comparison."""

from __future__ import annotations

import random

import numpy as np
import pytest

from exporter.analysis.compare import noise
from exporter.analysis.compare.comparison import compare_sides
from exporter.analysis.sides.load import Side
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
    """``steps`` device steps of ``ops`` (ns each); each step lasts as long as its ops."""
    rng = random.Random(seed)
    graphs = [step_graph({k: v * scale for k, v in ops.items()}, rng) for _ in range(steps)]
    whole = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for g in graphs:
        whole.merge(g)
    lengths = [g.root.total for g in graphs]
    return Side(name, "capture", "device", whole, graphs, lengths, "device_steps")


BASE = {"matmul": 6_000_000.0, "softmax": 2_000_000.0, "copy": 1_000_000.0, "fusion": 1_000_000.0}
STEP_NS = sum(BASE.values())


def with_growth(op: str, step_pct: float) -> dict[str, float]:
    """BASE where ``op`` takes ``step_pct`` % of the base step longer."""
    return BASE | {op: BASE.get(op, 0.0) + step_pct / 100 * STEP_NS}


def entry(comparison, name, basis="self"):  # type: ignore[no-untyped-def]
    return next(e for e in comparison.regressions if e.frame.name == name and e.basis == basis)


def test_an_op_that_grew_is_named_in_time_per_step_and_trips_the_gate() -> None:
    result = compare_sides(side(BASE, 20, 1, "base"), side(with_growth("copy", 15), 20, 2, "head"))
    assert result.normalisation == "per_step" and result.verdict_possible
    top = result.top_regression
    assert top is not None and top.frame.name == "copy" and top.basis == "self"
    assert top.significant and top.regression and not top.new
    assert top.q_value is not None and top.q_value < noise.FDR_ALPHA
    assert top.effect == pytest.approx(1.0)
    # 1.5 ms more per step on a 10 ms step. The other ops agree that the machine did not
    # change (scale 1: the consensus, not the 1.15 of all the common work), so all of it
    # is excess: 15 % of the step.
    assert top.delta_ms == pytest.approx(1.5, rel=0.05)
    assert result.step_verdict.scale == pytest.approx(1.0, abs=0.02)
    assert top.excess_ms == pytest.approx(1.5, rel=0.05)
    assert top.step_pct == pytest.approx(15, rel=0.05)
    assert result.failing(top.step_pct - 1) == [top] and not result.failing(top.step_pct + 1)
    assert result.step_verdict.change_pct == pytest.approx(15, abs=1.5)


def test_new_work_is_found_by_its_time_per_step() -> None:
    # A function absent from the base, at 5 % of the step: the common work's scale is
    # untouched, so all of its time is excess.
    result = compare_sides(side(BASE, 20, 1, "base"), side(with_growth("extra", 5), 20, 2, "h"))
    top = result.top_regression
    assert top is not None and top.frame.name == "extra" and top.new
    assert result.step_verdict.scale == pytest.approx(1.0, abs=0.01)
    assert top.step_pct == pytest.approx(5, rel=0.05)
    assert top.explains_pct == pytest.approx(100, abs=15)


def test_same_distribution_is_no_verdict_and_passes_the_gate() -> None:
    result = compare_sides(side(BASE, 20, 1, "base"), side(BASE, 20, 2, "head"))
    assert result.top_regression is None and result.failing(0) == []
    assert result.step_verdict.verdict == "unchanged"
    assert result.gate_reasons(0) == []


def test_uniform_slowdown_is_a_step_verdict_called_uniform_and_trips_the_gate() -> None:
    # Every op 1.5x slower: no frame's share moved and no frame has excess time.
    result = compare_sides(side(BASE, 20, 1, "base"), side(BASE, 20, 2, "head", scale=1.5))
    assert not [e for e in result.regressions if e.regression]
    verdict = result.step_verdict
    assert verdict.verdict == "slower" and verdict.uniform
    assert verdict.change_pct == pytest.approx(50, abs=2)
    assert verdict.scale == pytest.approx(1.5, rel=0.01)
    assert verdict.interval_pct is not None and verdict.interval_pct[0] > 40
    assert "uniform: all ops x1.5" in verdict.sentence()
    reasons = result.gate_reasons(10)
    assert len(reasons) == 1 and "step time +" in reasons[0] and "uniform" in reasons[0]
    assert result.gate_reasons(60) == []


@pytest.mark.parametrize(
    ("factor", "regression"), [(0.7, False), (1.6, True)], ids=["below", "above"]
)
def test_minimum_growth_either_side(factor: float, regression: bool) -> None:
    # "softmax" is 20 % of the step, so growing it by the floor's share of the step is a
    # relative change well past MIN_RELATIVE_CHANGE: the floor decides.
    grow = noise.MIN_GROWN_STEP_PCT["device"] * factor
    result = compare_sides(
        side(BASE, 20, 1, "base"), side(with_growth("softmax", grow), 20, 2, "h")
    )
    found = entry(result, "softmax")
    assert found.significant  # the rank test sees it either way
    assert found.regression is regression


@pytest.mark.parametrize(("factor", "regression"), [(0.5, False), (2.0, True)])
def test_minimum_new_work_either_side(factor: float, regression: bool) -> None:
    grow = noise.MIN_NEW_STEP_PCT["device"] * factor
    result = compare_sides(side(BASE, 20, 1, "base"), side(with_growth("extra", grow), 20, 2, "h"))
    assert entry(result, "extra").regression is regression


def test_a_runtime_wait_is_never_the_regression() -> None:
    # XLA's CPU executor waiting for its thunks grows with the work it waits on; the
    # work is judged, the wait is not.
    wait = "ThunkExecutor::Execute (wait for completion)"
    base = side(BASE | {wait: 1_000_000.0}, 20, 1, "base")
    head = side(BASE | {wait: 4_000_000.0}, 20, 2, "head")
    result = compare_sides(base, head)
    found = entry(result, wait)
    assert found.wait and not found.regression and found.excess_ms > 2
    assert result.top_regression is None
    assert any("runtime waits left out" in n for n in result.notes)


def test_the_gate_fails_only_on_verdicts() -> None:
    # The frame that shrank is significant but no regression: the gate ignores it.
    base = side(BASE, 20, 1, "base")
    head = side(BASE | {"matmul": 3_000_000.0}, 20, 2, "head")
    result = compare_sides(base, head)
    assert any(e.significant for e in result.improvements)
    assert result.failing(0) == [] and result.gate_reasons(3) == []


def test_a_regression_on_its_total_counts_for_the_gate() -> None:
    # Growth spread over many small new children: only the parent's total explains it.
    def graphs(extra: bool, seed: int) -> Side:
        rng = random.Random(seed)
        out = []
        for _ in range(20):
            graph = step_graph(BASE, rng)
            if extra:
                for k in range(40):
                    graph.add(["jit_step", "loop", f"op{k}"], 25_000)
            out.append(graph)
        whole = FlameGraph(sample_type="device_time", unit="nanoseconds")
        for g in out:
            whole.merge(g)
        return Side(
            "s", "capture", "device", whole, out, [g.root.total for g in out], "device_steps"
        )

    result = compare_sides(graphs(False, 1), graphs(True, 2))
    top = result.top_regression
    assert top is not None and top.basis == "total" and top.frame.name == "loop"
    assert top.step_pct == pytest.approx(10, rel=0.05)
    assert result.failing(5) == [top]


def test_below_the_minimum_steps_there_is_no_verdict() -> None:
    few = noise.MIN_STEPS - 1
    result = compare_sides(side(BASE, few, 1, "base"), side(with_growth("copy", 30), few, 2, "h"))
    assert not result.verdict_possible
    assert entry(result, "copy").p_value is not None
    assert not entry(result, "copy").significant and result.top_regression is None
    assert any("fewer than" in n for n in result.notes)
    assert result.step_verdict.verdict == "unknown"
    enough = compare_sides(
        side(BASE, noise.MIN_STEPS, 1, "b"), side(with_growth("copy", 30), noise.MIN_STEPS, 2, "h")
    )
    assert enough.verdict_possible and enough.top_regression is not None


def test_history_sets_the_step_noise() -> None:
    base, head = side(BASE, 20, 1, "base"), side(BASE, 20, 2, "head", scale=1.12)
    # Without history the device view's measured noise (5 %) calls +12 % slower; a
    # history whose runs spread by ~10 % does not.
    assert compare_sides(base, head).step_verdict.verdict == "slower"
    spread = [1.0e7, 1.1e7, 0.9e7, 1.05e7, 0.95e7]
    judged = compare_sides(base, head, history=spread).step_verdict
    assert judged.noise_source == "5 earlier runs"
    assert judged.noise_pct == noise.history_step_noise_pct(spread) > 12
    assert judged.verdict == "unchanged"
    tight = compare_sides(base, head, history=[1.0e7] * 4).step_verdict
    assert tight.noise_pct == noise.HISTORY_FLOOR_PCT and tight.verdict == "slower"


@pytest.mark.parametrize(
    ("grow_pts", "significant"),
    [(noise.SHARE_NOISE_FLOOR_PTS - 2, False), (noise.SHARE_NOISE_FLOOR_PTS + 3, True)],
)
def test_without_steps_a_change_counts_only_beyond_the_noise_floor(
    grow_pts: float, significant: bool
) -> None:
    # BASE's copy is 10 % of the total; growing it by g % of the old total moves its
    # share by about g * 0.9 / (1 + g / 100) points: ask for the points directly.
    target = (10 + grow_pts) / 100
    grown = target * (STEP_NS - 1_000_000) / (1 - target)
    base, head = side(BASE, 20, 1, "base"), side(BASE | {"copy": grown}, 20, 2, "head")
    base.steps, head.steps = [], []
    result = compare_sides(base, head)
    assert result.normalisation == "share" and result.noise_floor_pts == noise.SHARE_NOISE_FLOOR_PTS
    found = entry(result, "copy")
    assert found.significant is significant and found.p_value is None
    assert any("no step markers" in n for n in result.notes)
    assert result.step_verdict.verdict == "unknown"


def test_json_contract() -> None:
    result = compare_sides(side(BASE, 20, 1, "base"), side(with_growth("copy", 15), 20, 2, "head"))
    data = result.to_json(top=3)
    assert {"kind", "normalisation", "base", "head", "regressions", "improvements"} <= set(data)
    assert data["normalisation"] == "per_step" and data["kind"] == "device"
    assert data["view"] == "device"
    assert {"source", "steps", "total"} <= set(data["base"])
    assert data["base"]["steps"] == 20
    verdict = data["step_verdict"]
    assert {"base_median_ms", "head_median_ms", "change_pct", "interval_pct", "noise_pct",
            "verdict", "scale", "uniform", "explained_pct"} <= set(verdict)  # fmt: skip
    first = data["regressions"][0]
    per_step_keys = {"base_ms", "head_ms", "delta_ms", "excess_ms", "step_pct", "explains_pct"}
    assert set(first) >= REQUIRED_ENTRY_KEYS | per_step_keys | {"new", "wait"}
    assert first["frame"] == "jit_step;copy" and first["name"] == "copy"
    assert first["significant"] is True and 0 <= first["p_value"] < 0.01
    assert first["regression"] is True
    # Per step: the values are means per step, the shares of each side's own total.
    assert first["self_base"] == pytest.approx(1_000_000, rel=0.05)
    assert first["base_ms"] == pytest.approx(1.0, rel=0.05)
    assert len(data["regressions"]) <= 3
    deltas = [e["excess_ms"] for e in data["improvements"]]
    assert all(d < 0 for d in deltas)


def test_rank_tests_constant_rows_are_no_change() -> None:
    base = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    head = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [6.0, 7.0, 8.0, 9.0, 10.0]])
    result = noise.rank_tests(base, head, np.array([0, 1]))
    assert result.p_values[0] == 1.0 and result.effects[0] == 0.0
    assert result.p_values[1] < 0.01 and result.effects[1] == 1.0


# -- both orientations alike --------------------------------------------------------------


def cpu_side(ops: dict[str, float], steps: int, seed: int, name: str, scale: float = 1.0) -> Side:
    """``side`` read as the device view of a CPU capture (the ``xla_host`` noise view)."""
    made = side(ops, steps, seed, name, scale)
    made.view = "xla_host"
    return made


MIRROR = {"slower": "faster", "faster": "slower", "unchanged": "unchanged", "unknown": "unknown"}


def test_a_step_twice_as_fast_is_faster_and_the_swap_is_slower() -> None:
    # The step floor is a factor either way. Before: 80 % applied in percent both ways, so
    # x2.1 slower was "slower" while the same pair read backwards (-52.4 %) "unchanged".
    # On a CPU the floor is now x8 (measured at load 6-33): a change beyond it, both ways.
    factor = 1.2 * (1 + noise.STEP_NOISE_PCT["xla_host"] / 100)
    fast, slow = cpu_side(BASE, 20, 1, "fast"), cpu_side(BASE, 20, 2, "slow", scale=factor)
    forward, backward = compare_sides(slow, fast), compare_sides(fast, slow)
    assert forward.step_verdict.verdict == "faster"
    assert backward.step_verdict.verdict == "slower"
    lo, hi = forward.step_verdict.interval_pct or (0.0, 0.0)
    blo, bhi = backward.step_verdict.interval_pct or (0.0, 0.0)
    # The interval is the mirror image too: 1 + x and 1 / (1 + x).
    assert (1 + lo / 100) * (1 + bhi / 100) == pytest.approx(1, rel=1e-9)
    assert (1 + hi / 100) * (1 + blo / 100) == pytest.approx(1, rel=1e-9)
    # Both orientations name the same uniform cause.
    assert forward.step_verdict.uniform and backward.step_verdict.uniform


def test_one_capture_a_side_on_a_cpu_calls_no_x7_step_change() -> None:
    # Two processes of one unchanged workload had medians x8.6 apart at load 10-33 (16 of
    # 190 pairs beyond the x6 floor before: 8.4 % false step verdicts): x7 is noise.
    a, b = cpu_side(BASE, 20, 1, "a"), cpu_side(BASE, 20, 2, "b", scale=7.0)
    assert compare_sides(a, b).step_verdict.verdict == "unchanged"
    assert compare_sides(b, a).step_verdict.verdict == "unchanged"


@pytest.mark.parametrize("factor", [0.7, 0.9, 1.1, 1.3, 1 / 0.7, 1 / 0.9])
def test_swapping_the_sides_mirrors_the_step_verdict(factor: float) -> None:
    # Factors of the floor, each side of it, both directions.
    floor = 1 + noise.STEP_NOISE_PCT["xla_host"] / 100
    a, b = cpu_side(BASE, 20, 1, "a"), cpu_side(BASE, 20, 2, "b", scale=floor**factor)
    assert (
        compare_sides(b, a).step_verdict.verdict == MIRROR[compare_sides(a, b).step_verdict.verdict]
    )


def test_removed_work_is_the_mirror_of_new_work() -> None:
    # New work at 5 % of a CPU step is a regression from the new-work floor (2 %); read
    # backwards it is removed work, judged by the same floor (before: by the 30 % floor
    # of work that grew, so the swap had no verdict).
    base, head = cpu_side(BASE, 20, 1, "b"), cpu_side(with_growth("extra", 5), 20, 2, "h")
    forward = compare_sides(base, head).top_regression
    assert forward is not None and forward.frame.name == "extra" and forward.new
    backward = compare_sides(head, base)
    named = [e for e in backward.improvements if e.regression]
    assert named and named[0].frame.name == "extra"


# -- replicates -----------------------------------------------------------------------------


def replicate(
    ops: dict[str, float], seed: int, name: str, steps: int = 12, op_sigma: float = 0.04
) -> Side:
    """One process of a workload on a busy machine: every op slowed by the machine's load
    of that process (x0.7..x1.5), and each op on its own by a few % (ops move
    systematically between processes, which a test across one capture's steps cannot see).
    """
    rng = np.random.default_rng(seed)
    load = float(np.exp(rng.normal(0, 0.2)))
    moved = {k: v * load * float(np.exp(rng.normal(0, op_sigma))) for k, v in ops.items()}
    return cpu_side(moved, steps, seed, name)


def replicates(ops: dict[str, float], first_seed: int, n: int) -> list[Side]:
    return [replicate(ops, first_seed + i, f"c{first_seed + i}") for i in range(n)]


def test_replicates_judge_a_grown_op_between_captures() -> None:
    # An op grown by 10 % of the step: below the one-capture floor for work that grew on a
    # CPU (30 %), found between 4 captures a side, both orientations.
    base = replicates(BASE, 100, 4)
    head = replicates(with_growth("softmax", 10), 200, 4)
    forward = compare_sides(base, head)
    assert forward.replicated and forward.step_verdict.between_runs
    top = forward.top_regression
    assert top is not None and top.frame.name == "softmax"
    # Part of its growth goes into the machine-wide scale: with four ops, the grown one
    # is within x1.5 of the others' ratio and so of their consensus.
    assert 4 < top.step_pct < 14
    backward = compare_sides(head, base)
    shrunk = [e for e in backward.improvements if e.regression]
    assert shrunk and shrunk[0].frame.name == "softmax"
    # One capture a side of the same change: the floors hold it (no between-run noise).
    single = compare_sides(base[0], head[0])
    assert not single.replicated and single.top_regression is None
    data = single.to_json()
    assert data["noise"]["between_runs"]["measured"] is False
    assert data["min_detectable"]["between_run_noise"] == "not measured"
    assert any("no measured between-run noise" in n for n in single.notes)


def test_replicates_of_one_workload_have_no_verdict_either_way() -> None:
    for seed in range(5):
        a, b = replicates(BASE, 300 + 10 * seed, 4), replicates(BASE, 400 + 10 * seed, 4)
        for one, other in ((a, b), (b, a)):
            result = compare_sides(one, other)
            assert result.step_verdict.verdict == "unchanged"
            assert result.top_regression is None
            assert not [e for e in result.improvements if e.regression]


def test_replicates_call_a_uniform_slowdown_and_its_mirror() -> None:
    base = replicates(BASE, 500, 4)
    head = [replicate({k: 1.6 * v for k, v in BASE.items()}, 600 + i, f"h{i}") for i in range(4)]
    forward, backward = compare_sides(base, head), compare_sides(head, base)
    assert forward.step_verdict.verdict == "slower" and forward.step_verdict.uniform
    assert backward.step_verdict.verdict == "faster" and backward.step_verdict.uniform
    assert forward.step_verdict.p_value == pytest.approx(backward.step_verdict.p_value)
    assert forward.step_verdict.to_json()["replicates"] == [4, 4]
    assert not [e for e in forward.regressions if e.regression]


def test_min_detectable_shrinks_with_captures_and_names_how_many() -> None:
    def stated(n: int) -> dict[str, object]:
        return compare_sides(replicates(BASE, 700, n), replicates(BASE, 800, n)).min_detectable

    two, eight = stated(2), stated(8)
    for md in (two, eight):
        assert md["between_run_noise"] == "measured" and md["false_alarm_rate"] == 0.01
        assert isinstance(md["captures_for_5pct"], dict)
    assert eight["step_change_pct"] < two["step_change_pct"]  # type: ignore[operator]
    assert eight["frame_excess_pct"] < two["frame_excess_pct"]  # type: ignore[operator]
    frames_needed = eight["captures_for_5pct"]["frame"]  # type: ignore[index]
    assert isinstance(frames_needed, int) and 2 <= frames_needed <= 64
    # The figure is the test's own: a change of it is (just) called, half of it is not.
    assert eight["frame_excess_ms"] == pytest.approx(
        eight["frame_excess_pct"] / 100 * STEP_NS / 1e6,
        rel=0.3,  # type: ignore[operator]
    )
    single = compare_sides(side(BASE, 20, 1, "b"), side(BASE, 20, 2, "h")).min_detectable
    assert single["frame_excess_pct"] == noise.MIN_GROWN_STEP_PCT["device"]
    assert single["captures_for_5pct"] == {"step": None, "frame": None}
    assert "one capture a side" in str(single["basis"])


def test_a_sequence_of_one_side_is_that_side() -> None:
    base, head = side(BASE, 20, 1, "b"), side(with_growth("copy", 15), 20, 2, "h")
    one, listed = compare_sides(base, head), compare_sides([base], [head])
    assert one.to_json() == listed.to_json()


def test_replicate_sides_must_be_given_and_of_one_kind() -> None:
    base = side(BASE, 20, 1, "b")
    with pytest.raises(ValueError, match="no head side"):
        compare_sides(base, [])
    other = side(BASE, 20, 2, "h")
    other.kind = "host"
    with pytest.raises(ValueError, match="cannot compare"):
        compare_sides([base, base], [other])


def test_explains_only_a_step_change_beyond_noise() -> None:
    # A no-change comparison: frames moved, the step did not beyond noise; a share of a
    # noise-sized change is no explanation (it read "explains -752 %").
    result = compare_sides(cpu_side(BASE, 20, 1, "b"), cpu_side(BASE, 20, 2, "h", scale=1.1))
    assert result.step_verdict.verdict == "unchanged"
    assert all(e.explains_pct is None for e in [*result.regressions, *result.improvements])


def test_new_work_between_two_captures_a_side_is_judged_across_steps() -> None:
    # Student's t with 2 + 2 captures has 2 degrees of freedom: nothing short of a huge
    # change passes it. New work is absent from every base capture, so no base run varies
    # it: its steps are the samples, as with one capture a side.
    base, head = replicates(BASE, 900, 2), replicates(with_growth("extra", 5), 910, 2)
    forward = compare_sides(base, head)
    assert forward.replicated
    top = forward.top_regression
    assert top is not None and top.frame.name == "extra" and top.new
    named = [e for e in compare_sides(head, base).improvements if e.regression]
    assert named and named[0].frame.name == "extra"


def test_the_text_and_page_state_min_detectable_and_one_step_statistic() -> None:
    from exporter.analysis.report.render import comparison_html, comparison_text

    result = compare_sides(replicates(BASE, 100, 4), replicates(with_growth("softmax", 10), 200, 4))
    text = comparison_text(result)
    assert "smallest change 4 + 4 captures could show" in text
    assert "captures a side for 5 %" in text and "Student's t between the 4 + 4" in text
    page = comparison_html(result)
    assert "smallest change 4 + 4 captures could show" in page
    # The page's step change is the verdict's (medians), as the text's is, not the mean.
    change = result.step_verdict.change_pct
    assert change is not None and f"median step {change:+.1f}%" in page
    single = comparison_text(compare_sides(side(BASE, 20, 1, "b"), side(BASE, 20, 2, "h")))
    assert "between-run noise not measured (one capture a side)" in single
    # The header names the columns' unit (ms per step), not the raw "nanoseconds".
    assert single.splitlines()[0] == "device, device_time (ms per step), normalisation per_step"


def test_the_diff_page_colours_by_excess_per_step() -> None:
    import json
    import re

    from exporter.analysis.report.render import comparison_html

    # Every op x1.5 and softmax x3: by share the unchanged ops read "shrank" beside it; by
    # excess beyond the machine-wide scale they are no change.
    grown = {k: 1.5 * v for k, v in BASE.items()} | {"softmax": 3 * BASE["softmax"]}
    result = compare_sides(side(BASE, 20, 1, "b"), side(grown, 20, 2, "h"))
    page = comparison_html(result)
    match = re.search(r'<script id="diff-data" type="application/json">(.*?)</script>', page, re.S)
    assert match is not None
    data = json.loads(match.group(1))
    assert data["colourBy"] == "excess" and data["stepValue"] > 0
    frames = {c["n"]: c for c in data["root"]["c"][0]["c"]}
    floor = data["excessFloorPct"] / 100 * data["stepValue"]
    assert abs(frames["matmul"]["ex"]) < 2 * floor  # unchanged beyond the scale: grey
    assert frames["softmax"]["ex"] > 10 * floor  # the regression: red


def test_two_captures_a_side_state_what_is_beyond_reach_and_what_would_do() -> None:
    from exporter.analysis.report.render import detectable_sentence

    # Ops that move by half between processes, 2 degrees of freedom: no number for a grown
    # frame (it read 343024 % of the step), and how many captures would do.
    base = [replicate(BASE, 950 + i, f"b{i}", op_sigma=0.5) for i in range(2)]
    head = [replicate(BASE, 960 + i, f"h{i}", op_sigma=0.5) for i in range(2)]
    md = compare_sides(base, head).min_detectable
    assert md["frame_excess_pct"] is None and md["frame_excess_ms"] is None
    assert md["between_run_noise"] == "measured"
    said = detectable_sentence(md)
    assert "a frame's excess beyond reach" in said and "captures a side for 5 %" in said
