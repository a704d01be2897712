"""The Run dashboard: one run, host by host — what is it doing, and what happened to it.

Built from row functions (``ROWS``): to add a row of panels (e.g. accelerator health
once the ``accel`` branch's clocks, temperatures and errors are exported), write one
function returning ``(title, panels)`` and append it to ``ROWS``.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from dashboards.common import (
    PROMETHEUS,
    RUN,
    RUN_UID,
    SIDECAR,
    RowSpec,
    capture_link,
    datasource_variables,
    default_stat,
    default_table,
    default_timeseries,
    field_links,
    increase,
    job_variable,
    mlprof_dashboard,
    prom,
    run_variables,
    sidecar_url_variable,
    url_link,
    with_rows,
)
from dashboards.plugins import INFINITY, InfinityQueryBuilder

__all__ = ["ROWS", "SESSIONS_PATH", "run_dashboard"]

RATE = "$__rate_interval"
# The Infinity data source whose base URL is the sidecar (compose: http://sidecar:9464).
SIDECAR_API = DataSourceRef(type_val=INFINITY, uid="${sidecar}")
# The run's sessions, newest first (GET /api/v1/sessions; the API's own limit is 10,000).
SESSIONS_PATH = "/api/v1/sessions?run_id=${run_id:percentencode}&limit=100"
# The report page of one session (HTML in a browser); lands with the analysis branch.
REPORT_URL = "${sidecar_url}/api/v1/sessions/${__value.raw}/report"
RUNBOOK = "https://github.com/mlprof/mlprof-exporter/blob/main/alerts/runbook.md"


def _duty_cycle() -> str:
    return (
        f'avg(accelerator_duty_cycle{{{RUN}, source!="sdk"}}) '
        f'or avg(accelerator_duty_cycle{{{RUN}, source="sdk"}})'
    )


def _step_quantile(q: float, by: str) -> str:
    buckets = f"train_step_duration_seconds_bucket{{{RUN}}}"
    return f"histogram_quantile({q}, sum by ({by}le) (rate({buckets}[{RATE}])))"


def summary() -> RowSpec:
    """Six numbers: is the run busy, fast, learning, and are all its hosts alive."""
    return "Run", [
        default_stat(
            "Duty cycle", "Mean over chips (hardware, else the SDK estimate).", _duty_cycle(),
            "percentunit",
        ),
        default_stat("Steps/s", "", f"sum(rate(train_steps_total{{{RUN}}}[{RATE}]))", "none"),
        default_stat("Tokens/s", "", f"sum(rate(train_tokens_total{{{RUN}}}[{RATE}]))", "short"),
        default_stat("Step time p50", "", _step_quantile(0.5, ""), "s", decimals=3),
        default_stat("MFU", "Model FLOPs utilisation.", f"avg(train_mfu{{{RUN}}})", "percentunit"),
        default_stat(
            "Hosts up", "Hosts whose step-log heartbeat is fresh.",
            f"sum(mlprof_workload_up{{{RUN}}})", "none", decimals=0,
        ),
    ]  # fmt: skip


def accelerators() -> RowSpec:
    """Per chip: busy time, tensor cores and device memory."""
    chip = "{{host}} chip {{chip}} ({{source}})"
    return "Accelerators", [
        default_timeseries(
            "Duty cycle",
            "Fraction of time each chip executed work; the SDK estimate comes from the step "
            "log where no hardware source is available.",
            "percentunit",
        )
        .min(0)
        .max(1)
        .with_target(prom(f'accelerator_duty_cycle{{{RUN}, source!="sdk"}}', chip))
        .with_target(
            prom(
                f'accelerator_duty_cycle{{{RUN}, source="sdk"}}', "{{host}} (SDK estimate)", ref="B"
            )
        )
        .links([capture_link().title("Capture a profile of this run")]),
        default_timeseries(
            "Tensor-core utilisation",
            "Tensor-core (TPU) or SM (GPU) utilisation per chip.",
            "percentunit",
        )
        .min(0)
        .max(1)
        .with_target(prom(f"accelerator_tensorcore_utilization{{{RUN}}}", chip)),
        default_timeseries(
            "Device memory in use vs limit",
            "HBM / device memory per chip: in use and capacity.",
            "bytes",
        )
        .min(0)
        .with_target(
            prom(f"accelerator_memory_usage_bytes{{{RUN}}}", "{{host}} chip {{chip}} in use")
        )
        .with_target(
            prom(
                f"accelerator_memory_limit_bytes{{{RUN}}}", "{{host}} chip {{chip}} limit", ref="B"
            )
        ),
        default_timeseries(
            "Device memory used",
            "In use as a fraction of the limit; MLAcceleratorMemoryNearCapacity fires above "
            "its threshold.",
            "percentunit",
        )
        .min(0)
        .max(1)
        .with_target(
            prom(
                f"accelerator_memory_usage_bytes{{{RUN}}} "
                f"/ (accelerator_memory_limit_bytes{{{RUN}}} > 0)",
                chip,
            )
        ),
    ]


def training() -> RowSpec:
    """Step time, throughput, model quality, and how long steps wait for input."""
    return "Training", [
        default_timeseries(
            "Step time",
            "p50 and p90 of the wall time of one step, from the step-duration histogram.",
            "s",
        )
        .min(0)
        .with_target(prom(_step_quantile(0.5, "host, "), "{{host}} p50"))
        .with_target(prom(_step_quantile(0.9, "host, "), "{{host}} p90", ref="B")),
        default_timeseries("Steps/s", "Completed steps per second.", "none")
        .span(6)
        .min(0)
        .with_target(prom(f"sum by (host) (rate(train_steps_total{{{RUN}}}[{RATE}]))", "{{host}}")),
        default_timeseries("Tokens/s", "Tokens (or samples) processed per second.", "short")
        .span(6)
        .min(0)
        .with_target(
            prom(f"sum by (host) (rate(train_tokens_total{{{RUN}}}[{RATE}]))", "{{host}}")
        ),
        default_timeseries("Loss", "As recorded by the workload.", "none").with_target(
            prom(f"train_loss{{{RUN}}}", "{{host}}")
        ),
        default_timeseries(
            "MFU", "Model FLOPs utilisation, as recorded by the workload.", "percentunit"
        )
        .min(0)
        .with_target(prom(f"train_mfu{{{RUN}}}", "{{host}}")),
        default_timeseries(
            "Input wait share",
            "Share of wall time each host waited for its next batch (wait / (wait + step)) "
            "over the duty-cycle window: high means the input pipeline is the bottleneck.",
            "percentunit",
        )
        .min(0)
        .max(1)
        .with_target(prom(f"train_input_wait_share{{{RUN}}}", "{{host}}")),
        default_timeseries(
            "Input wait per step",
            "p50 and p90 of the time spent waiting for input before each step.",
            "s",
        )
        .min(0)
        .with_target(
            prom(
                "histogram_quantile(0.5, sum by (host, le) "
                f"(rate(train_step_wait_seconds_bucket{{{RUN}}}[{RATE}])))",
                "{{host}} p50",
            )
        )
        .with_target(
            prom(
                "histogram_quantile(0.9, sum by (host, le) "
                f"(rate(train_step_wait_seconds_bucket{{{RUN}}}[{RATE}])))",
                "{{host}} p90",
                ref="B",
            )
        ),
    ]


def sessions() -> RowSpec:
    """The run's capture sessions and their reports, from the sidecar's API."""
    table = (
        default_table(
            "Capture sessions",
            "The run's sessions, newest first, from the sidecar's API (GET /api/v1/sessions). "
            "Click a session for its analysis report.",
        )
        .datasource(SIDECAR_API)
        .with_target(
            InfinityQueryBuilder(SESSIONS_PATH)
            .ref_id("A")
            .datasource(SIDECAR_API)
            .root_selector("sessions")
            .column("id", "Session")
            .column("created", "Created", "timestamp")
            .column("trigger", "Trigger")
            .column("status", "Capture")
            .column("alert.name", "Alert")
            .column("report.status", "Report")
        )
        .sort_by([common_builder.TableSortByFieldState().display_name("Created").desc(True)])
        .override_by_name(
            "Session",
            [field_links(url_link("Analysis report", REPORT_URL))],
        )
    )
    findings = (
        default_table(
            "Findings of the newest report",
            "Findings per priority (P0 most urgent) in the newest analysis report of each "
            "host of the run.",
        )
        .span(8)
        .with_target(
            prom(
                f"sum by (priority) (mlprof_report_findings{{{RUN}}})", instant=True, as_table=True
            )
        )
    )
    return "Captures and reports", [table.span(16), findings]


# The dashboard's rows, top to bottom. Add a row: one function returning (title, panels).
ROWS = (summary, accelerators, training, sessions)


def run_dashboard() -> dashboard.Dashboard:
    """The Run dashboard: step time, throughput, chips, memory, captures and reports."""
    board = (
        mlprof_dashboard(
            RUN_UID,
            "mlprof run",
            "One run host by host: accelerators, training steps, input wait, and its capture "
            "sessions with their analysis reports.",
        )
        .link(capture_link())
        .link(
            url_link("Runbook", RUNBOOK, "What each mlprof alert means and what to do").icon("doc")
        )
    )
    for variable in [
        *datasource_variables(),
        dashboard.DatasourceVariable("sidecar").label("Sidecar API").type(INFINITY),
        *run_variables(multi_run=False),
        job_variable(),
        sidecar_url_variable(),
    ]:
        board = board.with_variable(variable)
    board = board.annotations(_annotations())
    return with_rows(board, [row() for row in ROWS])


def _annotations() -> list[cogbuilder.Builder[models.AnnotationQuery]]:
    """Alerts, captures and reports of the run's sidecars, drawn on every time series."""
    # The run's sidecars: the scrape instances that report this run.
    of_run = f"and on (instance) mlprof_workload_up{{{RUN}}}"
    return [
        dashboard.AnnotationQuery()
        .name("mlprof alerts")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("red")
        .expr(f'ALERTS{{alertstate="firing", alertname=~"ML.*", {RUN}}}')
        .title_format("{{alertname}}")
        .text_format("{{host}}")
        .step("60s"),
        dashboard.AnnotationQuery()
        .name("Captures")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("blue")
        .expr(
            "sum by (trigger, status) "
            f"({increase(f'mlprof_captures_total{{{SIDECAR}}}', '1m')} {of_run})"
        )
        .title_format("capture ({{trigger}}): {{status}}")
        .text_format("")
        .step("60s"),
        dashboard.AnnotationQuery()
        .name("Reports")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("purple")
        .expr(f"sum by (status) (increase(mlprof_reports_total{{{SIDECAR}}}[1m]) {of_run}) > 0")
        .title_format("report: {{status}}")
        .text_format("")
        .step("60s"),
    ]
