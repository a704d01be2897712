"""NVML source: the real nvidia-ml-py without a GPU, and a double of the NVML API for values.

No GPU here: tests/nvml_double.py implements the pynvml functions the source calls,
with nvidia-ml-py's own structures and error codes (an H100, an H100 in MIG mode and
a T4), so a wrong field name, unit or error code fails.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from exporter.config import Settings
from exporter.metrics.accelerator import DeviceSeries, RunIdentity, accelerator_gauges
from exporter.metrics.catalog import METRICS, prometheus_name
from exporter.metrics.nvml import NvmlSource
from exporter.metrics.run_pids import RunPids
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.telemetry import Telemetry, build_telemetry
from tests.harness import ROOT
from tests.nvml_double import GIB, NvmlDouble, h100, t4

GOLDEN = ROOT / "tests" / "fixtures" / "nvml_3gpus.prom"
# Catalogue rows NVML has no part in (libtpu's).
TPU_ONLY = {
    name
    for name, spec in METRICS.items()
    if spec.libtpu and not spec.dcgm and name != "accelerator.tensorcore.utilization"
}


def telemetry() -> Telemetry:
    resource = Resource({"service.name": "mlprof-exporter", "host.name": "golden-host"})
    return build_telemetry(CollectorRegistry(), resource=resource)


def start(
    nvml: Any, tmp_path: Path, t: Telemetry | None = None, runs: RunPids | None = None
) -> tuple[NvmlSource, Telemetry]:
    t = t or telemetry()
    series = DeviceSeries("nvml", "gpu", stale_after_s=15)
    accelerator_gauges(t.meter).add_series(series)
    source = NvmlSource(nvml, series, RunIdentity(tmp_path, "gpu-node"), runs=runs)
    assert source.start() is None
    return source, t


def value(t: Telemetry, name: str, chip: str, **labels: str) -> float | None:
    base = {"chip": chip, "source": "nvml", "accelerator": "gpu", "host": "gpu-node"}
    return t.registry.get_sample_value(name, base | labels)


def test_values_arrive_in_base_units_per_gpu(tmp_path: Path) -> None:
    source, t = start(NvmlDouble(), tmp_path)
    assert source.collect() == ("ok", "3 GPUs, 2 MIG instances")
    assert value(t, "accelerator_duty_cycle", "0") == pytest.approx(0.97)
    assert value(t, "accelerator_memory_copy_utilization", "0") == pytest.approx(0.61)
    assert value(t, "accelerator_memory_usage_bytes", "0") == 76 * GIB  # v2: without reserved
    assert value(t, "accelerator_memory_reserved_bytes", "0") == 596 << 20
    assert value(t, "accelerator_memory_limit_bytes", "2") == 16_106_127_360
    assert value(t, "accelerator_clock_frequency_hertz", "0", clock="sm") == 1.98e9  # MHz in
    assert value(t, "accelerator_clock_frequency_hertz", "0", clock="memory") == 2.619e9
    assert value(t, "accelerator_temperature_celsius", "0", sensor="gpu") == 64
    assert value(t, "accelerator_temperature_celsius", "0", sensor="memory") == 71
    assert value(t, "accelerator_power_usage_watts", "0") == 612  # mW in
    assert value(t, "accelerator_power_limit_watts", "2") == 70
    assert value(t, "accelerator_energy_joules_total", "0") == 9.1e6  # mJ in
    assert value(t, "accelerator_clock_throttle", "0", reason="sw_power_cap") == 1
    assert value(t, "accelerator_clock_throttle", "0", reason="hw_thermal") == 0
    assert value(t, "accelerator_codec_utilization", "0", codec="decoder") == pytest.approx(0.03)
    # GPM (Hopper): interval rates, no 20 ms PCIe sample for GPU 0 ...
    assert value(t, "accelerator_tensorcore_utilization", "0") == pytest.approx(0.725)
    assert value(t, "accelerator_sm_utilization", "0") == pytest.approx(0.91)
    assert value(t, "accelerator_engine_utilization", "0") == pytest.approx(0.98)
    assert value(t, "accelerator_memory_bandwidth_utilization", "0") == pytest.approx(0.64)
    pcie = "accelerator_pcie_throughput_bytes_per_second"
    assert value(t, pcie, "0", direction="receive") == 1200 * (1 << 20)  # MiB/s in
    # ... and the driver's PCIe counter on the T4, which has no GPM (KiB/s in).
    assert value(t, pcie, "2", direction="transmit") == 102_400 * 1024
    assert value(t, "accelerator_tensorcore_utilization", "2") is None
    # NVLink: KiB counters of 18 links, summed.
    nvlink = value(t, "accelerator_nvlink_io_bytes_total", "0", direction="transmit")
    assert nvlink == 18 * 2_000_000_000 * 1024
    assert value(t, "accelerator_memory_ecc_errors_total", "0", type="corrected") == 3
    assert value(t, "accelerator_memory_ecc_lifetime_errors_total", "0", type="corrected") == 12
    assert value(t, "accelerator_memory_remapped_rows_total", "0", type="correctable") == 1
    assert value(t, "accelerator_memory_row_remap_failed", "0") == 0
    assert value(t, "accelerator_pcie_replays_total", "2") == 2
    assert value(t, "accelerator_xid_errors_total", "0") == 0  # exists before the first XID
    info = value(
        t, "accelerator_info", "2", model="Tesla T4", driver_version="570.133.20",
        uuid="GPU-1a2b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d",
    )  # fmt: skip
    assert info == 1


def test_mig_instances_are_devices_of_their_own(tmp_path: Path) -> None:
    nvml = NvmlDouble()
    source, t = start(nvml, tmp_path)
    source.collect()
    assert value(t, "accelerator_memory_limit_bytes", "1/mig1") == 40 * GIB
    assert value(t, "accelerator_memory_usage_bytes", "1/mig2") == 7 * GIB
    # GPM per instance, sampled through the parent (nvmlGpmMigSampleGet).
    assert value(t, "accelerator_tensorcore_utilization", "1/mig1") == pytest.approx(0.725 * 3 / 7)
    assert value(t, "accelerator_process_memory_usage_bytes", "1/mig1", pid="6001") == 21 * GIB
    profile = value(
        t, "accelerator_info", "1/mig2", model="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        uuid="MIG-9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b02", driver_version="570.133.20",
    )  # fmt: skip
    assert profile == 1
    # Board values stay on the GPU; a GPU in MIG mode has no utilisation rates.
    assert value(t, "accelerator_power_usage_watts", "1") == 612
    assert value(t, "accelerator_power_usage_watts", "1/mig1") is None
    assert value(t, "accelerator_duty_cycle", "1") is None
    # MIG handles are never asked for board values (NVML would refuse them).
    assert "1/mig1:clock.sm" not in source.skipped()


def test_unsupported_values_are_skipped_once_per_device_never_an_error_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.metrics.nvml")
    nvml = NvmlDouble()
    t = telemetry()
    errors: list[str] = []
    source, _ = start(nvml, tmp_path, t)
    source.on_error = errors.append
    for _ in range(5):
        assert source.collect() == ("ok", "3 GPUs, 2 MIG instances")
    skipped = source.skipped()
    assert "2:temperature.memory" in skipped  # a T4 has no memory sensor
    assert "2:nvlink" in skipped and "2:xid" in skipped and "1:utilization" in skipped
    assert not any(s.startswith("0:") for s in skipped)  # the H100 offers everything
    lines = [r.getMessage() for r in caplog.records if "does not offer" in r.getMessage()]
    assert len(lines) == len(skipped)  # one line each, not one per interval
    assert errors == []
    # Not asked for again: the T4's field request lost the memory temperature.
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP not in nvml.requested_fields[2]
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP in nvml.requested_fields[0]
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 1 + 2 * 5  # GPU 1 asked once


def test_nvml_errors_are_counted_and_other_values_still_read(tmp_path: Path) -> None:
    nvml = NvmlDouble()
    source, t = start(nvml, tmp_path)
    errors: list[str] = []
    source.on_error = errors.append
    nvml.failing["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    state, detail = source.collect()
    assert (state, detail) == ("error", "3 GPUs, 2 MIG instances, but 3 NVML reads failed")
    assert errors == ["nvml"] * 3  # once per GPU with a failure
    assert value(t, "accelerator_power_usage_watts", "0") is None
    assert value(t, "accelerator_temperature_celsius", "0", sensor="gpu") == 64
    assert "0:power.usage" not in source.skipped()  # a failure is not "unsupported"
    del nvml.failing["nvmlDeviceGetPowerUsage"]
    assert source.collect()[0] == "ok"
    assert value(t, "accelerator_power_usage_watts", "0") == 612  # back


def test_a_lost_gpu_is_unreadable_and_goes_stale(tmp_path: Path) -> None:
    nvml = NvmlDouble([h100(), t4()])
    clock = [0.0]
    t = telemetry()
    series = DeviceSeries("nvml", "gpu", stale_after_s=15, clock=lambda: clock[0])
    accelerator_gauges(t.meter).add_series(series)
    source = NvmlSource(nvml, series, RunIdentity(tmp_path, "gpu-node"))
    assert source.start() is None
    assert source.collect() == ("ok", "2 GPUs")
    nvml.lost.add(1)
    assert source.collect() == ("error", "1 of 2 GPUs unreadable")
    assert value(t, "accelerator_memory_usage_bytes", "1") == 9 * GIB  # the last reading
    clock[0] = 20.0
    source.collect()
    assert value(t, "accelerator_memory_usage_bytes", "1") is None  # then gone, not a lie
    assert value(t, "accelerator_memory_usage_bytes", "0") == 76 * GIB


def test_xid_events_are_counted_without_waiting(tmp_path: Path) -> None:
    nvml = NvmlDouble()
    source, t = start(nvml, tmp_path)
    source.collect()
    nvml.events += [(0, 79), (0, 13), (1, 48)]
    source.collect()  # the double asserts every wait has a zero timeout
    assert value(t, "accelerator_xid_errors_total", "0") == 2
    assert value(t, "accelerator_xid_last", "0") == 13
    assert value(t, "accelerator_xid_last", "1") == 48
    assert value(t, "accelerator_xid_errors_total", "2") is None  # no events on this GPU
    assert nvml.registered == {0, 1}
    source.shutdown()
    assert nvml.event_sets == 0


def test_per_process_memory_carries_the_run_of_its_pid(tmp_path: Path) -> None:
    now = time.time()
    (tmp_path / "runs").mkdir()
    record = {"run_id": "llama-1", "name": "llama", "host": "gpu-node", "pid": 4242}
    (tmp_path / "run.json").write_text(json.dumps(record | {"start_unix": now}))
    # An old run whose pid the kernel since gave to another process (5151).
    old = {"run_id": "old-run", "name": "old", "pid": 5151, "start_unix": now - 86400}
    (tmp_path / "runs" / "old-run.json").write_text(json.dumps(old))
    started = {4242: now - 5, 5151: now - 60}.get
    source, t = start(NvmlDouble(), tmp_path, runs=RunPids(tmp_path, started=started))
    source.collect()
    get = t.registry.get_sample_value
    labels = {"chip": "0", "source": "nvml", "accelerator": "gpu", "host": "gpu-node"}
    mapped = labels | {"pid": "4242", "run_id": "llama-1", "workload": "llama"}
    assert get("accelerator_process_memory_usage_bytes", mapped) == 74 * GIB
    # Unmapped: no run labels (the exporter renders them empty, which Prometheus drops).
    reused = labels | {"pid": "5151", "run_id": "", "workload": ""}
    assert get("accelerator_process_memory_usage_bytes", reused) == 1536 << 20


def test_golden_exposition_passes_promtool(tmp_path: Path) -> None:
    """The whole NVML set as Prometheus sees it; promtool lints it."""
    # Started now: whatever process has pid 4242 on this machine is older than the run.
    record = {"run_id": "golden-run", "name": "golden", "host": "gpu-node", "pid": 4242}
    (tmp_path / "run.json").write_text(json.dumps(record | {"start_unix": time.time()}))
    t = telemetry()
    sources = AcceleratorSources(
        Settings(sources=["nvml"], shared_dir=tmp_path), t.meter, nvml=NvmlDouble()
    )
    collect = sources.runs[0].collect
    assert collect is not None and collect()[0] == "ok"
    collect()  # a second interval: GPM rates exist from the second sample on
    text = generate_latest(t.registry).decode()
    if os.environ.get("REGENERATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "regenerate tests/fixtures/nvml_3gpus.prom if intended"
    emitted = {s.name for family in t.registry.collect() for s in family.samples}
    expected = {prometheus_name(s) for name, s in METRICS.items() if name not in TPU_ONLY}
    assert expected <= emitted, sorted(expected - emitted)
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install prometheus (see scripts/system-deps.sh)"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_nvml_library_switches_the_source_off_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = telemetry()
    caplog.set_level(logging.INFO, logger="exporter.metrics.sources")
    # The real nvidia-ml-py: this machine has no libnvidia-ml, as on a TPU VM.
    sources = AcceleratorSources(Settings(shared_dir=tmp_path), t.meter, nvml=pynvml)
    nvml = next(r for r in sources.runs if r.name == "nvml")
    assert (nvml.collect, nvml.state) == (None, "off")
    assert "NVML" in nvml.detail
    assert len([r for r in caplog.records if "NVML source off" in r.getMessage()]) == 1


def test_no_gpu_is_off_in_auto_and_an_error_when_named(tmp_path: Path) -> None:
    auto = AcceleratorSources(Settings(shared_dir=tmp_path), telemetry().meter, nvml=NvmlDouble([]))
    named = AcceleratorSources(
        Settings(shared_dir=tmp_path, sources=["nvml"]), telemetry().meter, nvml=NvmlDouble([])
    )
    assert [(r.name, r.state, r.detail) for r in auto.runs if r.name == "nvml"] == [
        ("nvml", "off", "NVML finds no GPU")
    ]
    assert [(r.name, r.state) for r in named.runs] == [("nvml", "error")]


class OlderNvml(NvmlDouble):
    """An nvidia-ml-py without functions newer drivers offer."""

    missing = frozenset({"nvmlDeviceGetTotalEnergyConsumption", "nvmlGpmSampleAlloc"})

    def __getattribute__(self, name: str) -> Any:
        if name in type(self).missing:
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_an_older_nvidia_ml_py_is_not_an_error(tmp_path: Path) -> None:
    source, t = start(OlderNvml([h100()]), tmp_path)
    assert source.collect() == ("ok", "1 GPUs")
    assert source.skipped() == ["0:energy"]
    assert value(t, "accelerator_energy_joules_total", "0") is None
    assert value(t, "accelerator_tensorcore_utilization", "0") is None  # no GPM either
    assert value(t, "accelerator_power_usage_watts", "0") == 612


@pytest.mark.parametrize("failing", ["nvmlGpmSampleGet", "nvmlGpmMetricsGet"])
def test_failed_gpm_reads_free_their_sample(tmp_path: Path, failing: str) -> None:
    nvml = NvmlDouble([h100()])
    source, _ = start(nvml, tmp_path)
    assert len(nvml.live) == 1  # the first GPM sample, kept for the next difference
    nvml.failing[failing] = pynvml.NVML_ERROR_UNKNOWN
    for _ in range(3):
        assert source.collect()[1] == "1 GPUs"  # the other values still read
    assert len(nvml.live) == 1
    del nvml.failing[failing]
    source.collect()
    assert len(nvml.live) == 1
    source.shutdown()
    assert nvml.live == []


def test_gpm_start_failure_frees_the_sample(tmp_path: Path) -> None:
    nvml = NvmlDouble([h100()])
    nvml.failing["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    source, _ = start(nvml, tmp_path)
    assert nvml.live == []
    source.shutdown()
