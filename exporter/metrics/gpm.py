"""NVML GPU Performance Monitoring (GPM, Hopper and newer): DCGM's profiling fields.

GPM metrics are rates between two samples: each collection takes a sample and asks
NVML for every metric between it and the previous one (one interval), so they cover
the whole interval, not an instant. One ``nvmlGpmMetricsGet`` carries all metrics.
A MIG instance is sampled through its parent GPU (``nvmlGpmMigSampleGet``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

__all__ = ["GPM_METRICS", "GpmSampler"]

log = logging.getLogger(__name__)

MIB: Final = 1 << 20

# catalogue metric (and attributes) <- (pynvml metric id name, factor to the catalogue unit)
GPM_METRICS: Final[dict[tuple[str, str], tuple[str, float]]] = {
    ("accelerator.tensorcore.utilization", ""): ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    ("accelerator.engine.utilization", ""): ("NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),
    ("accelerator.sm.utilization", ""): ("NVML_GPM_METRIC_SM_UTIL", 0.01),
    ("accelerator.memory.bandwidth.utilization", ""): ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    ("accelerator.pcie.throughput", "transmit"): ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    ("accelerator.pcie.throughput", "receive"): ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
}


class GpmSampler:
    """Two-sample GPM reads of one GPU or MIG instance; ``nvml`` is the pynvml module.

    ``read`` returns {(metric, direction): value in the catalogue's unit} for the
    metrics NVML computed; a metric NVML refuses once is left out from then on.
    """

    def __init__(self, nvml: Any, handle: Any, gpu_instance: int | None = None) -> None:
        self.nvml = nvml
        self.handle = handle  # the physical GPU (the parent of a MIG instance)
        self.gpu_instance = gpu_instance
        self.refused: set[tuple[str, str]] = set()
        self._previous: Any = None
        self._ids = {
            key: getattr(nvml, name)
            for key, (name, _) in GPM_METRICS.items()
            if hasattr(nvml, name)
        }

    def start(self) -> bool:
        """Take the first sample; False when this GPU (or driver) has no GPM."""
        nvml = self.nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return False
            sample = nvml.nvmlGpmSampleAlloc()
        except (AttributeError, nvml.NVMLError):
            return False  # older driver or GPU
        try:
            self._take(sample)
        except nvml.NVMLError:
            self._free(sample)
            return False
        self._previous = sample
        return True

    def _take(self, sample: Any) -> None:
        if self.gpu_instance is None:
            self.nvml.nvmlGpmSampleGet(self.handle, sample)
        else:
            self.nvml.nvmlGpmMigSampleGet(self.handle, self.gpu_instance, sample)

    def _free(self, sample: Any) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlGpmSampleFree(sample)

    def read(self) -> dict[tuple[str, str], float]:
        """Every metric over the interval since the last read; {} when none could be read."""
        nvml = self.nvml
        wanted = [(key, mid) for key, mid in self._ids.items() if key not in self.refused]
        if self._previous is None or not wanted:
            return {}
        try:
            current = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError:
            return {}
        try:
            self._take(current)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(wanted)
            request.sample1 = self._previous
            request.sample2 = current
            for i, (_, metric_id) in enumerate(wanted):
                request.metrics[i].metricId = metric_id
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            self._free(current)  # keep ``previous`` for the next interval
            log.debug("GPM read failed: %s", exc)
            return {}
        self._free(self._previous)
        self._previous = current
        out: dict[tuple[str, str], float] = {}
        for i, (key, _) in enumerate(wanted):
            metric = request.metrics[i]
            if metric.nvmlReturn != 0:
                self.refused.add(key)  # not on this GPU: asked for no more
                continue
            out[key] = max(0.0, float(metric.value) * GPM_METRICS[key][1])
        return out

    def close(self) -> None:
        if self._previous is not None:
            self._free(self._previous)
            self._previous = None
