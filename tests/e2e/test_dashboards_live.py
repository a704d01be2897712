"""Every panel of every dashboard shows live data (or is listed below with the reason).

In the shared e2e environment (tests/e2e/conftest.py: Prometheus scraping the demo
host's sidecar, a fake-TPU host's and an NVML-double GPU host's, alert → capture done,
the test Pyroscope receiver holding real pushes and the workload's host CPU profiles),
after a device-memory profile and a programmatic TPU capture were pushed too:

- every variable's ``label_values`` query runs on Prometheus' API and returns values;
  they resolve in order (``$workload`` → ``$run_id`` → ``$host``) as Grafana does;
- every PromQL target and annotation, with variables and macros substituted as
  Grafana's Prometheus data source does (tests/grafana_queries.py), runs as a range or
  instant query and returns series;
- every flame-graph panel's ``profileTypeId`` and label selector match a profile the
  receiver got; the session table's URL is answered by the real sidecar with its columns.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from dashboards.generate import DASHBOARDS_DIR, FILES
from exporter.testing.synthetic import write_tpu_capture
from tests.e2e.conftest import SCRAPE_INTERVAL_S, TOKEN, WORKLOAD, Stack, prom_get
from tests.grafana_queries import (
    ALL,
    INFINITY,
    PROMETHEUS,
    PYROSCOPE,
    Query,
    Templating,
    Variable,
    queries,
    variable_queries,
)
from tests.harness import wait_until
from tests.pyroscope_receiver import ReceivedSeries
from tests.unit.test_dashboards import EMITTED, metric_names

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {TOKEN}"}
FLEET, RUN, PROFILES, HEALTH = FILES  # file names, in BUILDERS order

# (dashboard file, panel title, refId) of queries that are legitimately empty in this
# scenario. "lands with <branch>": the series or profile comes from a feature another
# branch builds; the lead removes the entry when merging it (the test fails on an entry
# that has data, so none outlives its reason).
#
# Count and "bad thing" panels read 0 on a healthy system instead of "No data": a stat
# asks `... or vector(0)` (Hung runs, Firing alerts, Spool), and a table or a graph by
# label whose series appear with the first bad thing sets a panel noValue ("0 stalled
# runs", "No accelerator faults", Profile pushes, Webhook outcomes). An empty query of a
# panel with a noValue passes only if every metric it reads has series here, so a
# misspelt or vanished metric still fails. Here that covers: nothing stalled (Stalled
# runs), healthy NVML-double boards (Hosts with accelerator faults: no ECC or XID error,
# GPU 0's power cap is not one of MLAcceleratorThrottled's reasons). MFU has data: the
# demo declares its step function (XLA's FLOPs) and a nominal CPU peak.
EXPECTED_EMPTY: dict[tuple[str, str, str], str] = {}
# Session-table columns whose field the sidecar does not write yet.
EXPECTED_MISSING_COLUMNS: dict[str, str] = {}
# Names of the exporter that this scenario cannot show (the unit test's EMITTED list).
NOT_IN_SCENARIO: set[str] = set()


def dashboard(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS_DIR / name).read_text(encoding="utf-8"))


def push_more_profiles(stack: Stack) -> None:
    """A device-memory profile (asked of the workload's SDK), and a programmatic capture
    of a TPU-shaped trace (what ``run.profile()`` leaves on a TPU host), both pushed."""
    response = httpx.post(f"{stack.sidecar_url}/api/v1/memory-profiles", headers=AUTH, timeout=10)
    assert response.status_code == 202, response.text
    run = json.loads((stack.shared / "run.json").read_text())
    session_id = f"tpu-step-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-e2e"
    session_dir = stack.shared / "captures" / "plugins" / "profile" / session_id
    write_tpu_capture(
        session_dir / f"{run['host']}.xplane.pb", devices=2, steps=2, ops_per_step=40,
        distinct_ops=12,
    )  # fmt: skip
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = {
        "id": session_id, "status": "done", "kind": "trace", "trigger": "programmatic",
        "requester": "sdk", "run_id": stack.run_id, "workload": WORKLOAD, "name": "tpu-step",
        "created": now, "started": now, "finished": now,
        "targets": [{"address": "local", "host": run["host"], "run_id": stack.run_id,
                     "status": "ok", "mode": "programmatic", "started": now, "finished": now,
                     "files": [f"{run['host']}.xplane.pb"]}],
    }  # fmt: skip
    (session_dir / "session.json").write_text(json.dumps(record), encoding="utf-8")

    def names() -> set[str]:
        return {s.labels["__name__"] for s in list(stack.receiver.received)}

    wait_until(
        lambda: {"device", "wall", "memory", "process_cpu"} <= names(),
        timeout=120,
        what="device, host, memory and host CPU (pyroscope-io via the sidecar) profiles",
    )


def label_values(stack: Stack, selector: str, label: str) -> list[str]:
    params: dict[str, Any] = {"start": stack.started - 60, "end": time.time()}
    if selector:
        params["match[]"] = selector
    return sorted(prom_get(stack, f"/api/v1/label/{label}/values", **params))


def resolve_variables(stack: Stack, board: dict[str, Any]) -> tuple[Templating, list[str]]:
    """Each variable's value as Grafana would set it here; the queries that found nothing."""
    values: dict[str, Variable] = {}
    empty = []
    queries_by_name = {q.name: q for q in variable_queries(board)}
    for v in board["templating"]["list"]:
        name = v["name"]
        if v["type"] == "datasource":
            values[name] = Variable([f"{v['query']}-uid"])
        elif v["type"] == "textbox":
            values[name] = Variable([v["query"] or "http://localhost"])
        else:
            q = queries_by_name[name]
            t = Templating(values, range_s=time.time() - stack.started)
            options = label_values(stack, t.promql(q.selector), q.label)
            if not options:
                empty.append(f"{name}: label_values({q.selector}, {q.label})")
            if v.get("multi") or v.get("includeAll"):
                values[name] = Variable([ALL], True, True, v.get("allValue"), options)
            else:  # the one run this scenario has (the baseline is the same run)
                assert stack.run_id in options, (name, options)
                values[name] = Variable([stack.run_id])
    templating = Templating(
        values, range_s=time.time() - stack.started, scrape_interval_s=SCRAPE_INTERVAL_S
    )
    return templating, empty


def series_exist(stack: Stack, metric: str) -> bool:
    """Whether Prometheus holds any series of ``metric`` (recorded ones included)."""
    query = f'group({{__name__="{metric}"}})'
    return bool(prom_get(stack, "/api/v1/query", query=query)["result"])


def prometheus_has_data(stack: Stack, query: Query, expr: str, templating: Templating) -> bool:
    target = query.target
    if target.get("instant"):
        return bool(prom_get(stack, "/api/v1/query", query=expr)["result"])
    # At the panels' resolution: an annotation's coarser step (60s, over [1m] windows in
    # production) would sample this short scenario only once or twice.
    step = f"{templating.interval_s:g}s"
    result = prom_get(
        stack, "/api/v1/query_range", query=expr, start=stack.started, end=time.time(), step=step
    )["result"]
    return bool(result)


_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def profile_types(series: ReceivedSeries) -> set[str]:
    """The profile type ids Pyroscope stores a push under: one per sample type (its
    ``CreateProfileLabels`` splits a pprof of several types, e.g. memory's
    ``inuse_objects`` and ``inuse_space``)."""
    table = series.profile.string_table
    period = series.profile.period_type
    return {
        ":".join([series.labels["__name__"], sample, unit, table[period.type], table[period.unit]])
        for sample, unit in series.sample_types
    }


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    matchers = _MATCHER.findall(selector)
    assert matchers and selector.strip().startswith("{"), selector
    for name, op, raw in matchers:
        value = raw.encode().decode("unicode_escape")
        have = labels.get(name, "")
        ok = {
            "=": have == value,
            "!=": have != value,
            "=~": re.fullmatch(value, have) is not None,
            "!~": re.fullmatch(value, have) is None,
        }[op]
        if not ok:
            return False
    return True


def pyroscope_has_data(stack: Stack, query: Query, templating: Templating) -> bool:
    type_id = query.target["profileTypeId"]
    selector = templating.promql(query.target["labelSelector"])
    return any(
        type_id in profile_types(s) and selector_matches(selector, s.labels)
        for s in list(stack.receiver.received)
    )


def _field(row: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(row, dict):
            return None
        row = row.get(key)
    return row


def infinity_problems(stack: Stack, query: Query, templating: Templating) -> list[str]:
    url = templating.replace(query.target["url"])
    response = httpx.get(f"{stack.sidecar_url}{url}", headers=AUTH, timeout=10)
    if response.status_code != 200:
        return [f"{query.where}: GET {url} answered {response.status_code}"]
    rows = response.json()
    for key in query.target["root_selector"].split("."):
        rows = rows[key]
    if not rows:
        return [f"{query.where}: GET {url} listed no rows"]
    problems = []
    for column in query.target["columns"]:
        selector = column["selector"]
        present = any(_field(row, selector.split(".")) is not None for row in rows)
        if present == (selector in EXPECTED_MISSING_COLUMNS):
            state = "has values" if present else "has no value in any row"
            problems.append(f"{query.where}: column {selector!r} {state}")
    return problems


def test_every_panel_and_variable_shows_live_data(stack: Stack, alert_loop: dict[str, Any]) -> None:
    started = time.monotonic()
    push_more_profiles(stack)
    # Recording rules evaluated, and the alert loop's capture (counted once its pushes are
    # done) and the pushes scraped. A range query's last step can fall up to a step before
    # now, so each must have been there a step ago for the panels to see it.
    ready = (
        "run_host:accelerator_duty_cycle:avg",
        "mlprof_profile_pushes_total",
        'mlprof_captures_total{trigger="alert"}',
    )
    ago = f"offset {2 * SCRAPE_INTERVAL_S}s"  # the panels' step here: the scrape interval
    wait_until(
        lambda: all(prom_get(stack, "/api/v1/query", query=f"{q} {ago}")["result"] for q in ready),
        timeout=60,
        what="recorded series, the alert's capture and profile pushes in Prometheus",
    )
    problems: list[str] = []
    shows_no_value: list[str] = []
    checked = {PROMETHEUS: 0, PYROSCOPE: 0, INFINITY: 0, "variables": 0}
    for name in FILES:
        board = dashboard(name)
        templating, empty = resolve_variables(stack, board)
        checked["variables"] += len(variable_queries(board))
        problems += [f"{name}: variable {e} found no values" for e in empty]
        for query in queries(board):
            key = (name, query.panel, query.ref)
            if query.datasource == INFINITY:
                checked[INFINITY] += 1
                problems += [f"{name}: {p}" for p in infinity_problems(stack, query, templating)]
                continue
            if query.datasource == PROMETHEUS:
                expr = templating.promql(query.target["expr"])
                has_data = prometheus_has_data(stack, query, expr, templating)
            else:
                assert query.datasource == PYROSCOPE, query
                expr = f"{query.target['profileTypeId']}{query.target['labelSelector']}"
                has_data = pyroscope_has_data(stack, query, templating)
            checked[query.datasource] += 1
            if not has_data and query.no_value is not None and key not in EXPECTED_EMPTY:
                # The panel reads its noValue; the query must still read real series.
                # ALERTS exists only while an alert fires: empty is its healthy state.
                names = metric_names(expr) - {"ALERTS"}
                absent = sorted(n for n in names if not series_exist(stack, n))
                if absent:
                    problems.append(f"{name}: {query.where} reads no series of {absent}: {expr}")
                shows_no_value.append(f"{query.where} ({query.no_value!r})")
                continue
            if has_data and key in EXPECTED_EMPTY:
                problems.append(
                    f"{name}: {query.where} has data now: remove it from EXPECTED_EMPTY "
                    f"({EXPECTED_EMPTY[key]})"
                )
            elif not has_data and key not in EXPECTED_EMPTY:
                problems.append(f"{name}: {query.where} has no data: {expr}")
    listed = {k for k in EXPECTED_EMPTY if k[0] in FILES}
    seen = {(n, q.panel, q.ref) for n in FILES for q in queries(dashboard(n))}
    problems += [f"EXPECTED_EMPTY names no query: {k}" for k in sorted(listed - seen)]

    # Every name the unit test says the exporter emits is really in Prometheus.
    wanted = sorted(EMITTED - NOT_IN_SCENARIO)
    found = prom_get(
        stack, "/api/v1/query", query=f'group by (__name__) ({{__name__=~"{"|".join(wanted)}"}})'
    )["result"]
    missing = set(wanted) - {series["metric"]["__name__"] for series in found}
    problems += [f"the exporter emits no {m} here (tests/unit EMITTED)" for m in sorted(missing)]
    # The demo host's events go through the log sink (MLPROF_EVENTS=log), which counted
    # the alert loop's capture.
    for query in ('mlprof_events_dropped_total{sink="log"}',
                  'mlprof_events_total{type="capture_finished"} > 0'):  # fmt: skip
        if not prom_get(stack, "/api/v1/query", query=query)["result"]:
            problems.append(f"no events: {query} is empty")
    print(
        f"\ndashboards live: {checked[PROMETHEUS]} PromQL queries, {checked[PYROSCOPE]} "
        f"flame graphs, {checked[INFINITY]} session tables, {checked['variables']} variables "
        f"checked in {time.monotonic() - started:.1f}s; {len(EXPECTED_EMPTY)} listed empty; "
        f"{len(shows_no_value)} read their noValue: {', '.join(shows_no_value)}"
    )
    assert not problems, "\n".join(problems)
