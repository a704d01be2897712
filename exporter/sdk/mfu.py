"""Model FLOPs utilisation without hand-given numbers: XLA's FLOPs, a table of chip peaks.

MFU = FLOPs one device executes per step / (step time x that device's peak FLOP/s).
FLOPs per step come from the user or from XLA's cost analysis of the compiled step
function (``jax.jit(f).lower(*args).compile().cost_analysis()["flops"]``); for an SPMD
program that is the per-device partition, the unit the peak below is in. The peak comes
from the user or from :data:`PEAK_FLOPS` by the device's ``device_kind``. A value the
user gives always wins; with either number missing no MFU is written (on CPU, where no
peak is known, unless the user gives one).

JAX is never imported here: :func:`xla_step_flops` uses the objects it is handed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["PEAK_FLOPS", "ChipPeak", "MfuBasis", "chip_peak", "xla_step_flops"]


@dataclass(frozen=True, slots=True)
class ChipPeak:
    """One chip's dense bf16 peak, per device as JAX counts devices."""

    name: str
    flops_per_s: float


# Dense (no sparsity) bf16 matrix peaks per device, in FLOP/s. Each pattern is matched
# against ``jax.Device.device_kind`` lower-cased; first match wins, so variants come
# before the family.
PEAK_FLOPS: tuple[tuple[re.Pattern[str], ChipPeak], ...] = (
    # https://cloud.google.com/tpu/docs/v4 : "Peak compute per chip (bf16) 275 TFLOPs".
    # JAX shows one device per v4 chip (megacore), device_kind "TPU v4".
    (re.compile(r"^tpu v4$"), ChipPeak("TPU v4", 275e12)),
    # https://cloud.google.com/tpu/docs/v5e : "Peak compute per chip (bf16) 197 TFLOPs";
    # device_kind "TPU v5 lite" (or "TPU v5e").
    (re.compile(r"^tpu v5 ?(lite|e)$"), ChipPeak("TPU v5e", 197e12)),
    # https://cloud.google.com/tpu/docs/v5p : "Peak compute per chip (bf16) 459 TFLOPs";
    # device_kind "TPU v5" (or "TPU v5p").
    (re.compile(r"^tpu v5p?$"), ChipPeak("TPU v5p", 459e12)),
    # https://cloud.google.com/tpu/docs/v6e : "Peak compute per chip (bf16) 918 TFLOPs";
    # device_kind "TPU v6 lite" (or "TPU v6e").
    (re.compile(r"^tpu v6 ?(lite|e)$"), ChipPeak("TPU v6e", 918e12)),
    # NVIDIA A100 datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
    # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): "BFLOAT16 Tensor Core 312
    # TFLOPS | 624 TFLOPS*" (* with sparsity); the same for SXM and PCIe, 40 and 80 GB.
    (re.compile(r"\ba100\b"), ChipPeak("NVIDIA A100", 312e12)),
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100/): BF16 Tensor Core
    # 1,979 (SXM) / 1,671 (NVL) / 1,513 (PCIe) TFLOPS "with sparsity"; dense is half.
    (re.compile(r"\bh100\b.*\bpcie\b"), ChipPeak("NVIDIA H100 PCIe", 756.5e12)),
    (re.compile(r"\bh100\b.*\bnvl\b"), ChipPeak("NVIDIA H100 NVL", 835.5e12)),
    (re.compile(r"\bh100\b"), ChipPeak("NVIDIA H100 SXM", 989.5e12)),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/): BF16 Tensor Core
    # 1,979 (SXM) / 1,671 (NVL) TFLOPS "with sparsity"; dense is half.
    (re.compile(r"\bh200\b.*\bnvl\b"), ChipPeak("NVIDIA H200 NVL", 835.5e12)),
    (re.compile(r"\bh200\b"), ChipPeak("NVIDIA H200 SXM", 989.5e12)),
)


def chip_peak(device_kind: str) -> ChipPeak | None:
    """Return the table's peak for a JAX ``device_kind``, or None for an unknown chip."""
    kind = device_kind.strip().lower()
    for pattern, peak in PEAK_FLOPS:
        if pattern.search(kind):
            return peak
    return None


def xla_step_flops(step_function: Any, *args: Any, **kwargs: Any) -> float:
    """Return the FLOPs of one call, from XLA's cost analysis of the compiled function.

    ``step_function`` is a ``jax.jit``-ed function (lowered with ``args``/``kwargs``,
    which may be ``jax.ShapeDtypeStruct``), a ``Lowered`` or a ``Compiled``. Raises
    ValueError when XLA reports no positive ``flops``.
    """
    compiled = step_function
    if hasattr(compiled, "lower"):
        compiled = compiled.lower(*args, **kwargs)
    if hasattr(compiled, "compile"):
        compiled = compiled.compile()
    if not hasattr(compiled, "cost_analysis"):
        raise ValueError(
            f"step function {step_function!r}: expected a jax.jit-ed function, a Lowered "
            "or a Compiled (with cost_analysis())"
        )
    analysis = compiled.cost_analysis()
    # A dict in current JAX; a list of per-module dicts in older ones.
    parts = analysis if isinstance(analysis, list | tuple) else [analysis]
    flops = sum(float(part.get("flops", 0.0)) for part in parts if isinstance(part, dict))
    if not flops > 0:
        raise ValueError(
            f"step function {step_function!r}: XLA's cost analysis reports no FLOPs "
            f"({analysis!r}); pass flops_per_step to sdk.run()"
        )
    return flops


@dataclass(slots=True)
class MfuBasis:
    """The two numbers MFU needs and where each came from (written to the step log)."""

    flops_per_step: float | None = None
    flops_source: str | None = None  # "user" | "xla_cost_analysis"
    peak_flops: float | None = None
    peak_source: str | None = None  # "user" | "table"
    peak_name: str | None = None  # the table's chip name
    device_kind: str | None = None

    def scale(self) -> float | None:
        """FLOPs per step / peak FLOP/s (MFU x step seconds), or None when unknown."""
        if self.flops_per_step and self.peak_flops:
            return self.flops_per_step / self.peak_flops
        return None

    def note(self) -> str:
        """One line saying what is used, or what is missing."""
        if self.flops_per_step is None:
            return "no MFU: no FLOPs per step (pass flops_per_step or call run.step_function)"
        if self.peak_flops is None:
            kind = self.device_kind or "not known yet"
            return f"no MFU: no peak FLOP/s for device kind {kind!r} (pass peak_flops)"
        peak = f"{self.peak_source}" + (f" ({self.peak_name})" if self.peak_name else "")
        return (
            f"MFU from {self.flops_per_step:.4g} FLOPs per step ({self.flops_source}) and "
            f"{self.peak_flops:.4g} FLOP/s peak ({peak})"
        )
