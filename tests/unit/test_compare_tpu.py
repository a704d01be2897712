"""The comparison on TPU-shaped captures (device planes, hardware time): a uniform
slowdown is a step-time verdict called uniform, the gate trips on it, and the analysis
against a baseline is not OPTIMAL; the same capture twice has no verdict."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from exporter.cli import main
from exporter.testing.synthetic import write_tpu_capture


def captures(tmp_path: Path) -> tuple[Path, Path, Path]:
    shape = {"devices": 2, "steps": 8, "ops_per_step": 300, "distinct_ops": 60}
    base = tmp_path / "base" / "tpu-vm-0.xplane.pb"
    again = tmp_path / "again" / "tpu-vm-0.xplane.pb"
    slow = tmp_path / "slow" / "tpu-vm-0.xplane.pb"
    write_tpu_capture(base, **shape)
    write_tpu_capture(again, **shape)
    write_tpu_capture(slow, slowdown=1.5, **shape)
    return base, again, slow


def test_every_op_slower_is_uniform_and_trips_the_gate(tmp_path: Path) -> None:
    base, _, slow = captures(tmp_path)
    out = tmp_path / "diff.json"
    done = CliRunner().invoke(
        main,
        ["compare", str(base), str(slow), "--format", "json", "-o", str(out),
         "--fail-on-regression", "10"],
    )  # fmt: skip
    assert done.exit_code == 1, done.output
    assert "step time +" in done.output and "uniform" in done.output, done.output
    verdict = json.loads(out.read_text())["step_verdict"]
    assert verdict["verdict"] == "slower" and verdict["uniform"], verdict
    assert 45 <= verdict["change_pct"] <= 52 and 1.45 <= verdict["scale"] <= 1.52, verdict
    text = CliRunner().invoke(main, ["compare", str(base), str(slow)]).output
    assert "uniform: all ops x1.4" in text or "uniform: all ops x1.5" in text
    assert "machine, clock or configuration" in text


def test_analysis_against_the_baseline_is_not_optimal_on_a_uniform_slowdown(
    tmp_path: Path,
) -> None:
    base, _, slow = captures(tmp_path)
    done = CliRunner().invoke(
        main, ["analyze", str(slow), "--baseline", str(base), "--no-xprof", "--format", "json"]
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output[done.output.index("{") :])
    assert report["status"] == "NEEDS_ATTENTION"
    lead = report["findings"][0]
    assert lead["rule"] == "BaselineRegressionRule" and "every op slower alike" in lead["title"]


def test_the_same_capture_twice_has_no_verdict_and_passes_the_gate(tmp_path: Path) -> None:
    base, again, _ = captures(tmp_path)
    done = CliRunner().invoke(main, ["compare", str(base), str(again), "--fail-on-regression", "1"])
    assert done.exit_code == 0, done.output
    assert "within noise" in done.output and "passed" in done.output
