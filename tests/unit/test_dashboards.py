"""The generated Grafana dashboards: committed output, structure, and PromQL that parses.

PromQL is checked by Debian's promtool: each query becomes a recording rule in a
temporary rule file, with Grafana's variables and macros replaced by plain values.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import generate
from dashboards.generate import DASHBOARDS_DIR, OVERVIEW_UID, PROFILE_TYPES, dashboards, render

# Prometheus names the exporter emits (checked against `mlprof serve` /metrics and the
# golden exposition in tests/fixtures), plus ALERTS from Prometheus itself.
EMITTED = {
    "accelerator_duty_cycle",
    "accelerator_tensorcore_utilization",
    "accelerator_memory_usage_bytes",
    "accelerator_memory_limit_bytes",
    "train_step_duration_seconds_bucket",
    "train_steps_total",
    "train_step",
    "train_tokens_total",
    "train_loss",
    "train_mfu",
    "mlprof_workload_up",
    "mlprof_captures_total",
    "mlprof_profile_pushes_total",
    "mlprof_spool_size_bytes",
    "mlprof_step_log_errors_total",
    "mlprof_alerts_received_total",
    "ALERTS",
    "target_info",
}
PROMQL_FUNCTIONS = {
    "avg",
    "sum",
    "max",
    "by",
    "rate",
    "increase",
    "histogram_quantile",
    "or",
    "le",
    "label_values",
}
MACROS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool not found on PATH: install Debian's prometheus (apt-get install prometheus)"
        )
    return found


def overview() -> dict[str, Any]:
    return json.loads((DASHBOARDS_DIR / f"{OVERVIEW_UID}.json").read_text(encoding="utf-8"))


def targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def prometheus_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for _, t in targets(dashboard) if "expr" in t]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    return exprs


def variable_selectors(dashboard: dict[str, Any]) -> list[str]:
    """The series selectors inside the query variables' ``label_values(selector, label)``."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
            assert match, variable["name"]
            found.append(match.group(1))
    return found


def plain(expr: str) -> str:
    """The query with Grafana's macros and variables replaced by values Prometheus takes."""
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    return re.sub(r"\$\{?(\w+)(:\w+)?\}?", ".*", expr)


def promql_check(exprs: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    rules = [{"record": f"dashboard:query_{i}", "expr": plain(e)} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


# -- generated output ------------------------------------------------------------------


def test_committed_dashboards_are_the_generated_ones() -> None:
    for name, dashboard in dashboards().items():
        path = DASHBOARDS_DIR / name
        assert path.is_file(), f"{path} missing: run `python -m dashboards.generate`"
        assert path.read_text(encoding="utf-8") == render(dashboard), (
            f"{path} is stale: run `python -m dashboards.generate` and commit it"
        )


def test_check_command_reports_stale_and_missing_files(tmp_path: Path) -> None:
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1  # missing
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / f"{OVERVIEW_UID}.json"
    path.write_text(path.read_text().replace('"mlprof overview"', '"edited by hand"'))
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


# -- structure -----------------------------------------------------------------------------


def test_panels_have_unique_ids_and_fit_the_grid_without_overlap() -> None:
    dashboard = overview()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_stable_uid_and_datasource_variables() -> None:
    dashboard = overview()
    assert dashboard["uid"] == OVERVIEW_UID
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["pyroscope"]["query"] == "grafana-pyroscope-datasource"
    assert {"run_id", "host", "workload"} <= set(variables)
    for name in ("run_id", "host", "workload", "job"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_query_uses_a_datasource_variable() -> None:
    dashboard = overview()
    seen = set()
    for panel, target in targets(dashboard):
        source = target["datasource"]
        assert source == panel["datasource"], panel["title"]
        if source["type"] == "prometheus":
            assert source["uid"] == "${datasource}", panel["title"]
            assert "expr" in target, panel["title"]
        else:
            assert source == {"type": "grafana-pyroscope-datasource", "uid": "${pyroscope}"}
        seen.add(source["type"])
    assert seen == {"prometheus", "grafana-pyroscope-datasource"}
    for annotation in dashboard["annotations"]["list"]:
        assert annotation["datasource"]["uid"] == "${datasource}"


def test_run_queries_follow_the_run_and_host_variables() -> None:
    for panel, target in targets(overview()):
        text = target.get("expr") or target.get("labelSelector", "")
        if re.search(r"\b(accelerator|train)_", text) or panel["type"] == "flamegraph":
            assert 'run_id=~"$run_id"' in text and 'host=~"$host"' in text, panel["title"]


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    exprs = prometheus_exprs(overview()) + variable_selectors(overview())
    assert len(exprs) >= 20
    result = promql_check(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_promql_check_rejects_a_broken_query(tmp_path: Path) -> None:
    result = promql_check(
        ['sum by (host (rate(train_steps_total{run_id=~"$run_id"}[5m]))'], tmp_path
    )
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def test_queries_use_only_metrics_the_exporter_emits() -> None:
    used: set[str] = set()
    for expr in prometheus_exprs(overview()):
        bare = re.sub(r'"[^"]*"|\[[^\]]*\]|\{[^}]*\}', "", expr)  # drop strings, ranges, matchers
        used |= {
            w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", bare) if w not in PROMQL_FUNCTIONS
        }
    used -= {"host", "trigger", "status", "sink", "instance", "outcome"}  # by-clause labels
    assert used <= EMITTED, f"unknown metrics: {sorted(used - EMITTED)}"
    # What the overview promises to show.
    for metric in EMITTED - {"train_step", "ALERTS", "target_info"}:
        assert metric in used, f"no panel shows {metric}"


def test_step_time_panel_shows_p50_and_p90_from_the_histogram() -> None:
    (panel,) = [p for p in overview()["panels"] if p["title"] == "Step time"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert [e.split(",")[0] for e in exprs] == ["histogram_quantile(0.5", "histogram_quantile(0.9"]
    assert all("train_step_duration_seconds_bucket" in e and "le)" in e for e in exprs)


def test_flame_graph_panels_query_the_pushed_profile_types() -> None:
    flames = {p["title"]: p for p in overview()["panels"] if p["type"] == "flamegraph"}
    types = {p["targets"][0]["profileTypeId"] for p in flames.values()}
    assert types == set(PROFILE_TYPES.values())
    assert PROFILE_TYPES["device_time"].startswith("device:device_time:nanoseconds:")
    assert PROFILE_TYPES["device_memory"].startswith("memory:inuse_space:bytes:")
    for panel in flames.values():
        selector = panel["targets"][0]["labelSelector"]
        assert 'service_name=~"$workload"' in selector and 'run_id=~"$run_id"' in selector


def test_dashboard_links_to_a_capture_of_the_selected_run() -> None:
    dashboard = overview()
    (link,) = [lk for lk in dashboard["links"] if "capture" in lk["title"].lower()]
    assert link["url"].startswith("${sidecar_url}" + generate.CAPTURE_PATH + "?")
    assert "run_id=${run_id" in link["url"] and "host=${host" in link["url"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["sidecar_url"]["type"] == "textbox"
