"""The shipped alerting content: rendered rules, promtool rule tests, Alertmanager example.

Runs Debian's promtool and amtool for real (CI installs ``prometheus`` and
``prometheus-alertmanager``); a missing binary fails the test with the package to install.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import render
from alerts.render import (
    ALERT_NAMES,
    RULES_FILE,
    RuleConfigError,
    load_overrides,
    render_alertmanager_config,
    render_prometheus_rule,
    render_rules,
)

ALERTS = RULES_FILE.parent
RULE_TESTS = sorted((ALERTS / "tests").glob("*.yaml"))
DEGRADATION_ALERTS = {
    "MLWorkloadDutyCycleLow",
    "MLWorkloadDutyCycleDrop",
    "MLWorkloadStepTimeRegression",
    "MLAcceleratorInterconnectLatencyRegression",
    "MLWorkloadInputBound",
}
# Rules over the accelerator sources' series (NVML, libtpu).
ACCELERATOR_ALERTS = {
    "MLAcceleratorThrottled",
    "MLAcceleratorXidErrors",
    "MLAcceleratorEccUncorrectable",
    "MLAcceleratorMemoryHeadroomLow",
    "MLAcceleratorInterconnectLatencyRegression",
}
# Every name the accelerator sources emit, as their golden expositions show it.
GOLDEN_NAMES = {
    line.split("{")[0].split(" ")[0]
    for golden in (ALERTS.parent / "tests" / "fixtures").glob("*.prom")
    for line in golden.read_text(encoding="utf-8").splitlines()
    if line and not line.startswith("#")
}
DASHBOARD = ALERTS.parent / "dashboards" / "mlprof-run.json"  # the Run dashboard


def tool(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} not found on PATH: install Debian's {package} (apt-get install {package})"
        )
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)


def alerts_of(text: str) -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(text)["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


# -- the rendered file ---------------------------------------------------------------


def test_committed_rules_are_the_render_of_the_thresholds_table() -> None:
    assert RULES_FILE.read_text(encoding="utf-8") == render_rules(), (
        "alerts/mlprof-rules.yaml is stale: run `python -m alerts.render` and commit it"
    )


def test_render_check_command_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "rules.yaml"
    stale.write_text(render_rules().replace("for: 15m", "for: 1m"), encoding="utf-8")
    assert render.main(["--check", "-o", str(stale)]) == 1
    assert render.main(["-o", str(stale)]) == 0
    assert render.main(["--check", "-o", str(stale)]) == 0


def test_promtool_accepts_the_shipped_rules() -> None:
    promtool = tool("promtool", "prometheus")
    result = run(promtool, "check", "rules", RULES_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in result.stdout


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_tests_pass(path: Path) -> None:
    promtool = tool("promtool", "prometheus")
    result = run(promtool, "test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert spec["rule_files"] == ["../mlprof-rules.yaml"], path
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                expected = check.get("exp_alerts") or []
                (firing if expected else silent).add(check["alertname"])
                for alert in expected:
                    # Full labels and annotations, not a subset.
                    assert set(alert["exp_annotations"]) == {
                        "summary",
                        "description",
                        "runbook_url",
                        "dashboard_url",
                    }, (path, check["alertname"])
                    assert "severity" in alert["exp_labels"], (path, check["alertname"])
    assert firing == set(ALERT_NAMES), f"no firing case for {set(ALERT_NAMES) - firing}"
    assert silent == set(ALERT_NAMES), f"no silent case for {set(ALERT_NAMES) - silent}"


def test_rule_tests_fail_when_a_threshold_is_wrong(tmp_path: Path) -> None:
    """The promtool cases pin the thresholds: a rule that fires too late fails them."""
    promtool = tool("promtool", "prometheus")
    (tmp_path / "mlprof-rules.yaml").write_text(
        render_rules({"alerts": {"MLWorkloadDutyCycleLow": {"threshold": 0.25}}}),
        encoding="utf-8",
    )
    (tmp_path / "tests").mkdir()
    shutil.copy(ALERTS / "tests" / "workload.yaml", tmp_path / "tests" / "workload.yaml")
    result = run(promtool, "test", "rules", tmp_path / "tests" / "workload.yaml")
    assert result.returncode != 0, result.stdout
    assert "MLWorkloadDutyCycleLow" in result.stdout + result.stderr


# -- alert conventions ---------------------------------------------------------------


def test_alerts_follow_the_mixin_conventions() -> None:
    alerts = alerts_of(RULES_FILE.read_text(encoding="utf-8"))
    assert list(alerts) == list(ALERT_NAMES)
    headings = set(
        re.findall(r"^## (\w+)$", (ALERTS / "runbook.md").read_text(encoding="utf-8"), re.M)
    )
    dashboard_uid = json.loads(DASHBOARD.read_text(encoding="utf-8"))["uid"]
    for name, rule in alerts.items():
        assert re.fullmatch(r"ML[A-Z][A-Za-z]+", name), name
        labels, annotations = rule["labels"], rule["annotations"]
        assert labels["severity"] in ("critical", "warning", "info"), name
        assert "{{" not in annotations["summary"], f"{name}: summary must be fixed text"
        assert "{{ $labels." in annotations["description"], name
        if name != "MLProfExporterDown":  # its value is always 0
            assert re.search(r"\{\{ \$value|\| query \}\}", annotations["description"]), name
        assert annotations["runbook_url"].endswith(f"/alerts/runbook.md#{name.lower()}"), name
        assert name in headings, f"alerts/runbook.md has no section '## {name}'"
        assert f"/d/{dashboard_uid}/" in annotations["dashboard_url"], name
        if name in DEGRADATION_ALERTS:
            assert labels["mlprof_action"] in ("capture", "snapshot"), name
            # The webhook picks its capture targets by the alert's run_id and host.
            assert "by (run_id, workload, host" in rule["expr"], name
            assert "var-run_id={{ $labels.run_id }}" in annotations["dashboard_url"], name
        else:
            assert "mlprof_action" not in labels, name
    assert headings >= set(ALERT_NAMES)


# Prometheus names the exporter emits (checked against `mlprof serve` /metrics), and up.
EMITTED = {
    "accelerator_duty_cycle",
    "accelerator_memory_usage_bytes",
    "accelerator_memory_limit_bytes",
    "train_step_duration_seconds_bucket",
    "train_steps_total",
    "train_input_wait_share",
    "mlprof_workload_up",
    "mlprof_captures_total",
    "mlprof_profile_pushes_total",
    "up",
}


def test_rules_use_only_metrics_the_exporter_emits() -> None:
    words = {"by", "on", "and", "or", "offset", "le", "sum", "avg", "max", "rate", "increase"}
    words |= {"avg_over_time", "histogram_quantile", "job", "instance", "sink", "trigger"}
    words |= {"predict_linear", "label_replace", "reason", "direction", "buffer_size"}
    words |= {"run_id", "workload", "host", "accelerator", "chip"}
    used: set[str] = set()
    for rule in alerts_of(RULES_FILE.read_text(encoding="utf-8")).values():
        bare = re.sub(r'"[^"]*"|\[[^\]]*\]|\{[^}]*\}|offset \w+', "", rule["expr"])
        used |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", bare)) - words
    unknown = used - EMITTED - GOLDEN_NAMES
    assert not unknown, f"unknown: {sorted(unknown)}"
    assert used >= EMITTED, f"unused: {sorted(EMITTED - used)}"
    # The descriptions' look-ups too (the last XID code).
    described = " ".join(
        a["annotations"]["description"] for a in alerts_of(render_rules()).values()
    )
    assert "accelerator_xid_last" in described and "accelerator_xid_last" in GOLDEN_NAMES


def test_prometheus_rule_resource_carries_the_same_rules() -> None:
    resource = yaml.safe_load(render_prometheus_rule(name="mlprof", namespace="monitoring"))
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["namespace"] == "monitoring"
    assert resource["spec"] == yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))


def test_exporter_job_selector_is_configured_in_one_place() -> None:
    text = render_rules({"selectors": {"exporter_job": 'job="ml-sidecars"'}})
    assert 'up{job="ml-sidecars"} == 0' in alerts_of(text)["MLProfExporterDown"]["expr"]
    assert 'job="mlprof"' not in text


def test_workload_selector_reaches_every_workload_metric() -> None:
    text = render_rules({"selectors": {"workload": 'namespace="ml"'}})
    alerts = alerts_of(text)
    workload_rules = DEGRADATION_ALERTS | ACCELERATOR_ALERTS
    for name in workload_rules | {"MLWorkloadStalled", "MLAcceleratorMemoryNearCapacity"}:
        metrics = re.findall(
            r"\b(accelerator_\w+|tpu_\w+|train_\w+|mlprof_workload_up)(\{[^}]*\})?",
            alerts[name]["expr"],
        )
        assert metrics, name
        for metric, matchers in metrics:
            assert 'namespace="ml"' in matchers, (name, metric)


# -- overrides (how the end-to-end test shortens the rules) -------------------------


def test_e2e_overrides_shorten_only_the_named_rule(tmp_path: Path) -> None:
    promtool = tool("promtool", "prometheus")
    overrides = load_overrides(ALERTS / "overrides" / "e2e.yaml")
    shipped, shortened = alerts_of(render_rules()), alerts_of(render_rules(overrides))
    low = shortened["MLWorkloadDutyCycleLow"]
    assert low["for"] == "5s"
    assert "[5s]" in low["expr"] and ") < 0.15\n" in low["expr"]
    assert "[10m]" not in low["expr"]
    assert low["labels"]["mlprof_action"] == "capture"
    for name in ALERT_NAMES:
        if name != "MLWorkloadDutyCycleLow":
            assert shortened[name] == shipped[name], name
    path = tmp_path / "e2e-rules.yaml"
    path.write_text(render_rules(overrides), encoding="utf-8")
    result = run(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_capture_duration_label_is_rendered_when_set() -> None:
    overrides = {"alerts": {"MLWorkloadStepTimeRegression": {"duration_ms": 5000}}}
    labels = alerts_of(render_rules(overrides))["MLWorkloadStepTimeRegression"]["labels"]
    assert labels == {
        "severity": "warning",
        "mlprof_action": "capture",
        "mlprof_duration_ms": "5000",
    }


def test_action_can_be_switched_off_or_to_snapshot() -> None:
    overrides = {
        "alerts": {
            "MLWorkloadDutyCycleDrop": {"action": None},
            "MLWorkloadStalled": {"action": "snapshot"},
        }
    }
    alerts = alerts_of(render_rules(overrides))
    assert "mlprof_action" not in alerts["MLWorkloadDutyCycleDrop"]["labels"]
    assert alerts["MLWorkloadStalled"]["labels"]["mlprof_action"] == "snapshot"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"alerts": {"MLWorkloadDutyCycleLo": {}}}, "'alerts.MLWorkloadDutyCycleLo': unknown key"),
        ({"alerts": {"MLWorkloadStalled": {"fore": "5m"}}}, "'alerts.MLWorkloadStalled.fore'"),
        ({"alerts": {"MLWorkloadStalled": {"for": "5 minutes"}}}, "alerts.MLWorkloadStalled.for"),
        ({"alerts": {"MLWorkloadDutyCycleLow": {"threshold": "low"}}}, "expected float"),
        ({"alerts": {"MLWorkloadDutyCycleLow": {"threshold": 50}}}, "between 0 and 1"),
        ({"alerts": {"MLWorkloadStepTimeRegression": {"factor": 0.8}}}, "factor above 1"),
        ({"alerts": {"MLWorkloadDutyCycleLow": {"action": "reboot"}}}, "'capture', 'snapshot'"),
        ({"alerts": {"MLWorkloadDutyCycleLow": {"severity": "page"}}}, "severity"),
        ({"selectors": {"run_labels": ["run-id"]}}, "selectors.run_labels"),
        ({"alerts": "none"}, "'alerts': expected a mapping"),
    ],
)
def test_bad_overrides_are_rejected_naming_the_key(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(RuleConfigError) as raised:
        render_rules(overrides)
    assert message in str(raised.value)


def test_bad_override_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("alerts:\n  MLWorkloadStalled:\n    for: soon\n", encoding="utf-8")
    assert render.main(["--overrides", str(bad), "-o", str(tmp_path / "out.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: alerts.MLWorkloadStalled.for: expected a Prometheus duration")
    assert not (tmp_path / "out.yaml").exists()


# -- Alertmanager example --------------------------------------------------------------


def test_amtool_accepts_the_example_config() -> None:
    amtool = tool("amtool", "prometheus-alertmanager")
    result = run(amtool, "check-config", ALERTS / "alertmanager.example.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def route(amtool: str, config: Path, *labels: str) -> str:
    result = run(amtool, "config", "routes", "test", f"--config.file={config}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def test_action_alerts_reach_the_sidecar_and_the_people() -> None:
    amtool = tool("amtool", "prometheus-alertmanager")
    example = ALERTS / "alertmanager.example.yml"
    action = ("alertname=MLWorkloadDutyCycleLow", "mlprof_action=capture", "run_id=r", "host=h")
    assert route(amtool, example, *action) == "mlprof-sidecar,oncall"
    assert route(amtool, example, "alertname=MLWorkloadStalled", "run_id=r") == "oncall"


def test_webhook_receiver_sends_resolved_with_a_bearer_token() -> None:
    config = yaml.safe_load((ALERTS / "alertmanager.example.yml").read_text(encoding="utf-8"))
    (hook,) = next(r for r in config["receivers"] if r["name"] == "mlprof-sidecar")[
        "webhook_configs"
    ]
    assert hook["url"] == "http://127.0.0.1:9464/api/v1/alertmanager"
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    assert hook["http_config"]["authorization"]["credentials_file"]
    (sidecar_route,) = [r for r in config["route"]["routes"] if r["receiver"] == "mlprof-sidecar"]
    assert {"run_id", "host"} <= set(sidecar_route["group_by"])


def test_rendered_alertmanager_config_carries_url_and_token(tmp_path: Path) -> None:
    amtool = tool("amtool", "prometheus-alertmanager")
    config = render_alertmanager_config(
        webhook_url="http://127.0.0.1:18080/api/v1/alertmanager", token="s3cret"
    )
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = run(amtool, "check-config", path)
    assert result.returncode == 0, result.stdout + result.stderr
    (hook,) = next(r for r in config["receivers"] if r["name"] == "mlprof-sidecar")[
        "webhook_configs"
    ]
    assert hook["url"] == "http://127.0.0.1:18080/api/v1/alertmanager"
    assert hook["http_config"]["authorization"] == {"type": "Bearer", "credentials": "s3cret"}
    assert config["route"]["routes"][0]["group_wait"] == "1s"
