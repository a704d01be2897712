"""GPU source: NVML (``nvidia-ml-py``) per GPU index, ``source="nvml"``.

Duty cycle is NVML's utilisation rate (percent of the sample period in which a
kernel ran), memory is ``nvmlDeviceGetMemoryInfo``. Tensor-core utilisation comes
from GPM (``NVML_GPM_METRIC_ANY_TENSOR_UTIL``, Hopper and newer) as the difference
of two samples one interval apart; where GPM is unsupported the series is absent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.metrics.accelerator import DeviceSample, DeviceSeries, RunIdentity

__all__ = ["NvmlSource", "load_nvml"]

log = logging.getLogger(__name__)


def load_nvml() -> Any:
    """The ``pynvml`` module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


@dataclass
class NvmlSource:
    """Collects NVML readings into a :class:`DeviceSeries`; ``nvml`` is the pynvml module.

    ``start`` returns None when GPUs are there, else why the source is off.
    """

    nvml: Any
    series: DeviceSeries
    identity: RunIdentity
    on_error: Callable[[str], None] | None = None
    name: str = "nvml"

    def __post_init__(self) -> None:
        self._handles: list[tuple[str, Any]] = []
        self._gpm: dict[str, Any] = {}  # chip -> previous GPM sample
        self._last_state = ""

    def start(self) -> str | None:
        """Initialise NVML and find the GPUs; return the reason when there is nothing to read."""
        if self.nvml is None:
            return "nvidia-ml-py is not installed"
        try:
            self.nvml.nvmlInit()
            count = int(self.nvml.nvmlDeviceGetCount())
            self._handles = [
                (str(i), self.nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)
            ]
        except self.nvml.NVMLError as exc:
            return f"NVML unavailable ({exc})"
        if not self._handles:
            self.shutdown()
            return "NVML finds no GPU"
        for chip, handle in self._handles:
            self._gpm_start(chip, handle)
        return None

    def _gpm_start(self, chip: str, handle: Any) -> None:
        nvml = self.nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return
            sample = nvml.nvmlGpmSampleAlloc()
        except (AttributeError, nvml.NVMLError):
            return  # older driver or GPU: no tensor-core series
        try:
            nvml.nvmlGpmSampleGet(handle, sample)
        except nvml.NVMLError:
            self._free(sample)
            return
        self._gpm[chip] = sample

    def _free(self, sample: Any) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlGpmSampleFree(sample)

    def _tensor_util(self, chip: str, handle: Any) -> float | None:
        previous = self._gpm.get(chip)
        if previous is None:
            return None
        nvml = self.nvml
        try:
            current = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError:
            return None
        try:
            nvml.nvmlGpmSampleGet(handle, current)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 1
            request.sample1 = previous
            request.sample2 = current
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError:
            self._free(current)  # keep ``previous`` for the next interval
            return None
        self._free(previous)
        self._gpm[chip] = current
        if request.metrics[0].nvmlReturn != 0:
            return None
        return min(1.0, max(0.0, float(request.metrics[0].value) / 100.0))

    def collect(self) -> tuple[str, str]:
        """Read every GPU once and store the values; never raises."""
        samples = []
        errors = 0
        for chip, handle in self._handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except self.nvml.NVMLError as exc:
                errors += 1
                if self.on_error:
                    self.on_error("nvml")
                log.debug("NVML read of GPU %s failed: %s", chip, exc)
                continue  # the GPU's series goes stale and disappears
            samples.append(
                DeviceSample(
                    chip,
                    duty_cycle=min(1.0, max(0.0, float(util.gpu) / 100.0)),
                    tensorcore_utilization=self._tensor_util(chip, handle),
                    memory_usage=float(memory.used),
                    memory_limit=float(memory.total),
                )
            )
        self.series.update(samples, self.identity.current())
        if errors:
            return self._report("error", f"{errors} of {len(self._handles)} GPUs unreadable")
        return self._report("ok", f"{len(samples)} GPUs")

    def _report(self, state: str, detail: str) -> tuple[str, str]:
        if state != self._last_state:
            log.log(
                logging.WARNING if state == "error" else logging.INFO,
                "NVML source %s: %s",
                state,
                detail,
            )
            self._last_state = state
        return state, detail

    def shutdown(self) -> None:
        for sample in self._gpm.values():
            self._free(sample)
        self._gpm.clear()
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    close = shutdown
