"""The recording rules the Fleet dashboard reads: rendered file, promtool, Kubernetes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from alerts import recording
from alerts.recording import RECORDING_FILE, render_prometheus_rule, render_recording_rules
from tests.harness import ROOT

RULE_TESTS = sorted((ROOT / "alerts" / "tests" / "recording").glob("*.yaml"))
K8S_RULE = ROOT / "deploy" / "k8s" / "prometheusrule-recording.yaml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus (apt-get install prometheus)")
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)


def test_committed_rules_are_the_render() -> None:
    assert RECORDING_FILE.read_text(encoding="utf-8") == render_recording_rules(), (
        "alerts/mlprof-recording-rules.yaml is stale: run `python -m alerts.recording`"
    )
    assert K8S_RULE.read_text(encoding="utf-8") == render_prometheus_rule(), (
        "deploy/k8s/prometheusrule-recording.yaml is stale: python -m alerts.recording "
        "--prometheus-rule mlprof-recording -o deploy/k8s/prometheusrule-recording.yaml"
    )


def test_check_command_reports_a_stale_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(render_recording_rules().replace("[5m]", "[1m]"), encoding="utf-8")
    assert recording.main(["--check", "-o", str(path)]) == 1
    assert recording.main(["-o", str(path)]) == 0
    assert recording.main(["--check", "-o", str(path)]) == 0


def test_promtool_accepts_the_rules() -> None:
    result = run(promtool(), "check", "rules", RECORDING_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_tests_pass(path: Path) -> None:
    result = run(promtool(), "test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_tests_fail_when_a_rule_is_wrong(tmp_path: Path) -> None:
    """The hand-worked values pin the rules: the duty cycle averaged over every source
    (SDK estimate included) would fail them."""
    wrong = render_recording_rules().replace(
        'avg by (workload, run_id, host) (accelerator_duty_cycle{source!="sdk"})',
        "avg by (workload, run_id, host) (accelerator_duty_cycle)",
    )
    assert wrong != render_recording_rules()
    (tmp_path / "mlprof-recording-rules.yaml").write_text(wrong, encoding="utf-8")
    (tmp_path / "tests" / "recording").mkdir(parents=True)
    for path in RULE_TESTS:
        shutil.copy(path, tmp_path / "tests" / "recording")
    result = run(promtool(), "test", "rules", *sorted((tmp_path / "tests" / "recording").iterdir()))
    assert result.returncode != 0
    assert "run_host:accelerator_duty_cycle:avg" in result.stdout + result.stderr


def test_recorded_series_keep_the_labels_the_fleet_filters_on() -> None:
    groups = yaml.safe_load(RECORDING_FILE.read_text(encoding="utf-8"))["groups"]
    assert [g["name"] for g in groups] == [recording.GROUP]
    for rule in groups[0]["rules"]:
        level = rule["record"].split(":")[0]
        by = {"workload": "(workload", "workload_quantile": "(workload, le)",
              "run_host": "(workload, run_id, host)",
              "run_buffer_size_quantile": "(workload, run_id, buffer_size, le)"}[level]  # fmt: skip
        assert by in rule["expr"], rule["record"]


def test_collective_quantiles_fail_when_computed_per_host(tmp_path: Path) -> None:
    """A quantile per host (what the percentile gauges give) is not the slice's."""
    wrong = render_recording_rules().replace(
        "sum by (workload, run_id, buffer_size, le)",
        "sum by (workload, run_id, host, buffer_size, le)",
    )
    assert wrong != render_recording_rules()
    (tmp_path / "mlprof-recording-rules.yaml").write_text(wrong, encoding="utf-8")
    (tmp_path / "tests" / "recording").mkdir(parents=True)
    test = ROOT / "alerts" / "tests" / "recording" / "collective.yaml"
    shutil.copy(test, tmp_path / "tests" / "recording")
    result = run(promtool(), "test", "rules", tmp_path / "tests" / "recording" / test.name)
    assert result.returncode != 0
    assert recording.COLLECTIVE_QUANTILE in result.stdout + result.stderr
