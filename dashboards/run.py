"""The Run dashboard: one run, host by host — what is it doing, and what happened to it.

Built from row functions (``ROWS``): to add a row of panels, write one function
returning ``(title, panels)`` and append it to ``ROWS``. The accelerator rows show
what the NVML and libtpu sources export (docs/metrics.md): GPU health (clocks, heat,
power, energy, links, XID/ECC errors, memory by process) and the TPU runtime (HLO
queue and execution, collectives, host transfers, DCN).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard, statetimeline, table
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
)

from alerts.recording import COLLECTIVE_QUANTILE
from dashboards.common import (
    ALERT_THROTTLE_REASONS,
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
    merged_columns,
    mlprof_dashboard,
    prom,
    run_variables,
    sidecar_url_variable,
    url_link,
    with_rows,
)
from dashboards.plugins import INFINITY, InfinityQueryBuilder

__all__ = ["ROWS", "SESSIONS_PATH", "THROTTLE_REASONS", "run_dashboard"]

RATE = "$__rate_interval"
CHIP = "{{host}} chip {{chip}}"
# Clock event reasons drawn on the throttling timeline: MLAcceleratorThrottled's (thermal,
# hardware slowdown, power brake) and sw_power_cap, normal for a GPU at full load but
# what explains its lower clocks. gpu_idle, applications_clocks, sync_boost and
# display_clocks are settings or idleness, not trouble.
THROTTLE_REASONS = f"sw_power_cap|{ALERT_THROTTLE_REASONS}"
# libtpu's distributions as percentile gauges: the median and the tail tpu-info prints.
MEDIAN_AND_TAIL = 'percentile=~"p50|p999"'
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
    """Per chip: busy time, tensor cores, memory bandwidth and device memory (GPU and TPU)."""
    chip = "{{host}} chip {{chip}} ({{source}})"
    return "Accelerators", [
        default_timeseries(
            "Duty cycle",
            "Fraction of time each chip executed work (GPU utilisation for NVML); the SDK "
            "estimate comes from the step log where no hardware source is available.",
            "percentunit",
        )
        .span(8)
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
            "Tensor-core and SM utilisation",
            "Tensor-core (TPU MXU, GPU tensor pipe) utilisation per chip, and on GPUs the "
            "share of SMs with work assigned: SMs busy with idle tensor cores means the "
            "kernels do not use them.",
            "percentunit",
        )
        .span(8)
        .min(0)
        .max(1)
        .with_target(prom(f"accelerator_tensorcore_utilization{{{RUN}}}", chip))
        .with_target(prom(f"accelerator_sm_utilization{{{RUN}}}", f"{CHIP} SM", ref="B")),
        default_timeseries(
            "Memory bandwidth utilisation",
            "Share of the HBM / DRAM bandwidth in use per chip: near 1 with idle tensor "
            "cores, the program is memory-bound.",
            "percentunit",
        )
        .span(8)
        .min(0)
        .max(1)
        .with_target(prom(f"accelerator_memory_bandwidth_utilization{{{RUN}}}", chip)),
        default_timeseries(
            "Device memory in use vs limit",
            "HBM / device memory per chip: in use and capacity.",
            "bytes",
        )
        .min(0)
        .with_target(prom(f"accelerator_memory_usage_bytes{{{RUN}}}", f"{CHIP} in use"))
        .with_target(prom(f"accelerator_memory_limit_bytes{{{RUN}}}", f"{CHIP} limit", ref="B")),
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


def _throttling() -> statetimeline.Panel:
    held = f'accelerator_clock_throttle{{{RUN}, reason=~"{THROTTLE_REASONS}"}}'
    return (
        statetimeline.Panel()
        .title("Clock throttling")
        .description(
            "One line per GPU and reason its clocks were held down at some time in the range "
            "(red while held down): thermal, hardware slowdown, power brake "
            "(MLAcceleratorThrottled) or the power cap. Empty: no GPU was throttled."
        )
        .datasource(PROMETHEUS)
        .with_target(prom(f"max by (host, chip, reason) ({held}) > 0", f"{CHIP} {{{{reason}}}}"))
        .mappings([ValueMap({"1": ValueMappingResult(text="held down", color="red")})])
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .span(12)
        .height(8)
    )


def _errors() -> table.Panel:
    ecc = f'accelerator_memory_ecc_errors_total{{{RUN}, type="uncorrected"}}'
    return (
        merged_columns(
            default_table(
                "XID and ECC errors",
                "Per GPU over the time range: XID errors the driver reported (NVML events "
                "since the sidecar started) and the last XID code (the runbook says which "
                "mean the GPU must be drained), uncorrectable ECC errors "
                "(MLAcceleratorEccUncorrectable), and the row remapper: 1 in Remap pending "
                "wants a GPU reset, 1 in Remap failed a new board.",
            ),
            [
                (
                    "XID errors",
                    "max by (host, chip) "
                    f"(increase(accelerator_xid_errors_total{{{RUN}}}[$__range]))",
                ),
                ("Last XID", f"max by (host, chip) (accelerator_xid_last{{{RUN}}})"),
                ("Uncorrected ECC", f"max by (host, chip) (increase({ecc}[$__range]))"),
                (
                    "Remap pending",
                    f"max by (host, chip) (accelerator_memory_row_remap_pending{{{RUN}}})",
                ),
                (
                    "Remap failed",
                    f"max by (host, chip) (accelerator_memory_row_remap_failed{{{RUN}}})",
                ),
            ],
        )
        .sort_by([common_builder.TableSortByFieldState().display_name("XID errors").desc(True)])
        .span(12)
    )


def gpu_health() -> RowSpec:
    """The run's GPUs (NVML): clocks, heat, power, energy, links, errors, memory by process."""
    process = "accelerator_process_memory_usage_bytes"
    return "GPU health", [
        _throttling(),
        _errors(),
        default_timeseries("Temperature", "GPU die and HBM temperature per GPU.", "celsius")
        .span(8)
        .with_target(prom(f"accelerator_temperature_celsius{{{RUN}}}", f"{CHIP} {{{{sensor}}}}")),
        default_timeseries(
            "Power draw vs limit",
            "Board power per GPU and the limit the driver enforces: at the limit, the clocks "
            "come down (power cap).",
            "watt",
        )
        .span(8)
        .min(0)
        .with_target(prom(f"accelerator_power_usage_watts{{{RUN}}}", f"{CHIP} draw"))
        .with_target(prom(f"accelerator_power_limit_watts{{{RUN}}}", f"{CHIP} limit", ref="B")),
        default_timeseries(
            "SM clock", "Streaming-multiprocessor clock per GPU: drops when throttled.", "hertz"
        )
        .span(8)
        .min(0)
        .with_target(prom(f'accelerator_clock_frequency_hertz{{{RUN}, clock="sm"}}', CHIP)),
        default_timeseries(
            "Energy per step",
            "Energy of all the run's GPUs per training step. Every host of a synchronous run "
            "counts each step, so steps/s is the hosts' mean.",
            "joule",
        )
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"sum(rate(accelerator_energy_joules_total{{{RUN}}}[{RATE}])) "
                f"/ avg(sum by (host) (rate(train_steps_total{{{RUN}}}[{RATE}])))",
                "J/step",
            )
        ),
        default_timeseries(
            "PCIe and NVLink throughput",
            "Host link (PCIe) and GPU-to-GPU link (NVLink, all links) traffic per GPU and "
            "direction.",
            "Bps",
        )
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"accelerator_pcie_throughput_bytes_per_second{{{RUN}}}",
                f"{CHIP} PCIe {{{{direction}}}}",
            )
        )
        .with_target(
            prom(
                f"rate(accelerator_nvlink_io_bytes_total{{{RUN}}}[{RATE}])",
                f"{CHIP} NVLink {{{{direction}}}}",
                ref="B",
            )
        ),
        default_timeseries(
            "Device memory by process",
            "GPU memory per process: the run's own (its pid from run.json), and any other "
            "process on the run's hosts (a leftover of a crashed run holds memory too).",
            "bytes",
        )
        .span(8)
        .min(0)
        .with_target(
            prom(f"sum by (host, chip, pid) ({process}{{{RUN}}})", f"{CHIP} pid {{{{pid}}}}")
        )
        .with_target(
            prom(
                f'sum by (host, chip, pid) ({process}{{run_id="", host=~"$host"}}) '
                f"and on (host) group by (host) (accelerator_memory_limit_bytes{{{RUN}}})",
                f"{CHIP} pid {{{{pid}}}} (not this run)",
                ref="B",
            )
        ),
    ]


def tpu_runtime() -> RowSpec:
    """The run's TPUs (libtpu): programs, collectives, transfers and the data-centre network."""
    per_host = "{{host}} {{direction}} {{buffer_size}}"
    return "TPU runtime and interconnect", [
        default_timeseries("HLO queue", "XLA programs waiting to run on each chip's cores.", "none")
        .span(8)
        .min(0)
        .with_target(prom(f"accelerator_hlo_queue_size{{{RUN}}}", f"{CHIP} {{{{core_type}}}}")),
        default_timeseries(
            "HLO execution time",
            "Execution time of XLA programs per chip, median and p99.9 over libtpu's last "
            "minutes: a chip slower than its peers holds every collective back.",
            "s",
        )
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"accelerator_hlo_execution_latency_seconds{{{RUN}, {MEDIAN_AND_TAIL}}}",
                f"{CHIP} {{{{percentile}}}}",
            )
        ),
        default_timeseries(
            "TensorCore idle time",
            "Time since each chip's TensorCore last ran a program: growing without bound, "
            "the chip is waiting (input, host, a hung collective).",
            "s",
        )
        .span(8)
        .min(0)
        .with_target(prom(f"accelerator_tensorcore_idle_duration_seconds{{{RUN}}}", CHIP)),
        default_timeseries(
            "Collective latency",
            "End-to-end latency of collectives (ICI and DCN) by buffer size: median and "
            "p99.9, and the mean over the panel's interval, which "
            "MLAcceleratorInterconnectLatencyRegression compares with its trailing hour.",
            "s",
        )
        .min(0)
        .with_target(
            prom(
                f"accelerator_collective_latency_seconds{{{RUN}, {MEDIAN_AND_TAIL}}}",
                "{{host}} {{buffer_size}} {{percentile}}",
            )
        )
        .with_target(
            prom(
                _mean("accelerator_collective", "host, buffer_size"),
                "{{host}} {{buffer_size}} mean",
                ref="B",
            )
        ),
        default_timeseries(
            "Collective latency, slice",
            "Median and p99 of collective latency over every host of the run (the slice), "
            "by buffer size: histogram_quantile over libtpu's summed histogram buckets "
            "(recording rule), which per-host percentiles cannot give. A p99 far above the "
            "median while one host's percentiles stand out is a straggler.",
            "s",
        )
        .min(0)
        .with_target(
            prom(
                f'{COLLECTIVE_QUANTILE}{{workload=~"$workload", run_id=~"$run_id"}}',
                "{{run_id}} {{buffer_size}} q{{quantile}}",
            )
        ),
        default_timeseries(
            "Host transfers and host compute",
            "Median latency of host-to-device and device-to-host transfers (slow ones starve "
            "the chips of input) and of the host-side computation in multi-slice "
            "collectives (one host slower than the others is a straggler), by buffer size.",
            "s",
        )
        .min(0)
        .with_target(
            prom(
                f'accelerator_host_transfer_latency_seconds{{{RUN}, percentile="p50"}}',
                f"{per_host} p50",
            )
        )
        .with_target(
            prom(
                f'tpu_host_compute_latency_seconds{{{RUN}, percentile="p50"}}',
                "{{host}} host compute {{buffer_size}} p50",
                ref="B",
            )
        ),
        default_timeseries(
            "DCN latency",
            "Between slices over the data-centre network: median buffer-transfer latency, "
            "the mean that MLAcceleratorInterconnectLatencyRegression watches, and the "
            "median minimum round-trip time of the gRPC TCP connections.",
            "s",
        )
        .min(0)
        .with_target(
            prom(f'tpu_dcn_transfer_latency_seconds{{{RUN}, percentile="p50"}}', f"{per_host} p50")
        )
        .with_target(
            prom(
                _mean("tpu_dcn_transfer", "host, direction"), "{{host}} {{direction}} mean", ref="B"
            )
        )
        .with_target(
            prom(
                f'tpu_dcn_tcp_min_rtt_seconds{{{RUN}, percentile="p50"}}',
                "{{host}} TCP min RTT p50",
                ref="C",
            )
        ),
        default_timeseries(
            "DCN delivery rate",
            "Median delivery rate of the DCN gRPC TCP connections per host.",
            "Bps",
        )
        .min(0)
        .with_target(
            prom(
                f'tpu_dcn_tcp_delivery_rate_bytes_per_second{{{RUN}, percentile="p50"}}',
                "{{host}} p50",
            )
        ),
    ]


def _mean(distribution: str, by: str) -> str:
    """Mean latency over the interval from a distribution's time and count counters."""
    return (
        f"sum by ({by}) (rate({distribution}_time_seconds_total{{{RUN}}}[{RATE}])) "
        f"/ sum by ({by}) (rate({distribution}_count_total{{{RUN}}}[{RATE}]))"
    )


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
            "MFU",
            "Model FLOPs utilisation of each host's last step: XLA's FLOPs per step "
            "(run.step_function) or the workload's, over step time x the chip's peak; the "
            "step log's mfu_basis line says which. Empty without a known peak (CPU).",
            "percentunit",
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
ROWS = (summary, accelerators, gpu_health, tpu_runtime, training, sessions)


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
