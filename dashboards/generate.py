"""Generate the Grafana dashboards from code; the JSON files beside this module are its output.

Command line (from the repository root)::

    python -m dashboards.generate            # rewrite dashboards/*.json
    python -m dashboards.generate --check    # exit 1 when a committed file is stale

Every Prometheus query goes through the ``$datasource`` variable and every profile
query through ``$pyroscope``; the dashboard ``uid`` is stable, so alert annotations
(``dashboard_url`` in alerts/thresholds.yaml) and links keep working across re-imports.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CAPTURE_PATH",
    "DASHBOARDS_DIR",
    "OVERVIEW_UID",
    "PROFILE_TYPES",
    "dashboards",
    "main",
    "overview",
    "render",
]

DASHBOARDS_DIR = Path(__file__).resolve().parent
OVERVIEW_UID = "mlprof-overview"
PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
PYROSCOPE = {"type": "grafana-pyroscope-datasource", "uid": "${pyroscope}"}
# Pyroscope profile type ids, ``<__name__>:<sample type>:<unit>:<period type>:<unit>``,
# of the profiles the sidecar pushes (exporter/profiles: xplane.py, memory.py).
PROFILE_TYPES = {
    "device_time": "device:device_time:nanoseconds:device_time:nanoseconds",
    "host_time": "wall:wall:nanoseconds:wall:nanoseconds",
    "device_memory": "memory:inuse_space:bytes:space:bytes",
}
# The sidecar's page that starts an on-demand capture (a link cannot POST, and a GET
# must not start one by itself: the page shows a form that POSTs to the capture API).
CAPTURE_PATH = "/ui/capture"
# Grafana's schema version these dashboards are written for (Grafana 10.x/11.x).
SCHEMA_VERSION = 39

# Label matchers every run-level query carries.
RUN = 'workload=~"$workload", run_id=~"$run_id", host=~"$host"'
SIDECAR = 'job=~"$job"'
RATE = "$__rate_interval"


@dataclass
class _Layout:
    """Assigns panel ids and grid positions row by row (Grafana's grid is 24 wide)."""

    panels: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 1
    x: int = 0
    y: int = 0
    row_height: int = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "id": self._id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), **panel, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _target(expr: str, legend: str, ref: str, *, instant: bool = False) -> dict[str, Any]:
    target: dict[str, Any] = {
        "refId": ref,
        "datasource": PROMETHEUS,
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
    }
    return target


def _timeseries(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    links: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if links:
        defaults["links"] = list(links)
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": PROMETHEUS,
        "targets": [
            _target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)
        ],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def _stat(title: str, description: str, expr: str, unit: str, decimals: int = 2) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": PROMETHEUS,
        "targets": [_target(expr, "", "A", instant=True)],
        "fieldConfig": {"defaults": {"unit": unit, "decimals": decimals}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
        },
    }


def _flamegraph(title: str, description: str, profile: str) -> dict[str, Any]:
    return {
        "type": "flamegraph",
        "title": title,
        "description": description,
        "datasource": PYROSCOPE,
        "targets": [
            {
                "refId": "A",
                "datasource": PYROSCOPE,
                "queryType": "profile",
                "profileTypeId": PROFILE_TYPES[profile],
                # Pyroscope's service_name is the workload (DESIGN: profiles pushed).
                "labelSelector": ('{service_name=~"$workload", run_id=~"$run_id", host=~"$host"}'),
                "groupBy": [],
            }
        ],
        "options": {},
    }


def _query_variable(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROMETHEUS,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,  # on time-range change: runs come and go
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        **({"allValue": ".*"} if multi else {}),
        "current": {},
    }


def overview() -> dict[str, Any]:
    """The overview dashboard: accelerators, training, profiles and the sidecar itself."""
    capture_url = (
        "${sidecar_url}" + CAPTURE_PATH + "?run_id=${run_id:percentencode}&host=${host:csv}"
    )
    capture_link = {"title": "Capture a profile of this run", "url": capture_url}
    grid = _Layout()

    grid.row("Run")
    duty = (
        f'avg(accelerator_duty_cycle{{{RUN}, source!="sdk"}}) '
        f'or avg(accelerator_duty_cycle{{{RUN}, source="sdk"}})'
    )
    p50 = (
        f"histogram_quantile(0.5, sum by (le) "
        f"(rate(train_step_duration_seconds_bucket{{{RUN}}}[{RATE}])))"
    )
    grid.add(
        _stat("Duty cycle", "Mean over chips (hardware, else SDK estimate).", duty, "percentunit"),
        4,
        4,
    )
    grid.add(_stat("Steps/s", "", f"sum(rate(train_steps_total{{{RUN}}}[{RATE}]))", "none"), 4, 4)
    grid.add(
        _stat("Tokens/s", "", f"sum(rate(train_tokens_total{{{RUN}}}[{RATE}]))", "short"), 4, 4
    )
    grid.add(_stat("Step time p50", "", p50, "s", decimals=3), 4, 4)
    grid.add(
        _stat("MFU", "Model FLOPs utilisation.", f"avg(train_mfu{{{RUN}}})", "percentunit"), 4, 4
    )
    grid.add(
        _stat(
            "Hosts up",
            "Hosts whose step-log heartbeat is fresh.",
            f"sum(mlprof_workload_up{{{RUN}}})",
            "none",
            decimals=0,
        ),
        4,
        4,
    )

    grid.row("Accelerators")
    grid.add(
        _timeseries(
            "Duty cycle",
            "Fraction of time each chip executed work; the SDK estimate comes from the step "
            "log where no hardware source is available.",
            [
                (
                    f'accelerator_duty_cycle{{{RUN}, source!="sdk"}}',
                    "{{host}} chip {{chip}} ({{source}})",
                ),
                (f'accelerator_duty_cycle{{{RUN}, source="sdk"}}', "{{host}} (SDK estimate)"),
            ],
            "percentunit",
            minimum=0,
            maximum=1,
            links=[capture_link],
        ),
        12,
        8,
    )
    grid.add(
        _timeseries(
            "Tensor-core utilisation",
            "Tensor-core (TPU) or SM (GPU) utilisation per chip.",
            [
                (
                    f"accelerator_tensorcore_utilization{{{RUN}}}",
                    "{{host}} chip {{chip}} ({{source}})",
                )
            ],
            "percentunit",
            minimum=0,
            maximum=1,
        ),
        12,
        8,
    )
    grid.add(
        _timeseries(
            "Device memory in use vs limit",
            "HBM / device memory per chip: in use (solid) and capacity.",
            [
                (
                    f"accelerator_memory_usage_bytes{{{RUN}}}",
                    "{{host}} chip {{chip}} in use ({{source}})",
                ),
                (
                    f"accelerator_memory_limit_bytes{{{RUN}}}",
                    "{{host}} chip {{chip}} limit ({{source}})",
                ),
            ],
            "bytes",
            minimum=0,
        ),
        12,
        8,
    )
    grid.add(
        _timeseries(
            "Device memory used",
            "In use as a fraction of the limit; MLAcceleratorMemoryNearCapacity fires above "
            "its threshold.",
            [
                (
                    f"accelerator_memory_usage_bytes{{{RUN}}} "
                    f"/ (accelerator_memory_limit_bytes{{{RUN}}} > 0)",
                    "{{host}} chip {{chip}} ({{source}})",
                )
            ],
            "percentunit",
            minimum=0,
            maximum=1,
        ),
        12,
        8,
    )

    grid.row("Training")

    def step_q(q: float) -> str:
        buckets = f"train_step_duration_seconds_bucket{{{RUN}}}"
        return f"histogram_quantile({q}, sum by (host, le) (rate({buckets}[{RATE}])))"

    grid.add(
        _timeseries(
            "Step time",
            "p50 and p90 of the wall time of one step, from the step-duration histogram.",
            [
                (step_q(0.5), "{{host}} p50"),
                (step_q(0.9), "{{host}} p90"),
            ],
            "s",
            minimum=0,
        ),
        12,
        8,
    )
    grid.add(
        _timeseries(
            "Steps/s",
            "Completed steps per second.",
            [(f"sum by (host) (rate(train_steps_total{{{RUN}}}[{RATE}]))", "{{host}}")],
            "none",
            minimum=0,
        ),
        6,
        8,
    )
    grid.add(
        _timeseries(
            "Tokens/s",
            "Tokens (or samples) processed per second.",
            [(f"sum by (host) (rate(train_tokens_total{{{RUN}}}[{RATE}]))", "{{host}}")],
            "short",
            minimum=0,
        ),
        6,
        8,
    )
    grid.add(
        _timeseries(
            "Loss", "As recorded by the workload.", [(f"train_loss{{{RUN}}}", "{{host}}")], "none"
        ),
        12,
        8,
    )
    grid.add(
        _timeseries(
            "MFU",
            "Model FLOPs utilisation, as recorded by the workload.",
            [(f"train_mfu{{{RUN}}}", "{{host}}")],
            "percentunit",
            minimum=0,
        ),
        12,
        8,
    )

    grid.row("Profiles")
    grid.add(
        _flamegraph(
            "Device time",
            "XLA ops on the accelerators (self and total), from XProf captures of this run.",
            "device_time",
        ),
        24,
        12,
    )
    grid.add(
        _flamegraph("Host time", "Host threads and Python, from the same captures.", "host_time"),
        12,
        12,
    )
    grid.add(
        _flamegraph(
            "Device memory", "Bytes in use on the devices, by allocation site.", "device_memory"
        ),
        12,
        12,
    )

    grid.row("mlprof sidecar")
    grid.add(
        _timeseries(
            "Captures",
            "Profiler captures by trigger and status.",
            [
                (
                    "sum by (trigger, status) "
                    f"(increase(mlprof_captures_total{{{SIDECAR}}}[{RATE}]))",
                    "{{trigger}} {{status}}",
                )
            ],
            "none",
            minimum=0,
        ),
        8,
        8,
    )
    grid.add(
        _timeseries(
            "Profile pushes",
            "Flame-graph pushes to Pyroscope by status; spooled ones are retried.",
            [
                (
                    "sum by (sink, status) "
                    f"(rate(mlprof_profile_pushes_total{{{SIDECAR}}}[{RATE}]))",
                    "{{sink}} {{status}}",
                )
            ],
            "ops",
            minimum=0,
        ),
        8,
        8,
    )
    grid.add(
        _timeseries(
            "Spool",
            "Bytes of profiles waiting to be pushed.",
            [(f"sum by (instance) (mlprof_spool_size_bytes{{{SIDECAR}}})", "{{instance}}")],
            "bytes",
            minimum=0,
        ),
        8,
        8,
    )
    grid.add(
        _timeseries(
            "Alerts received",
            "Alertmanager alerts at the webhook by outcome (started, cooldown, duplicate...).",
            [
                (
                    "sum by (outcome) "
                    f"(increase(mlprof_alerts_received_total{{{SIDECAR}}}[{RATE}]))",
                    "{{outcome}}",
                )
            ],
            "none",
            minimum=0,
        ),
        12,
        8,
    )
    grid.add(
        _timeseries(
            "Step-log errors",
            "Malformed step-log lines skipped by the sidecar.",
            [
                (
                    f"sum by (instance) (rate(mlprof_step_log_errors_total{{{SIDECAR}}}[{RATE}]))",
                    "{{instance}}",
                )
            ],
            "ops",
            minimum=0,
        ),
        12,
        8,
    )

    return {
        "uid": OVERVIEW_UID,
        "title": "mlprof overview",
        "description": (
            "ML workload accelerators, training steps, flame graphs and the mlprof sidecar."
        ),
        "tags": ["mlprof", "ml", "accelerators"],
        "editable": True,
        "graphTooltip": 1,  # shared crosshair
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "utc",
        "links": [
            {
                "type": "link",
                "title": "Capture a profile",
                "url": capture_url,
                "icon": "bolt",
                "targetBlank": True,
                "tooltip": "Open the sidecar's capture page for the selected run and hosts",
            },
            {
                "type": "link",
                "title": "Runbook",
                "url": "https://github.com/mlprof/mlprof-exporter/blob/main/alerts/runbook.md",
                "icon": "doc",
                "targetBlank": True,
            },
        ],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                {
                    "name": "pyroscope",
                    "label": "Pyroscope",
                    "type": "datasource",
                    "query": "grafana-pyroscope-datasource",
                    "current": {},
                },
                _query_variable(
                    "workload",
                    "Workload",
                    "label_values(accelerator_duty_cycle, workload)",
                    multi=True,
                ),
                _query_variable(
                    "run_id",
                    "Run",
                    'label_values(accelerator_duty_cycle{workload=~"$workload"}, run_id)',
                    multi=False,
                ),
                _query_variable(
                    "host",
                    "Host",
                    'label_values(accelerator_duty_cycle{workload=~"$workload", '
                    'run_id=~"$run_id"}, host)',
                    multi=True,
                ),
                _query_variable(
                    "job",
                    "Sidecar job",
                    # target_info is always exposed; the sidecar's counters only once used.
                    'label_values(target_info{service_name="mlprof-exporter"}, job)',
                    multi=True,
                ),
                {
                    "name": "sidecar_url",
                    "label": "Sidecar URL",
                    "type": "textbox",
                    "query": "http://127.0.0.1:9464",
                    "current": {"text": "http://127.0.0.1:9464", "value": "http://127.0.0.1:9464"},
                },
            ]
        },
        "annotations": {
            "list": [
                {
                    "name": "mlprof alerts",
                    "datasource": PROMETHEUS,
                    "enable": True,
                    "iconColor": "red",
                    "expr": f'ALERTS{{alertstate="firing", alertname=~"ML.*", {RUN}}}',
                    "titleFormat": "{{alertname}}",
                    "textFormat": "{{host}}",
                    "step": "60s",
                }
            ]
        },
        "panels": grid.panels,
    }


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard model, for every dashboard this module generates."""
    return {f"{OVERVIEW_UID}.json": overview()}


def render(dashboard: dict[str, Any]) -> str:
    """Stable JSON text of one dashboard (sorted keys, two-space indent, final newline)."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or check) the dashboards; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--out", type=Path, default=DASHBOARDS_DIR, help="output folder")
    args = parser.parse_args(argv)
    stale = []
    for name, dashboard in dashboards().items():
        path, text = args.out / name, render(dashboard)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if args.check:
            if current != text:
                stale.append(path)
        elif current != text:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path} is stale: run `python -m dashboards.generate`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
