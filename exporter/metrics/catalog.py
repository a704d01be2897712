"""Every accelerator metric the sidecar publishes: OpenTelemetry name, kind, unit, origin.

One table, read by the instruments (:mod:`exporter.metrics.accelerator`), the sources
(which readings go where), ``docs/metrics.md`` (a test checks every row is documented
beside its dcgm-exporter / libtpu name) and the alert-rule tests.

Units are UCUM, as the OpenTelemetry semantic conventions ask; the Prometheus exporter
turns them into base-unit suffixes (``s`` → ``_seconds``, ``By`` → ``_bytes``, ``W`` →
``_watts``, ``J`` → ``_joules``, ``Cel`` → ``_celsius``, ``Hz`` → ``_hertz``, ``By/s`` →
``_bytes_per_second``; counters get ``_total``; ``1`` and ``{annotations}`` add nothing).
Attribute names follow the OTel hardware conventions where one fits (``direction`` is
``transmit``/``receive`` as in ``network.io.direction``).

Distributions (libtpu's latency histograms) cannot be OpenTelemetry histograms: the
Python SDK has neither an asynchronous histogram nor a metric producer (1.45), and
re-recording every libtpu sample into a synchronous one would cost one call per sample.
On Prometheus they are histograms built outside OpenTelemetry
(:mod:`exporter.metrics.histograms`, not in this table). Here, for OTLP too, each
becomes a gauge per percentile (attribute ``percentile``: ``p50`` ``p90`` ``p95``
``p999``, the ones libtpu's tools print; promtool refuses a ``quantile`` label outside a
summary) plus, for latencies, two counters (``*.count``, ``*.time``) that Prometheus can
rate and sum across hosts: ``rate(time) / rate(count)`` is the mean over any window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["METRICS", "PERCENTILES", "MetricSpec", "prometheus_name"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One instrument: its OpenTelemetry name, kind, unit and where its values come from."""

    name: str
    unit: str
    description: str
    kind: Literal["gauge", "counter"] = "gauge"
    attributes: tuple[str, ...] = ()  # attributes beyond the common ones (chip, source, ...)
    dcgm: str = ""  # dcgm-exporter's field(s), for docs/metrics.md
    libtpu: str = ""  # libtpu runtime-metrics name(s)


# (label value, fraction): the percentiles libtpu's own tools (tpu-info) report.
PERCENTILES: Final = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p999", 0.999))

_PCT = ("percentile",)


def _latency(
    name: str, what: str, attributes: tuple[str, ...], libtpu: str
) -> dict[str, MetricSpec]:
    """Percentile gauge plus count and total-time counters of one libtpu latency distribution."""
    base = name.rsplit(".", 1)[0]
    return {
        name: MetricSpec(
            name,
            "s",
            f"{what}: percentiles over the last few minutes.",
            attributes=(*attributes, *_PCT),
            libtpu=libtpu,
        ),
        f"{base}.count": MetricSpec(
            f"{base}.count",
            "{operation}",
            f"{what}: operations measured (libtpu's distribution count).",
            "counter",
            attributes,
            libtpu=libtpu,
        ),
        f"{base}.time": MetricSpec(
            f"{base}.time",
            "s",
            f"{what}: total time of the operations measured (count x mean).",
            "counter",
            attributes,
            libtpu=libtpu,
        ),
    }


def _catalog() -> dict[str, MetricSpec]:
    specs = [
        # -- shared by libtpu, NVML and the SDK ------------------------------------------
        MetricSpec(
            "accelerator.duty_cycle",
            "1",
            "Fraction of time the accelerator executed work (0..1).",
            dcgm="DCGM_FI_DEV_GPU_UTIL",
            libtpu="tpu.runtime.tensorcore.dutycycle.percent",
        ),
        MetricSpec(
            "accelerator.tensorcore.utilization",
            "1",
            "Fraction of time the tensor cores (TPU MXUs, GPU tensor pipes) were busy (0..1).",
            dcgm="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            libtpu="tensorcore_util (tpu.runtime.tensorcore.utilization.percent)",
        ),
        MetricSpec(
            "accelerator.memory.usage",
            "By",
            "Device memory in use.",
            dcgm="DCGM_FI_DEV_FB_USED",
            libtpu="tpu.runtime.hbm.memory.usage.bytes",
        ),
        MetricSpec(
            "accelerator.memory.limit",
            "By",
            "Device memory capacity.",
            dcgm="DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED",
            libtpu="tpu.runtime.hbm.memory.total.bytes",
        ),
        MetricSpec(
            "accelerator.memory.bandwidth.utilization",
            "1",
            "Fraction of the device memory (HBM/DRAM) bandwidth in use (0..1).",
            dcgm="DCGM_FI_PROF_DRAM_ACTIVE",
            libtpu="tpu.runtime.hbm.utilization.percent",
        ),
        # -- GPU (NVML) ----------------------------------------------------------------------
        MetricSpec(
            "accelerator.memory.reserved",
            "By",
            "Device memory reserved by the driver and firmware.",
            dcgm="DCGM_FI_DEV_FB_RESERVED",
        ),
        MetricSpec(
            "accelerator.memory.copy.utilization",
            "1",
            "Fraction of time device memory was being read or written (0..1).",
            dcgm="DCGM_FI_DEV_MEM_COPY_UTIL",
        ),
        MetricSpec(
            "accelerator.engine.utilization",
            "1",
            "Fraction of time the graphics/compute engine was active (0..1).",
            dcgm="DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        ),
        MetricSpec(
            "accelerator.sm.utilization",
            "1",
            "Fraction of SMs with at least one warp assigned (0..1).",
            dcgm="DCGM_FI_PROF_SM_ACTIVE",
        ),
        MetricSpec(
            "accelerator.codec.utilization",
            "1",
            "Video encoder or decoder utilisation (0..1).",
            attributes=("codec",),
            dcgm="DCGM_FI_DEV_ENC_UTIL, DCGM_FI_DEV_DEC_UTIL",
        ),
        MetricSpec(
            "accelerator.clock.frequency",
            "Hz",
            "Current clock frequency.",
            attributes=("clock",),
            dcgm="DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK",
        ),
        MetricSpec(
            "accelerator.clock.throttle",
            "1",
            "1 while the clocks are held down for this reason (NVML clock event reasons).",
            attributes=("reason",),
            dcgm="DCGM_FI_DEV_CLOCKS_EVENT_REASONS (DCGM_EXP_CLOCK_EVENTS_COUNT)",
        ),
        MetricSpec(
            "accelerator.temperature",
            "Cel",
            "Temperature of the GPU die or its memory.",
            attributes=("sensor",),
            dcgm="DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_MEMORY_TEMP",
        ),
        MetricSpec(
            "accelerator.power.usage",
            "W",
            "Power draw of the board.",
            dcgm="DCGM_FI_DEV_POWER_USAGE",
        ),
        MetricSpec(
            "accelerator.power.limit",
            "W",
            "Power limit the driver enforces.",
            dcgm="DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        ),
        MetricSpec(
            "accelerator.energy",
            "J",
            "Energy consumed since the driver was loaded.",
            "counter",
            dcgm="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)",
        ),
        MetricSpec(
            "accelerator.pcie.throughput",
            "By/s",
            "PCIe traffic, headers and payload.",
            attributes=("direction",),
            dcgm="DCGM_FI_PROF_PCIE_TX_BYTES, DCGM_FI_PROF_PCIE_RX_BYTES",
        ),
        MetricSpec(
            "accelerator.pcie.replays",
            "{replay}",
            "PCIe link retries.",
            "counter",
            dcgm="DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        ),
        MetricSpec(
            "accelerator.nvlink.io",
            "By",
            "NVLink data over all links since the driver was loaded.",
            "counter",
            attributes=("direction",),
            dcgm="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        ),
        MetricSpec(
            "accelerator.xid.errors",
            "{error}",
            "XID errors the driver reported since the sidecar started (NVML events).",
            "counter",
            dcgm="DCGM_EXP_XID_ERRORS_COUNT",
        ),
        MetricSpec(
            "accelerator.xid.last",
            "1",
            "Code of the last XID error since the sidecar started (0: none).",
            dcgm="DCGM_FI_DEV_XID_ERRORS",
        ),
        MetricSpec(
            "accelerator.memory.ecc.errors",
            "{error}",
            "ECC errors since the driver was loaded (volatile counters).",
            "counter",
            attributes=("type",),
            dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        ),
        MetricSpec(
            "accelerator.memory.ecc.lifetime_errors",
            "{error}",
            "ECC errors over the board's lifetime (aggregate counters).",
            "counter",
            attributes=("type",),
            dcgm="DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        ),
        MetricSpec(
            "accelerator.memory.remapped_rows",
            "{row}",
            "Memory rows remapped after errors.",
            "counter",
            attributes=("type",),
            dcgm="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        ),
        MetricSpec(
            "accelerator.memory.row_remap.failed",
            "1",
            "1 when a row remapping failed (the GPU needs service).",
            dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE",
        ),
        MetricSpec(
            "accelerator.memory.row_remap.pending",
            "1",
            "1 when a row remapping waits for a GPU reset.",
            dcgm="DCGM_FI_DEV_ROW_REMAP_PENDING",
        ),
        MetricSpec(
            "accelerator.process.memory.usage",
            "By",
            "Device memory used by one process; run_id/workload where its pid is a run's.",
            attributes=("pid",),
            dcgm="(per-process: nvidia-smi --query-compute-apps)",
        ),
        MetricSpec(
            "accelerator.info",
            "1",
            "1 per device, with its model, UUID and driver version as labels.",
            attributes=("model", "uuid", "driver_version"),
            dcgm="modelName, UUID, DCGM_FI_DRIVER_VERSION labels",
        ),
        # -- TPU (libtpu runtime metrics) ------------------------------------------------
        MetricSpec(
            "accelerator.tensorcore.idle.duration",
            "s",
            "Time since the TensorCore last executed a program.",
            libtpu="tpu.runtime.tensorcore.idle_duration.seconds",
        ),
        MetricSpec(
            "accelerator.hlo.queue.size",
            "{program}",
            "XLA programs queued for execution on the core.",
            attributes=("core_type",),
            libtpu="hlo.queue.size.gauge",
        ),
    ]
    out = {s.name: s for s in specs}
    out |= _latency(
        "accelerator.hlo.execution.latency",
        "Execution time of XLA programs on the core",
        ("core_type",),
        "hlo.execution.timing.distribution.microseconds",
    )
    out |= _latency(
        "accelerator.collective.latency",
        "End-to-end latency of collectives (ICI and DCN)",
        ("buffer_size",),
        "megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution",
    )
    out |= _latency(
        "accelerator.host_transfer.latency",
        "Latency of host-to-device and device-to-host transfers",
        ("direction", "buffer_size"),
        "megascale.host_to_device_transfer_latencies…, "
        "megascale.device_to_host_transfer_latencies…",
    )
    out |= _latency(
        "tpu.dcn.transfer.latency",
        "Latency of buffer transfers over the data-centre network between slices",
        ("direction", "buffer_size"),
        "megascale.dcn_transfer_latencies…, megascale.dcn_inbound_transfer_latencies…",
    )
    out |= _latency(
        "tpu.host_compute.latency",
        "Latency of host-side computation in multi-slice (MXLA) collectives",
        ("buffer_size",),
        "megascale.mxla_compute_latencies.microsecond.cumulative.distribution",
    )
    out["tpu.dcn.tcp.min_rtt"] = MetricSpec(
        "tpu.dcn.tcp.min_rtt",
        "s",
        "Minimum round-trip time of the DCN gRPC TCP connections: percentiles over the last "
        "few minutes.",
        attributes=_PCT,
        libtpu="megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution",
    )
    out["tpu.dcn.tcp.delivery_rate"] = MetricSpec(
        "tpu.dcn.tcp.delivery_rate",
        "By/s",
        "Delivery rate of the DCN gRPC TCP connections: percentiles over the last few minutes.",
        attributes=_PCT,
        libtpu="megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution",
    )
    return out


# OpenTelemetry name -> spec; sources publish readings under these names.
METRICS: Final[dict[str, MetricSpec]] = _catalog()

_UNIT_SUFFIX: Final = {
    "1": "",
    "s": "_seconds",
    "By": "_bytes",
    "W": "_watts",
    "J": "_joules",
    "Cel": "_celsius",
    "Hz": "_hertz",
    "By/s": "_bytes_per_second",
}


def prometheus_name(spec: MetricSpec) -> str:
    """The name the OpenTelemetry Prometheus exporter gives ``spec`` (tests check it)."""
    suffix = _UNIT_SUFFIX.get(spec.unit, "")  # {annotations} add nothing
    name = spec.name.replace(".", "_") + suffix
    return name + "_total" if spec.kind == "counter" else name
