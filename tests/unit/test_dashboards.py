"""The Grafana dashboards built with the Foundation SDK: committed output, structure, links,
and PromQL that parses and names only what the exporter emits.

PromQL is checked by Debian's promtool: each query, with Grafana's variables substituted
as Grafana does (tests/grafana_queries.py), becomes a recording rule in a temporary file.
The end-to-end test (tests/e2e/test_dashboards_live.py) runs the same queries on live data.
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

from alerts import recording
from alerts.render import load_thresholds
from dashboards import common, generate, run
from dashboards.generate import CONFIGMAP, DASHBOARDS_DIR, FILES, render
from dashboards.profiles import PROFILES
from exporter.metrics.catalog import METRICS, prometheus_name
from exporter.metrics.histograms import histogram_name
from exporter.metrics.tpu import RUNTIME_METRICS
from tests.grafana_queries import (
    ALL,
    INFINITY,
    PROMETHEUS,
    PYROSCOPE,
    Templating,
    Variable,
    queries,
    variable_queries,
)
from tests.harness import ROOT

# Every name the accelerator sources emit, as their golden expositions show it
# (tests/fixtures: the fake TPU runtime's and the NVML double's, checked against the
# catalogue by tests/unit/test_metrics_doc.py).
GOLDEN_NAMES = {
    line.split("{")[0].split(" ")[0]
    for golden in (ROOT / "tests" / "fixtures").glob("*.prom")
    for line in golden.read_text(encoding="utf-8").splitlines()
    if line and not line.startswith("#")
}
# Prometheus names the exporter emits (checked live against `mlprof serve` in
# tests/e2e/test_dashboards_live.py), plus Prometheus' own series.
EMITTED = GOLDEN_NAMES | {
    "train_step_duration_seconds_bucket",
    "train_steps_total",
    "train_tokens_total",
    "train_loss",
    "train_mfu",
    "mlprof_workload_up",
    "mlprof_run_ended",
    "mlprof_captures_total",
    "mlprof_profile_pushes_total",
    "mlprof_spool_size_bytes",
    "mlprof_step_log_errors_total",
    "mlprof_source_errors_total",
    "mlprof_alerts_received_total",
    "mlprof_events_total",
    "mlprof_events_dropped_total",
    "target_info",
}
# Emitted names no query names (the Exporter health dashboard still counts every
# accelerator_* series per source), each with the reason.
NOT_ON_A_PANEL = {
    "accelerator_info": "labels only (model, UUID, driver), for joins",
    "accelerator_codec_utilization": "video encoders and decoders: not what training uses",
    "accelerator_engine_utilization": "the SM and tensor-core panel says more",
    "accelerator_memory_copy_utilization": "NVML's coarse memory activity; bandwidth is shown",
    "accelerator_memory_reserved_bytes": "the driver's reserve: part of the limit shown",
    "accelerator_memory_ecc_lifetime_errors_total": "the board's history, not the run's",
    "accelerator_memory_remapped_rows_total": "repairs done; pending/failed ones are shown",
    "accelerator_pcie_replays_total": "link retries: the throughput panel shows the effect",
    "accelerator_hlo_execution_count_total": "the execution-time percentiles are shown",
    "accelerator_hlo_execution_time_seconds_total": "the execution-time percentiles are shown",
    "accelerator_host_transfer_count_total": "the transfer latency percentiles are shown",
    "accelerator_host_transfer_time_seconds_total": "the transfer latency percentiles are shown",
    "tpu_host_compute_count_total": "the host-compute latency percentiles are shown",
    "tpu_host_compute_time_seconds_total": "the host-compute latency percentiles are shown",
    "mlprof_source_distributions_skipped_total": "a runtime's malformed distributions: "
    "logged once per metric; the percentile panels show the gap",
    "mlprof_source_buckets_merged_total": "resolution lost to the bucket cap, for alerts",
    # libtpu's histograms: panels show the per-host percentile gauges; the collective
    # buckets reach the Run dashboard through recording.COLLECTIVE_QUANTILE (slice-wide).
    **{
        histogram_name(m.metric) + suffix: "per-host percentiles are shown; PromQL over the "
        "buckets (histogram_quantile) aggregates hosts"
        for m in RUNTIME_METRICS
        if m.distribution
        for suffix in ("_bucket", "_sum", "_count")
    },
}
PROMETHEUS_OWN = {"ALERTS", "up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Names other branches emit (contracts in the brief); the e2e test lists their panels as
# "lands with <branch>".
CONTRACTS = {
    "mlprof_reports_total",  # analysis
    "mlprof_report_findings",  # analysis
    "train_step_wait_seconds_bucket",  # hardening
    "train_input_wait_share",  # hardening
}
RECORDED = {
    recording.STEP_TIME_QUANTILE,
    recording.STEPS_RATE,
    recording.TOKENS_RATE,
    recording.DUTY_CYCLE,
    recording.MEMORY_USED,
    recording.COLLECTIVE_QUANTILE,
}
# Recorded per run over every host (a slice): Run dashboard panels read them by run only.
SLICE_RECORDED = (recording.COLLECTIVE_QUANTILE,)
PROMQL_WORDS = {
    "avg", "sum", "max", "min", "count", "by", "on", "and", "or", "unless", "rate", "increase",
    "histogram_quantile", "avg_over_time", "sort", "bottomk", "le", "__name__", "group",
    "vector",
}  # fmt: skip
# Labels in by (...) and on (...) clauses.
BY_LABELS = {
    "host", "trigger", "status", "sink", "instance", "outcome", "reason", "source", "priority",
    "type", "workload", "run_id", "quantile", "chip", "pid", "direction", "buffer_size",
}  # fmt: skip


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS_DIR / name).read_text(encoding="utf-8"))


ALL_DASHBOARDS = {name: load(name) for name in FILES if (DASHBOARDS_DIR / name).is_file()}


def templating(dashboard: dict[str, Any]) -> Templating:
    """Every variable at its default: All for multi-value ones, one value for the others."""
    variables = {}
    for v in dashboard["templating"]["list"]:
        if v.get("multi") or v.get("includeAll"):
            variables[v["name"]] = Variable([ALL], True, True, v.get("allValue"), ["x", "y"])
        else:
            variables[v["name"]] = Variable(["value"])
    return Templating(variables, scrape_interval_s=15)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus (apt-get install prometheus)")
    return found


def promql_check(exprs: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


def prometheus_exprs(dashboard: dict[str, Any]) -> list[str]:
    t = templating(dashboard)
    exprs = [t.promql(q.target["expr"]) for q in queries(dashboard) if q.datasource == PROMETHEUS]
    exprs += [t.promql(v.selector) for v in variable_queries(dashboard) if v.selector]
    return exprs


def metric_names(expr: str, *, patterns: bool = True) -> set[str]:
    """The metric names ``expr`` reads; with ``patterns``, what a ``__name__=~`` matches."""
    # Drop strings, ranges, matchers and offsets.
    bare = re.sub(r'"[^"]*"|\[[^\]]*\]|\{[^}]*\}|\boffset\s+\w+', "", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    names = words - PROMQL_WORDS - BY_LABELS
    for pattern in re.findall(r'__name__=~"([^"]+)"', expr) if patterns else []:
        matched = {n for n in EMITTED | CONTRACTS if re.fullmatch(pattern, n)}
        names |= matched or {pattern}
    return names


# -- generated output ------------------------------------------------------------------


def test_committed_files_are_the_generated_ones() -> None:
    assert set(ALL_DASHBOARDS) == set(FILES), "run `python -m dashboards.generate`"
    assert generate.main(["--check"]) == 0, "stale: run `python -m dashboards.generate`"
    for name in FILES:
        assert (DASHBOARDS_DIR / name).read_text(encoding="utf-8") == render(generate.build(name))


def test_check_command_reports_stale_and_missing_files(tmp_path: Path) -> None:
    args = ["--out", str(tmp_path), "--configmap", str(tmp_path / "cm.yaml")]
    assert generate.main(["--check", *args]) == 1  # missing
    assert generate.main(args) == 0
    assert generate.main(["--check", *args]) == 0
    path = tmp_path / "mlprof-run.json"
    path.write_text(path.read_text().replace('"mlprof run"', '"edited by hand"'))
    assert generate.main(["--check", *args]) == 1
    assert generate.main(args) == 0
    (tmp_path / "cm.yaml").write_text("stale\n")
    assert generate.main(["--check", *args]) == 1


def test_configmap_ships_every_dashboard_for_grafanas_sidecar() -> None:
    configmap = yaml.safe_load(CONFIGMAP.read_text(encoding="utf-8"))
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert {n: json.loads(t) for n, t in configmap["data"].items()} == ALL_DASHBOARDS


def test_the_sdk_reads_the_committed_json_back() -> None:
    """The JSON is the SDK's own model: typed models round-trip it unchanged."""
    from grafana_foundation_sdk.models.dashboard import Dashboard

    from dashboards.plugins import register_plugins

    register_plugins()
    for name, dashboard in ALL_DASHBOARDS.items():
        again = json.loads(render(Dashboard.from_json(dashboard)))
        assert again == dashboard, name


# -- structure -----------------------------------------------------------------------------


def test_four_dashboards_with_stable_uids_and_variables() -> None:
    assert [d["uid"] for d in ALL_DASHBOARDS.values()] == list(FILES.values())
    assert len(set(FILES.values())) == 4
    for name, dashboard in ALL_DASHBOARDS.items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == PROMETHEUS
        assert variables["pyroscope"]["query"] == PYROSCOPE
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"] == {"type": PROMETHEUS, "uid": "${datasource}"}
        assert common.TAG in dashboard["tags"]
    for name in ("mlprof-fleet.json", "mlprof-run.json", "mlprof-profiles.json"):
        found = {v.name: v for v in variable_queries(ALL_DASHBOARDS[name])}
        assert {"workload", "run_id", "host"} <= set(found), name
        assert [found[n].label for n in ("workload", "run_id", "host")] == [
            "workload", "run_id", "host"
        ]  # fmt: skip


def test_alert_links_open_the_run_dashboard() -> None:
    links = load_thresholds()["links"]
    assert links["dashboard_uid"] == common.RUN_UID
    run_board = ALL_DASHBOARDS["mlprof-run.json"]
    assert run_board["uid"] == common.RUN_UID
    names = {v["name"] for v in run_board["templating"]["list"]}
    assert {"run_id", "host"} <= names  # the alert's dashboard_url sets var-run_id, var-host


def test_panels_have_unique_ids_and_fit_the_grid_without_overlap() -> None:
    for name, dashboard in ALL_DASHBOARDS.items():
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)) and 0 not in ids, name
        taken: set[tuple[int, int]] = set()
        for panel in dashboard["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, (name, panel["title"])
            cells = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not cells & taken, f"{name}: panel {panel['title']!r} overlaps another"
            taken |= cells


def test_every_query_uses_a_datasource_variable() -> None:
    expected = {
        PROMETHEUS: "${datasource}",
        PYROSCOPE: "${pyroscope}",
        INFINITY: "${sidecar}",
    }
    seen = set()
    for name, dashboard in ALL_DASHBOARDS.items():
        for query in queries(dashboard):
            source = query.target["datasource"]
            assert source["uid"] == expected[source["type"]], (name, query.where)
            seen.add(source["type"])
    assert seen == set(expected)


def test_run_queries_follow_the_run_and_host_variables() -> None:
    for name in ("mlprof-run.json", "mlprof-profiles.json"):
        for query in queries(ALL_DASHBOARDS[name]):
            text = query.target.get("expr") or query.target.get("labelSelector", "")
            if text.startswith(SLICE_RECORDED):  # all hosts of the run, by design
                assert 'run_id=~"$run_id"' in text and "host" not in text, query.where
            elif re.search(r"\b(accelerator|train)_", text):
                assert 'run_id=~"$run_id"' in text and 'host=~"$host"' in text, query.where
            if query.datasource == PYROSCOPE:
                assert re.search(r'run_id="\$(baseline_)?run_id"', text), query.where


# -- PromQL --------------------------------------------------------------------------------


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    exprs = [e for d in ALL_DASHBOARDS.values() for e in prometheus_exprs(d)]
    assert len(exprs) >= 60
    result = promql_check(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_promql_check_rejects_a_broken_query(tmp_path: Path) -> None:
    result = promql_check(['sum by (host (rate(train_steps_total{run_id=~"x"}[5m]))'], tmp_path)
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def test_queries_use_only_metrics_the_exporter_emits() -> None:
    used: set[str] = set()
    named: set[str] = set()  # named in a query, not only matched by a __name__ pattern
    for dashboard in ALL_DASHBOARDS.values():
        for expr in prometheus_exprs(dashboard):
            used |= metric_names(expr)
            named |= metric_names(expr, patterns=False)
    known = EMITTED | PROMETHEUS_OWN | CONTRACTS | RECORDED
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    assert {n for n in GOLDEN_NAMES if n.startswith(("accelerator_", "tpu_"))} >= {
        prometheus_name(spec) for spec in METRICS.values()
    }, "a catalogue metric is missing from the goldens"
    # Every emitted name has a panel, or a reason why not.
    assert set(NOT_ON_A_PANEL) <= EMITTED
    shown = EMITTED - set(NOT_ON_A_PANEL)
    assert shown <= named, f"no panel shows {sorted(shown - named)}: add one or say why not"
    shown_now = named & set(NOT_ON_A_PANEL)
    assert not shown_now, f"shown now: drop {sorted(shown_now)} from NOT_ON_A_PANEL"
    assert used >= CONTRACTS | RECORDED


# A catalogue unit -> the Grafana unit of a panel that plots that gauge as it is.
GRAFANA_UNIT = {"s": "s", "By": "bytes", "W": "watt", "Cel": "celsius", "Hz": "hertz",
                "By/s": "Bps"}  # fmt: skip


def test_accelerator_panels_have_their_metrics_units() -> None:
    """A temperature in degrees, a clock in hertz: each gauge's panel has its unit."""
    by_name = {prometheus_name(spec): spec for spec in METRICS.values()}
    checked = 0
    for name, dashboard in ALL_DASHBOARDS.items():
        for panel in dashboard["panels"]:
            if panel["type"] != "timeseries":
                continue
            for target in panel["targets"]:
                specs = [by_name[n] for n in metric_names(target["expr"]) if n in by_name]
                if len(specs) != 1 or specs[0].kind != "gauge" or "/" in target["expr"]:
                    continue  # a ratio or a rate: its own unit
                expected = GRAFANA_UNIT.get(specs[0].unit)
                if specs[0].unit == "1" and "utilization" in specs[0].name:
                    expected = "percentunit"
                if expected is not None:
                    unit = panel["fieldConfig"]["defaults"]["unit"]
                    assert unit == expected, (name, panel["title"], target["refId"])
                    checked += 1
    assert checked >= 15


def test_fleet_reads_recorded_series_not_every_bucket() -> None:
    fleet = [q.target["expr"] for q in queries(ALL_DASHBOARDS["mlprof-fleet.json"])]
    assert not any("train_step_duration_seconds_bucket" in e for e in fleet)
    assert not any(re.search(r"\baccelerator_duty_cycle\{", e) for e in fleet)
    for name in RECORDED - set(SLICE_RECORDED):
        assert any(name in e for e in fleet), f"the Fleet dashboard does not read {name}"
    rendered = yaml.safe_load(recording.render_recording_rules())
    assert {r["record"] for g in rendered["groups"] for r in g["rules"]} == RECORDED


def test_step_time_panel_shows_p50_and_p90_from_the_histogram() -> None:
    [panel] = [p for p in ALL_DASHBOARDS["mlprof-run.json"]["panels"] if p["title"] == "Step time"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert [e.split(",")[0] for e in exprs] == ["histogram_quantile(0.5", "histogram_quantile(0.9"]
    assert all("train_step_duration_seconds_bucket" in e and "le)" in e for e in exprs)


# -- profiles and links ---------------------------------------------------------------------


def test_flame_graph_panels_query_the_pushed_profile_types_for_run_and_baseline() -> None:
    profiles = ALL_DASHBOARDS["mlprof-profiles.json"]
    flames = [p for p in profiles["panels"] if p["type"] == "flamegraph"]
    assert len(flames) == 2 * len(PROFILES)
    by_type: dict[str, list[str]] = {}
    for panel in flames:
        [target] = panel["targets"]
        assert target["queryType"] == "profile"
        by_type.setdefault(target["profileTypeId"], []).append(target["labelSelector"])
    assert set(by_type) == {
        "device:device_time:nanoseconds:device_time:nanoseconds",
        "wall:wall:nanoseconds:wall:nanoseconds",
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "memory:inuse_space:bytes:space:bytes",
    }
    for selectors in by_type.values():
        assert sorted('run_id="$baseline_run_id"' in s for s in selectors) == [False, True]
        assert all('service_name=~"$workload"' in s for s in selectors)


def test_baseline_panels_link_to_pyroscope_diff_and_the_differential_report() -> None:
    profiles = ALL_DASHBOARDS["mlprof-profiles.json"]
    t = Templating(
        {
            "run_id": Variable(["run b"]),
            "baseline_run_id": Variable(["run/a"]),
            "sidecar_url": Variable(["http://sidecar:9464"]),
            "pyroscope_url": Variable(["http://pyroscope:4040"]),
        }
    )
    baselines = [p for p in profiles["panels"] if "baseline" in p.get("title", "")]
    assert len(baselines) == len(PROFILES)
    for panel in baselines:
        urls = {link["title"]: link["url"] for link in panel["links"]}
        diff = urls["Pyroscope diff view: baseline vs run"].replace("${__from:date:seconds}", "1")
        diff = t.replace(diff.replace("${__to:date:seconds}", "2"))
        assert diff.startswith("http://pyroscope:4040/comparison-diff?leftQuery=")
        assert "run_id%3D%22run%2Fa%22" in diff and "run_id%3D%22run%20b%22" in diff
        report = urls.get("Differential report (mlprof compare)")
        if report is not None:
            assert t.replace(report).startswith(
                "http://sidecar:9464/api/v1/compare?base=run:run%2Fa&head=run:run%20b&kind="
            )


def test_run_dashboard_links_capture_page_and_reports() -> None:
    board = ALL_DASHBOARDS["mlprof-run.json"]
    [link] = [lk for lk in board["links"] if lk["title"] == "Capture a profile"]
    t = Templating(
        {
            "sidecar_url": Variable(["http://sc:9464"]),
            "run_id": Variable(["r 1"]),
            "host": Variable(["h0", "h1"], multi=True),
        }
    )
    assert t.replace(link["url"]) == "http://sc:9464/ui/capture?run_id=r%201&host=h0,h1"
    [sessions] = [p for p in board["panels"] if p["title"] == "Capture sessions"]
    [target] = sessions["targets"]
    assert target["url"].startswith("/api/v1/sessions?run_id=${run_id:percentencode}")
    assert target["root_selector"] == "sessions"
    links = json.dumps(sessions["fieldConfig"]["overrides"])
    assert "/api/v1/sessions/${__value.raw}/report" in links


def test_fleet_tables_link_into_the_run_dashboard_with_the_row() -> None:
    fleet = ALL_DASHBOARDS["mlprof-fleet.json"]
    tables = [p for p in fleet["panels"] if p["type"] == "table"]
    assert len(tables) >= 3
    for panel in tables:
        links = json.dumps(panel["fieldConfig"]["overrides"])
        assert f"/d/{common.RUN_UID}/" in links, panel["title"]
        assert "var-run_id=${__data.fields.run_id}" in links
        assert "${__url_time_range}" in links


def test_a_run_row_is_one_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """How the lead adds the accelerator-health row: one function appended to ROWS."""

    def accelerator_health() -> common.RowSpec:
        return "Accelerator health", [
            common.default_timeseries("Temperature", "", "celsius").with_target(
                common.prom(f"accelerator_temperature_celsius{{{common.RUN}}}")
            )
        ]

    monkeypatch.setattr(run, "ROWS", (*run.ROWS, accelerator_health))
    board = json.loads(render(run.run_dashboard().build()))
    titles = [p["title"] for p in board["panels"]]
    assert titles[-2:] == ["Accelerator health", "Temperature"]
    assert len(titles) == len(ALL_DASHBOARDS["mlprof-run.json"]["panels"]) + 2


# -- Grafana's variable substitution (the e2e test relies on it) ----------------------------


def test_templating_formats_variables_as_grafanas_prometheus_data_source() -> None:
    t = Templating(
        {
            "host": Variable(["a.b", "c"], multi=True),
            "one": Variable(["x.y"], multi=True),
            "run_id": Variable(["r.1"]),
            "workload": Variable([ALL], True, True, ".*", ["w1", "w2"]),
            "job": Variable([ALL], True, True, None, ["j1", "j2"]),
        },
        range_s=3600,
        scrape_interval_s=15,
        max_data_points=1000,
    )
    assert t.promql('{host=~"$host"}') == '{host=~"(a\\\\.b|c)"}'
    assert t.promql('{host=~"${one}"}') == '{host=~"x\\\\.y"}'
    assert t.promql('{run_id="$run_id"}') == '{run_id="r.1"}'  # single value: as is
    assert t.promql('{workload=~"$workload"}') == '{workload=~".*"}'  # custom all value
    assert t.promql('{job=~"$job"}') == '{job=~"(j1|j2)"}'  # All without one: every value
    # 3600 s over 1000 points rounds to 5 s, below the scrape interval: 15 s; rate 60 s.
    assert t.promql("rate(x[$__rate_interval]) $__interval $__range") == "rate(x[60s]) 15s 3600s"
    assert t.replace("${host:csv} ${run_id:percentencode} [[run_id]]") == "a.b,c r.1 r.1"
    assert t.replace("${host:queryparam}") == "var-host=a.b&var-host=c"


# Count and "bad thing" panels: on a healthy system they read 0, never "No data".
READS_ZERO = {
    ("mlprof-fleet.json", "Hung runs"),
    ("mlprof-fleet.json", "Firing alerts"),
    ("mlprof-fleet.json", "Stalled runs"),
    ("mlprof-fleet.json", "Hosts with accelerator faults"),
    ("mlprof-exporter-health.json", "Spool"),
    ("mlprof-exporter-health.json", "Profile pushes"),
    ("mlprof-exporter-health.json", "Webhook outcomes"),
}


def test_count_and_bad_thing_panels_read_zero_when_nothing_is_wrong() -> None:
    seen = set()
    for name, board in ALL_DASHBOARDS.items():
        for query in queries(board):
            if (name, query.panel) not in READS_ZERO:
                continue
            seen.add((name, query.panel))
            expr = query.target["expr"]
            # A stat asks for 0 itself; a table or a graph by label says it in noValue.
            zero_query = expr.rstrip().endswith("or vector(0)")
            assert zero_query or (query.no_value or "").startswith(("0", "No ")), query.where
    assert seen == READS_ZERO
