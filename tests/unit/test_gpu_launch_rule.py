"""``LaunchBoundRule``: each side of its thresholds, and on synthetic GPU captures whose
kernels are long (the host launches ahead: silent) or short (the device waits: fires)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts.capture import CaptureFacts, gather_facts
from exporter.analysis.report import rules
from exporter.testing.synthetic_gpu import write_gpu_capture


def _facts(share: float, per_step: bool = True) -> CaptureFacts:
    launch: dict[str, Any] = {
        "available": True, "launch_overhead_ms": 1.0, "share_pct": share, "gaps": 40,
        "launch_gaps": 30, "host_gaps": 10, "median_gap_us": 4.2,
        "top_latency": [{"name": "loop_add_fusion", "hlo_op": "add.1", "launches": 9,
                         "mean_us": 11.0, "max_us": 20.0}],
        "per_step": {"steps": 4, "launch_overhead_ms_per_step": 0.25,
                     "share_of_step_pct": share} if per_step else None,
    }  # fmt: skip
    facts = CaptureFacts(backend="gpu")
    facts.gpu_kernels = {"available": True, "kernel_count": 200, "total_ms": 3.0,
                         "launch_overhead": launch}  # fmt: skip
    return facts


@pytest.mark.parametrize(
    ("pct", "priority"),
    [(2.99, None), (3.0, "P2"), (14.99, "P2"), (15.0, "P1"), (80.0, "P1")],
)
def test_launch_bound_thresholds(pct: float, priority: str | None) -> None:
    found = rules.LaunchBoundRule().apply(_facts(pct))
    assert (found.priority if found else None) == priority
    if found:
        assert found.evidence["launch_overhead_pct"] == round(pct, 2)
        assert found.evidence["launch_overhead_ms_per_step"] == 0.25
        assert "loop_add_fusion" in found.detail and "per step" in found.title
        assert found.to_json()["top_latency"][0]["name"] == "loop_add_fusion"


def test_without_steps_the_share_is_of_the_kernel_span() -> None:
    found = rules.LaunchBoundRule().apply(_facts(20.0, per_step=False))
    assert found is not None and found.priority == "P1"
    assert "kernels' span" in found.title and "steps" not in found.evidence


def test_unknown_launch_overhead_is_silent() -> None:
    facts = _facts(50.0)
    assert facts.gpu_kernels is not None
    facts.gpu_kernels["launch_overhead"] = {"available": False, "reason": "no launch calls"}
    assert rules.LaunchBoundRule().apply(facts) is None
    assert rules.LaunchBoundRule().apply(CaptureFacts(backend="tpu")) is None


@pytest.mark.parametrize(("gemm_every", "fires"), [(6, False), (0, True)])
def test_on_synthetic_gpu_captures(tmp_path: Path, gemm_every: int, fires: bool) -> None:
    path = tmp_path / "gpu.xplane.pb"
    write_gpu_capture(path, steps=4, kernels_per_step=24, gemm_every=gemm_every)
    facts = gather_facts([path], xprof=False)
    found = rules.LaunchBoundRule().apply(facts)
    share = facts.to_json()["gpu_kernels"]["launch_overhead"]["per_step"]["share_of_step_pct"]
    assert (found is not None) == fires, share
    names = [f.rule for f in rules.apply_rules(facts)]
    assert ("LaunchBoundRule" in names) == fires
