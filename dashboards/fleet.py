"""The Fleet dashboard: every workload and host at a glance, worst first.

Fleet-wide aggregates read the recording rules of ``alerts/recording.py`` (one series
per host or per workload), so the dashboard stays fast at 1,000 hosts. Rows of the
worst-first table link into the Run dashboard with the row's workload, run and host and
the time range carried over.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard, heatmap
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig, DynamicConfigValue

from alerts.recording import DUTY_CYCLE, MEMORY_USED, STEP_TIME_QUANTILE, STEPS_RATE, TOKENS_RATE
from dashboards.common import (
    ALERT_THROTTLE_REASONS,
    FLEET_UID,
    PROMETHEUS,
    RUN,
    RUN_UID,
    RowSpec,
    datasource_variables,
    default_stat,
    default_table,
    default_timeseries,
    field_links,
    increase,
    merged_columns,
    mlprof_dashboard,
    prom,
    run_variables,
    url_link,
    with_rows,
)

__all__ = ["ROWS", "RUN_LINK", "STALL_WINDOW", "fleet_dashboard"]

RATE = "$__rate_interval"
# A run whose heartbeat is fresh but which completed no step for this long is hung (the
# MLWorkloadStalled alert's window, shortened: the fleet view should show it first).
STALL_WINDOW = "10m"
# Hosts drawn in the per-host time series: the ones that need looking at.
WORST = 10
# The Run dashboard for one row of a table, with the time range and data sources.
RUN_LINK = (
    f"/d/{RUN_UID}/mlprof-run?var-workload=${{__data.fields.workload}}"
    "&var-run_id=${__data.fields.run_id}&var-host=${__data.fields.host}"
    "&${datasource:queryparam}&${pyroscope:queryparam}&${__url_time_range}"
)
RUN_FILTER = RUN  # the recorded per-host series keep workload, run_id and host
HOST_LABELS = ("workload", "run_id", "host")  # a host's row in the tables, leftmost
BY_HOST = ", ".join(HOST_LABELS)
WORKLOAD_FILTER = 'workload=~"$workload"'
PERCENT = DynamicConfigValue(id_val="unit", value="percentunit")
ALERTS = 'ALERTS{alertstate="firing", alertname=~"ML.*"}'
HUNG = (
    f"max by (workload, run_id, host) (mlprof_workload_up{{{RUN}}}) == 1 "
    "and on (workload, run_id, host) "
    f"sum by (workload, run_id, host) (increase(train_steps_total{{{RUN}}}[{STALL_WINDOW}])) == 0"
)
# Down and not ended: a run whose end line was read finished; it did not die.
SILENT = (
    f"max by (workload, run_id, host) (mlprof_workload_up{{{RUN}}}) == 0 "
    "unless on (workload, run_id, host) "
    f"max by (workload, run_id, host) (mlprof_run_ended{{{RUN}}}) == 1"
)


def at_a_glance() -> RowSpec:
    """Six numbers an SRE reads first."""
    return "Fleet", [
        default_stat(
            "Active runs", "Runs with at least one live host.",
            f"count(count by (workload, run_id) (mlprof_workload_up{{{RUN}}} == 1))",
            "none", decimals=0,
        ).no_value("0"),
        default_stat(
            "Hosts up", "Hosts whose step-log heartbeat is fresh.",
            f"sum(mlprof_workload_up{{{RUN}}})", "none", decimals=0,
        ).no_value("0"),
        default_stat(
            "Fleet duty cycle", "Mean over hosts of each host's mean chip duty cycle.",
            f"avg({DUTY_CYCLE}{{{RUN_FILTER}}})", "percentunit",
        ),
        default_stat(
            "Least memory headroom", "Free device memory on the fullest chip of the fleet.",
            f"1 - max({MEMORY_USED}{{{RUN_FILTER}}})", "percentunit",
        ),
        default_stat(
            "Hung runs", f"Hosts alive but without a completed step for {STALL_WINDOW}.",
            f"count({HUNG}) or vector(0)", "none", decimals=0,
        ),
        default_stat(
            "Firing alerts", "mlprof alerts firing now.", f"count({ALERTS}) or vector(0)", "none",
            decimals=0,
        ),
    ]  # fmt: skip


def duty_cycle() -> RowSpec:
    """How busy the accelerators are: the whole distribution, and the hosts to look at."""
    spread = (
        heatmap.Panel()
        .title("Duty cycle across hosts")
        .description(
            "How many hosts ran at each duty cycle over time (10 % bands; each host counts "
            "its chips' mean). A band lighting up near 0 is a fleet-wide stall."
        )
        .datasource(PROMETHEUS)
        .with_target(prom(f"{DUTY_CYCLE}{{{RUN_FILTER}}}", "{{workload}} {{run_id}} {{host}}"))
        .calculate(True)
        .calculation(
            common_builder.HeatmapCalculationOptions().y_buckets(
                common_builder.HeatmapCalculationBucketConfig()
                .mode(common.HeatmapCalculationMode.SIZE)
                .value("0.1")
            )
        )
        .y_axis(heatmap.YAxisConfig().unit("percentunit").min(0).max(1))
        .span(12)
        .height(9)
    )
    worst = (
        merged_columns(
            default_table(
                "Hosts, worst duty cycle first",
                "Each host's duty cycle, device memory headroom and step rate now. Click a run "
                "to open it in the Run dashboard.",
            ),
            [
                ("Duty cycle", f"sort({DUTY_CYCLE}{{{RUN_FILTER}}})"),
                ("Memory headroom", f"1 - {MEMORY_USED}{{{RUN_FILTER}}}"),
                (
                    "Steps/s",
                    f"sum by ({BY_HOST}) (rate(train_steps_total{{{RUN}}}[{RATE}]))",
                ),
            ],
            first=HOST_LABELS,
        )
        .sort_by([common_builder.TableSortByFieldState().display_name("Duty cycle").desc(False)])
        .override_by_name("Duty cycle", [PERCENT])
        .override_by_name("Memory headroom", [PERCENT])
        .override_by_name("run_id", [field_links(url_link("Open this run", RUN_LINK))])
        .span(12)
        .height(9)
    )
    lowest = (
        default_timeseries(
            f"Duty cycle, {WORST} least busy hosts",
            "The hosts whose accelerators idle most, over time.",
            "percentunit",
        )
        .min(0)
        .max(1)
        .with_target(
            prom(
                f"bottomk({WORST}, {DUTY_CYCLE}{{{RUN_FILTER}}})",
                "{{workload}} {{run_id}} {{host}}",
            )
        )
    )
    headroom = (
        default_timeseries(
            f"Device memory headroom, {WORST} fullest hosts",
            "Free device memory on each host's fullest chip (JAX's count where the workload "
            "reports it). MLAcceleratorMemoryNearCapacity fires near 0.",
            "percentunit",
        )
        .min(0)
        .max(1)
        .with_target(
            prom(
                f"bottomk({WORST}, 1 - {MEMORY_USED}{{{RUN_FILTER}}})",
                "{{workload}} {{run_id}} {{host}}",
            )
        )
    )
    return "Duty cycle and memory", [spread, worst, lowest, headroom]


def training() -> RowSpec:
    """Per workload: step time and throughput over all its hosts and runs."""
    return "Training", [
        default_timeseries(
            "Step time p50 / p95 per workload",
            "Quantiles of the step time over every host and run of each workload.",
            "s",
        )
        .min(0)
        .with_target(
            prom(
                f'{STEP_TIME_QUANTILE}{{{WORKLOAD_FILTER}, quantile="0.5"}}',
                "{{workload}} p50",
            )
        )
        .with_target(
            prom(
                f'{STEP_TIME_QUANTILE}{{{WORKLOAD_FILTER}, quantile="0.95"}}',
                "{{workload}} p95",
                ref="B",
            )
        ),
        default_timeseries("Steps/s per workload", "Over all hosts and runs.", "none")
        .span(6)
        .min(0)
        .with_target(prom(f"{STEPS_RATE}{{{WORKLOAD_FILTER}}}", "{{workload}}")),
        default_timeseries("Tokens/s per workload", "Over all hosts and runs.", "short")
        .span(6)
        .min(0)
        .with_target(prom(f"{TOKENS_RATE}{{{WORKLOAD_FILTER}}}", "{{workload}}")),
    ]


def attention() -> RowSpec:
    """Runs that stopped making progress, and the alerts firing now."""
    stalled = (
        merged_columns(
            default_table(
                "Stalled runs",
                f"Hung: the heartbeat is fresh but no step completed in {STALL_WINDOW} (a "
                "collective, a data loader or a checkpoint hangs). Silent: no heartbeat for "
                "10 s and no end line (the process died; a run that finished is not "
                "listed).",
            ),
            [("Hung", HUNG), ("Silent", SILENT)],
        )
        .override_by_name("run_id", [field_links(url_link("Open this run", RUN_LINK))])
        .no_value("0 stalled runs")
        .span(12)
    )
    firing = (
        default_table("Firing alerts", "mlprof alerts firing now, with their labels.")
        .with_target(prom(ALERTS, instant=True, as_table=True))
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True, "Value": True, "__name__": True}},
            )
        )
        .override_by_name("run_id", [field_links(url_link("Open this run", RUN_LINK))])
        .no_value("0 firing alerts")
        .span(12)
    )
    return "Needs attention", [stalled, firing]


def accelerator_faults() -> RowSpec:
    """Hosts whose accelerators report hardware trouble in the time range, worst first."""
    ecc = f'accelerator_memory_ecc_errors_total{{{RUN}, type="uncorrected"}}'
    throttled = f'accelerator_clock_throttle{{{RUN}, reason=~"{ALERT_THROTTLE_REASONS}"}}'
    table = (
        merged_columns(
            default_table(
                "Hosts with accelerator faults",
                "Hosts whose GPUs reported, in the time range: uncorrectable ECC errors, XID "
                "errors, or clocks held down for a thermal or power reason (the worst chip's "
                "share of the range, MLAcceleratorThrottled's reasons). Healthy hosts are not "
                "listed. Click a run to open it in the Run dashboard.",
            ),
            [
                ("Uncorrected ECC", f"sum by ({BY_HOST}) (increase({ecc}[$__range])) > 0"),
                (
                    "XID errors",
                    f"sum by ({BY_HOST}) "
                    f"(increase(accelerator_xid_errors_total{{{RUN}}}[$__range])) > 0",
                ),
                ("Throttled", f"max by ({BY_HOST}) (avg_over_time({throttled}[$__range])) > 0"),
            ],
            first=HOST_LABELS,
        )
        .sort_by([common_builder.TableSortByFieldState().display_name("XID errors").desc(True)])
        .override_by_name("Throttled", [PERCENT])
        .override_by_name("run_id", [field_links(url_link("Open this run", RUN_LINK))])
        .no_value("No accelerator faults")
    )
    return "Accelerator faults", [table]


def captures() -> RowSpec:
    """What the sidecars captured and concluded, over time."""
    return "Captures and reports", [
        default_timeseries("Captures", "Finished capture sessions by trigger and status.", "none")
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"sum by (trigger, status) ({increase('mlprof_captures_total', RATE)})",
                "{{trigger}} {{status}}",
            )
        ),
        default_timeseries("Reports", "Analysis reports written, by verdict.", "none")
        .span(8)
        .min(0)
        .with_target(
            prom(f"sum by (status) (increase(mlprof_reports_total[{RATE}]))", "{{status}}")
        ),
        default_timeseries(
            "Open findings", "Findings of the newest report of every run, by priority.", "none"
        )
        .span(8)
        .min(0)
        .with_target(prom(f"sum by (priority) (mlprof_report_findings{{{RUN}}})", "{{priority}}")),
    ]


ROWS = (at_a_glance, duty_cycle, training, attention, accelerator_faults, captures)


def fleet_dashboard() -> dashboard.Dashboard:
    """The Fleet dashboard."""
    board = mlprof_dashboard(
        FLEET_UID,
        "mlprof fleet",
        "Every workload and host at a glance: duty cycle, memory headroom, step time, "
        "stalled runs, alerts, captures and reports. Rows link into the Run dashboard.",
    )
    for variable in [*datasource_variables(), *run_variables(multi_run=True)]:
        board = board.with_variable(variable)
    return with_rows(board, [row() for row in ROWS])
