"""Each finding's rule on either side of its thresholds (as XProf's smart_suggestion
rule tests do), the verdict, and unknown facts staying silent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exporter.analysis.facts.capture import CaptureFacts
from exporter.analysis.report import rules
from exporter.analysis.report.document import Report


def facts(**overrides: Any) -> CaptureFacts:
    base = CaptureFacts(
        backend="tpu",
        files=["h.xplane.pb"],
        steps={
            "count": 20,
            "mean_ms": 100.0,
            "median_ms": 100.0,
            "p90_ms": 101.0,
            "min_ms": 99.0,
            "max_ms": 102.0,
            "stdev_ms": 1.0,
            "cv": 0.01,
            "outliers": 0,
            "cycle_mean_ms": 100.0,
            "source": "device_steps",
        },
        breakdown={
            "cycle_total_ms": 2000.0,
            "xla_pct": 95.0,
            "input_wait_pct": 5.0,
            "data_phase_pct": 3.0,
            "between_steps_pct": 1.0,
            "host_other_pct": 1.0,
        },
        compiler={"data_formatting_pct": 1.0, "data_formatting_ms": 20.0, "ops": []},
        recompilation={"compilations": 0, "in_steps": 0, "compile_ms": 0.0, "in_steps_pct": 0.0},
    )
    for key, value in overrides.items():
        current = getattr(base, key)
        setattr(base, key, current | value if isinstance(current, dict) and value else value)
    return base


def wait(pct: float, data: float | None = None, host: float = 0.5) -> dict[str, float]:
    """A breakdown where ``pct`` of the step loads data (``data`` of it annotated)."""
    data = pct - 0.5 if data is None else data
    between = pct - data
    return {
        "xla_pct": 100 - pct - host,
        "input_wait_pct": pct + host,
        "data_phase_pct": data,
        "between_steps_pct": between,
        "host_other_pct": host,
    }


@pytest.mark.parametrize(
    ("pct", "priority"),
    [
        (rules.INPUT_WAIT_P2_PCT - 0.1, None),
        (rules.INPUT_WAIT_P2_PCT, "P2"),
        (rules.INPUT_WAIT_P1_PCT - 0.1, "P2"),
        (rules.INPUT_WAIT_P1_PCT, "P1"),
        (rules.INPUT_WAIT_P0_PCT - 0.1, "P1"),
        (rules.INPUT_WAIT_P0_PCT, "P0"),
    ],
)
def test_input_wait_thresholds(pct: float, priority: str | None) -> None:
    found = rules.InputWaitRule().apply(facts(breakdown=wait(pct)))
    assert (found.priority if found else None) == priority
    if found:
        assert found.evidence["input_pct"] == pytest.approx(pct)
        assert f"{pct:.1f}%" in found.title  # the measured share is quoted
        assert "prefetch" in found.suggestion


def test_time_between_step_annotations_is_input_too() -> None:
    found = rules.InputWaitRule().apply(facts(breakdown=wait(60, data=0)))
    assert found is not None and found.priority == "P0"
    assert "between step annotations" in found.detail


@pytest.mark.parametrize(
    ("pct", "priority"),
    [
        (rules.HOST_WAIT_P2_PCT - 0.1, None),
        (rules.HOST_WAIT_P2_PCT, "P2"),
        (rules.HOST_WAIT_P1_PCT, "P1"),
        (rules.HOST_WAIT_P0_PCT, "P0"),
    ],
)
def test_host_wait_is_not_called_input(pct: float, priority: str | None) -> None:
    hot = facts(breakdown=wait(1, host=pct))
    assert rules.InputWaitRule().apply(hot) is None
    found = rules.HostWaitRule().apply(hot)
    assert (found.priority if found else None) == priority
    if found:
        assert "Python" in found.suggestion and "prefetch" not in found.suggestion
        assert f"{pct:.1f}%" in found.title


def test_unknown_steps_give_no_input_finding() -> None:
    assert rules.InputWaitRule().apply(facts(steps=None, breakdown=None)) is None


def host_with_steps(lengths_ms: list[float]) -> Any:
    from exporter.analysis.facts.capture import _Host

    cycles, t = [], 0
    for length in lengths_ms:
        cycles.append((t, t + int(length * 1e6)))
        t += int(length * 1e6)
    zeros = np.zeros(len(cycles))
    return _Host(cycles, list(cycles), zeros, zeros, [], zeros)


def test_one_step_at_twice_the_median_is_a_slow_step_in_ms() -> None:
    from exporter.analysis.facts.capture import _step_facts

    steps = _step_facts([host_with_steps([100.0 + (i % 3) for i in range(19)] + [200.0])])
    assert steps is not None and steps["outliers"] == 1 and steps["outlier_ms"] == [200.0]
    assert steps["outlier_excess_ms"] == pytest.approx(99.0)
    found = rules.StepTimeSpreadRule().apply(facts(steps=steps))
    assert found is not None and found.priority == "P2"
    assert found.title == "1 slow step: 99.0 ms beyond the median step"
    assert "99.0 ms more than median steps" in found.impact


def test_steady_steps_have_no_slow_step_finding_whatever_their_spread() -> None:
    from exporter.analysis.facts.capture import _step_facts

    # A wide but even spread (cv 0.3) has no outlier: nothing hides behind the mean.
    even = _step_facts([host_with_steps([70.0, 100.0, 130.0] * 7)])
    assert even is not None and even["cv"] > 0.2 and even["outliers"] == 0
    assert rules.StepTimeSpreadRule().apply(facts(steps=even)) is None


def test_slow_steps_costing_a_tenth_of_the_time_are_p1() -> None:
    from exporter.analysis.facts.capture import _step_facts

    steps = _step_facts([host_with_steps([100.0] * 17 + [400.0, 400.0, 400.0])])
    found = rules.StepTimeSpreadRule().apply(facts(steps=steps))
    assert found is not None and found.priority == "P1"


def test_step_spread_needs_three_steps() -> None:
    few = facts(steps={"outliers": 1, "outlier_excess_ms": 50.0,
                       "count": rules.STEP_SPREAD_MIN_STEPS - 1})  # fmt: skip
    assert rules.StepTimeSpreadRule().apply(few) is None


def test_input_impact_splits_overlap_from_a_faster_loader() -> None:
    # Loading 20.4 ms of a 22.1 ms step, 1.7 ms of XLA: overlap alone hides only the
    # compute (22.1 / 20.4 = 1.08x); a loader with no wait makes it 22.1 / 1.7 = 13x.
    step = facts(
        steps={"mean_ms": 22.1},
        breakdown={"xla_pct": 7.69, "input_wait_pct": 92.31, "data_phase_pct": 92.31,
                   "between_steps_pct": 0.0, "host_other_pct": 0.0},
    )  # fmt: skip
    found = rules.InputWaitRule().apply(step)
    assert found is not None
    assert "Overlapping loading with compute would make steps 1.08x faster" in found.impact
    assert "a loader fast enough to leave no wait, 12.99x" in found.impact
    assert "the loader itself must get faster" in found.impact


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("input_pipeline", True),
        ("DataLoader.__next__", True),
        ("data_loading", True),
        ("next_batch", True),
        ("Iterator::Prefetch", True),
        ("IteratorGetNext", True),
        ("backend_compile_and_load", False),
        ("AllocateOutputBuffersWithInputReuse", False),
        ("train", False),
    ],
)
def test_data_phase_names(name: str, data: bool) -> None:
    from exporter.analysis.facts.capture import is_data_phase

    assert is_data_phase(name) is data


def test_recompiling_a_quarter_of_the_step_is_p0() -> None:
    busy = {"compilations": 22, "in_steps": 22, "compile_ms": 1400.0}
    low = rules.RecompilationRule().apply(facts(recompilation=busy | {"in_steps_pct": 20.0}))
    high = rules.RecompilationRule().apply(
        facts(recompilation=busy | {"in_steps_pct": rules.RECOMPILE_P0_PCT})
    )
    assert low is not None and low.priority == "P1"
    assert high is not None and high.priority == "P0"


def test_memory_note_names_cpu_only_on_cpu() -> None:
    from exporter.analysis.facts.capture import _memory

    for backend, said in (("cpu", True), ("tpu", False)):
        found = CaptureFacts(backend=backend)
        _memory(found, [])
        assert ("JAX reports none on CPU" in found.unavailable["memory"]) is said


@pytest.mark.parametrize(
    ("pct", "priority"),
    [
        (rules.FORMATTING_P2_PCT - 0.1, None),
        (rules.FORMATTING_P2_PCT, "P2"),
        (rules.FORMATTING_P1_PCT, "P1"),
    ],
)
def test_compiler_inefficiency(pct: float, priority: str | None) -> None:
    found = rules.CompilerInefficiencyRule().apply(facts(compiler={"data_formatting_pct": pct}))
    assert (found.priority if found else None) == priority


@pytest.mark.parametrize(
    ("in_steps", "pct", "priority"),
    [(0, 0.0, None), (1, rules.RECOMPILE_P1_PCT - 0.1, "P2"), (2, rules.RECOMPILE_P1_PCT, "P1")],
)
def test_recompilation(in_steps: int, pct: float, priority: str | None) -> None:
    found = rules.RecompilationRule().apply(
        facts(
            recompilation={
                "compilations": in_steps + 1,
                "in_steps": in_steps,
                "compile_ms": 50.0,
                "in_steps_pct": pct,
            }
        )
    )
    assert (found.priority if found else None) == priority


@pytest.mark.parametrize(
    ("pct", "priority", "risk"),
    [
        (rules.OOM_MEDIUM_PCT - 0.1, None, None),
        (rules.OOM_MEDIUM_PCT, "P1", "MEDIUM"),
        (rules.OOM_HIGH_PCT, "P0", "HIGH"),
    ],
)
def test_oom_risk(pct: float, priority: str | None, risk: str | None) -> None:
    memory = {
        "peak_bytes": int(pct * 2**30),
        "capacity_bytes": 100 * 2**30,
        "peak_pct": pct,
        "source": "test",
    }
    found = rules.OomRiskRule().apply(facts(memory=memory))
    assert (found.priority if found else None) == priority
    if found:
        assert risk in found.title


def test_no_memory_fact_no_oom_finding() -> None:
    assert rules.OomRiskRule().apply(facts(memory=None)) is None


def baseline(added: float, step: float | None) -> dict[str, Any]:
    """A per-step baseline whose top regression adds ``added`` % of the step."""
    return {
        "session": "s-good",
        "kind": "device",
        "normalisation": "per_step",
        "steps": 40,
        "step_time_change_pct": step,
        "noise_floor_pts": None,
        "top_regression": {
            "frame": "jit_step;fusion.2",
            "name": "fusion.2",
            "basis": "self",
            "self_base_pct": 4.0,
            "self_head_pct": 4.0 + added,
            "delta_self_pts": added,
            "base_ms": 0.4,
            "head_ms": 0.4 + added / 10,
            "excess_ms": added / 10,
            "step_pct": added,
            "new": False,
            "q_value": 1e-6,
        },
    }


@pytest.mark.parametrize(
    ("added", "step", "priority"),
    [
        (5.0, 10.0, "P1"),
        (rules.BASELINE_P0_ADDED_PCT, 10.0, "P0"),
        (5.0, rules.BASELINE_P0_STEP_PCT, "P0"),
    ],
)
def test_baseline_regression_leads_the_findings(added: float, step: float, priority: str) -> None:
    found = rules.apply_rules(facts(breakdown=wait(60)), baseline(added, step))
    assert found[0].rule == "BaselineRegressionRule" and found[0].priority == priority
    assert "fusion.2" in found[0].title and f"+{added / 10:.3g} ms per step" in found[0].title
    assert f"({added:.1f}% of the step)" in found[0].title
    assert found[1].priority == "P0"  # the input wait follows


def test_a_uniform_slowdown_against_the_baseline_is_a_finding() -> None:
    base = baseline(0, 50.0) | {
        "top_regression": None,
        "step_verdict": {"verdict": "slower", "scale": 1.49, "base_median_ms": 10.0,
                         "head_median_ms": 15.0, "noise_pct": 5.0},
    }  # fmt: skip
    found = rules.apply_rules(facts(), base)
    assert found[0].rule == "BaselineRegressionRule" and found[0].priority == "P0"
    assert "every op slower alike (x1.49)" in found[0].title
    assert "machine, clock or configuration" in found[0].suggestion
    calm = base | {"step_verdict": {"verdict": "unchanged"}}
    assert not [f for f in rules.apply_rules(facts(), calm) if f.rule == "BaselineRegressionRule"]


def test_verdict_and_summary() -> None:
    calm = Report({"spec": "x"}, facts(), rules.apply_rules(facts()))
    assert calm.status == "OPTIMAL" and not calm.findings
    slow = {"outliers": 1, "outlier_excess_ms": 50.0, "outlier_ms": [150.0]}
    minor = Report({"spec": "x"}, facts(), rules.apply_rules(facts(steps=slow)))
    assert minor.status == "OPTIMAL" and minor.counts()["P2"] == 1
    hot = facts(breakdown=wait(55))
    urgent = Report({"spec": "x"}, hot, rules.apply_rules(hot))
    assert urgent.status == "NEEDS_ATTENTION"
    sentences = [s for s in urgent.summary.split(". ") if s]
    assert 3 <= len(sentences) <= 6
    assert "55.0%" in urgent.summary
    data = urgent.to_json()
    assert {"status", "summary", "facts", "findings", "baseline"} <= set(data)
    finding = data["findings"][0]
    assert {"priority", "title", "detail", "evidence", "impact", "suggestion"} <= set(finding)
    assert all(isinstance(v, int | float) for v in finding["evidence"].values())
