"""NVML source: the real nvidia-ml-py without a GPU, and a double of the NVML API for values.

No GPU here: the double implements the pynvml functions the source calls, with
pynvml's own ctypes structures for GPM, so a wrong field name or type fails.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from exporter.config import Settings
from exporter.metrics.accelerator import DeviceSeries, RunIdentity, accelerator_gauges
from exporter.metrics.nvml import NvmlSource
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.telemetry import build_telemetry

GIB = 1 << 30


class NvmlDouble:
    """pynvml's surface as the source uses it; GPU 1 has no GPM (pre-Hopper)."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t  # noqa: N815 - pynvml name
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL

    def __init__(self, gpus: int = 2) -> None:
        self.gpus = gpus
        self.util = {0: 87, 1: 3}
        self.broken: set[int] = set()
        self.failing: set[str] = set()  # GPM calls that raise, by pynvml name
        self.live: list[Any] = []  # GPM samples allocated and not freed yet
        self.shut = False

    def _gpm_call(self, name: str) -> None:
        if name in self.failing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        if handle in self.broken:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=self.util[handle], memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(used=(20 + handle) * GIB, total=80 * GIB, free=0)

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(isSupportedDevice=handle == 0)

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        self._gpm_call("nvmlGpmSampleAlloc")
        sample = pynvml.c_nvmlGpmSample_t()
        self.live.append(sample)
        return sample

    def nvmlGpmSampleGet(self, handle: int, sample: Any) -> None:  # noqa: N802
        self._gpm_call("nvmlGpmSampleGet")

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        held = [i for i, live in enumerate(self.live) if live is sample]
        assert held, "GPM sample freed twice or never allocated"
        del self.live[held[0]]

    def nvmlGpmMetricsGet(self, request: Any) -> Any:  # noqa: N802
        self._gpm_call("nvmlGpmMetricsGet")
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert request.metrics[0].metricId == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        request.metrics[0].nvmlReturn = 0
        request.metrics[0].value = 42.5
        return request


def labels(chip: str) -> dict[str, str]:
    return {"chip": chip, "source": "nvml", "accelerator": "gpu", "host": "gpu-node"}


def test_values_per_gpu_index(tmp_path: Path) -> None:
    telemetry = build_telemetry(CollectorRegistry())
    series = DeviceSeries("nvml", "gpu", stale_after_s=15)
    accelerator_gauges(telemetry.meter).add_series(series)
    nvml = NvmlDouble()
    source = NvmlSource(nvml, series, RunIdentity(tmp_path, "gpu-node"))
    assert source.start() is None
    assert source.collect() == ("ok", "2 GPUs")
    get = telemetry.registry.get_sample_value
    assert get("accelerator_duty_cycle", labels("0")) == pytest.approx(0.87)
    assert get("accelerator_duty_cycle", labels("1")) == pytest.approx(0.03)
    assert get("accelerator_memory_usage_bytes", labels("1")) == 21 * GIB
    assert get("accelerator_memory_limit_bytes", labels("0")) == 80 * GIB
    assert get("accelerator_tensorcore_utilization", labels("0")) == pytest.approx(0.425)
    assert get("accelerator_tensorcore_utilization", labels("1")) is None  # no GPM there

    errors: list[str] = []
    source.on_error = errors.append
    nvml.broken.add(1)
    state, detail = source.collect()
    assert (state, detail, errors) == ("error", "1 of 2 GPUs unreadable", ["nvml"])
    source.shutdown()
    assert nvml.shut


def test_no_nvml_library_switches_the_source_off_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = build_telemetry(CollectorRegistry())
    caplog.set_level(logging.INFO, logger="exporter.metrics.sources")
    # The real nvidia-ml-py: this machine has no libnvidia-ml, as on a TPU VM.
    sources = AcceleratorSources(Settings(shared_dir=tmp_path), telemetry.meter, nvml=pynvml)
    nvml = next(r for r in sources.runs if r.name == "nvml")
    assert (nvml.collect, nvml.state) == (None, "off")
    assert "NVML" in nvml.detail
    assert len([r for r in caplog.records if "NVML source off" in r.getMessage()]) == 1


def test_no_gpu_is_off_in_auto_and_an_error_when_named(tmp_path: Path) -> None:
    auto = AcceleratorSources(
        Settings(shared_dir=tmp_path), build_telemetry(CollectorRegistry()).meter,
        nvml=NvmlDouble(gpus=0),
    )  # fmt: skip
    named = AcceleratorSources(
        Settings(shared_dir=tmp_path, sources=["nvml"]),
        build_telemetry(CollectorRegistry()).meter,
        nvml=NvmlDouble(gpus=0),
    )
    assert [(r.name, r.state, r.detail) for r in auto.runs if r.name == "nvml"] == [
        ("nvml", "off", "NVML finds no GPU")
    ]
    assert [(r.name, r.state) for r in named.runs] == [("nvml", "error")]


@pytest.mark.parametrize("failing", ["nvmlGpmSampleGet", "nvmlGpmMetricsGet"])
def test_failed_gpm_reads_free_their_sample(tmp_path: Path, failing: str) -> None:
    series = DeviceSeries("nvml", "gpu", stale_after_s=15)
    nvml = NvmlDouble(gpus=1)
    source = NvmlSource(nvml, series, RunIdentity(tmp_path, "gpu-node"))
    assert source.start() is None
    assert len(nvml.live) == 1  # the first GPM sample, kept for the next difference
    nvml.failing.add(failing)
    for _ in range(3):
        assert source.collect() == ("ok", "1 GPUs")  # duty cycle and memory still read
    assert len(nvml.live) == 1
    nvml.failing.clear()
    source.collect()
    assert len(nvml.live) == 1
    source.shutdown()
    assert nvml.live == []


def test_gpm_start_failure_frees_the_sample(tmp_path: Path) -> None:
    nvml = NvmlDouble(gpus=1)
    nvml.failing.add("nvmlGpmSampleGet")
    source = NvmlSource(
        nvml, DeviceSeries("nvml", "gpu", stale_after_s=15), RunIdentity(tmp_path, "h")
    )
    assert source.start() is None
    assert nvml.live == []
    source.shutdown()
