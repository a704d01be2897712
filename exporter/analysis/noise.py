"""When is a frame's change real? A rank test across steps, corrected across frames.

Two captures of the same unchanged workload differ: on a shared CPU machine single
frames move by many points of share from one capture to the next. A difference is
therefore only called a *regression* when it is both

* **large**: the frame's share of its side's total moved by at least
  :data:`MIN_DELTA_PTS` points *and* its mean time per step changed by at least
  :data:`MIN_RELATIVE_CHANGE` of the base's; and
* **significant**: every step is a sample of each frame's time, and a two-sided
  Mann-Whitney U test of the base's steps against the head's rejects "same
  distribution" at a false-discovery rate of :data:`FDR_ALPHA` across the frames tested
  (Benjamini-Hochberg, ``scipy.stats.false_discovery_control``).

Only frames that could be large are tested (their share is at least
:data:`MIN_DELTA_PTS` on one side): a frame below that can never be a regression, and
testing it would only weaken the correction for the others. Below :data:`MIN_STEPS`
steps on either side no verdict is given (the p-values are still reported).

Without steps on both sides the comparison falls back to share deltas and calls a
change significant only beyond a measured noise floor (:data:`SHARE_NOISE_FLOOR_PTS`,
:data:`MEMORY_NOISE_FLOOR_PTS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

__all__ = [
    "FDR_ALPHA",
    "HISTORY_FLOOR_PCT",
    "HISTORY_SIGMAS",
    "HOST_PHASE",
    "MEMORY_NOISE_FLOOR_PTS",
    "MIN_GROWN_STEP_PCT",
    "MIN_HISTORY",
    "MIN_NEW_STEP_PCT",
    "MIN_RELATIVE_CHANGE",
    "MIN_STEPS",
    "SHARE_NOISE_FLOOR_PTS",
    "STEP_NOISE_PCT",
    "RankTests",
    "history_step_noise_pct",
    "rank_tests",
]

# False-discovery rate across the frames tested in one comparison. 1 %: a CI gate that
# fails a build on a false alarm once in a hundred comparisons is already annoying.
FDR_ALPHA: Final = 0.01
# Fewest steps per side for a verdict. With 4 steps a side the smallest two-sided p of
# the rank test is 2/70 = 0.029, which no correction across frames lets through; 5 a
# side reach 0.008.
MIN_STEPS: Final = 5
# The step view's host part (the Python thread's phases, e.g. input_pipeline): host
# code, as noisy as the host's load, whatever the backend.
HOST_PHASE: Final = "host_phase"
# How much of the step (its excess time per step beyond the machine-wide scale, as a
# share of the base step at the head's speed) a frame must add to count as large:
# new work (absent from every base step) and work that grew. Measured on captures of the
# same JAX CPU workload taken in separate processes on this 2-core machine with other
# work running (bench/detection.py; figures in docs/analysis.md, "Detection"): PLACEHOLDER
# TPU and GPU planes time the hardware: device time does not move with the host's load.
MIN_NEW_STEP_PCT: Final = {"device": 1.0, "xla_host": 2.0, "host": 2.0, "memory": 1.0}
MIN_GROWN_STEP_PCT: Final = {
    "device": 2.0,
    "xla_host": 20.0,
    "host": 20.0,
    "memory": 2.0,
    HOST_PHASE: 20.0,
}
# ... and a frame that grew, by this fraction of its own scaled time per step.
MIN_RELATIVE_CHANGE: Final = 0.1
# The median step's change that separate runs of the same unchanged workload show, per
# view: PLACEHOLDER
STEP_NOISE_PCT: Final = {"device": 5.0, "xla_host": 80.0, "host": 80.0, "memory": 5.0}
# Earlier runs needed before their own spread replaces STEP_NOISE_PCT.
MIN_HISTORY: Final = 3
# The history's noise: this many robust standard deviations of its runs' log median
# step (MAD x 1.4826), with a floor for runs that happened to agree closely.
HISTORY_SIGMAS: Final = 4.0
HISTORY_FLOOR_PCT: Final = 2.0
# Without steps: the largest share change of a single frame between captures of the
# same unchanged workload, measured on this project's CPU captures (see
# docs/analysis.md, "Noise floor"): self shares of host frames moved by up to this many
# points between back-to-back captures of the same JAX CPU workload.
SHARE_NOISE_FLOOR_PTS: Final = 12.0
# Device-memory profiles of the same workload at the same point are near-identical
# (allocation sites are deterministic); 1 point leaves room for buffers that come and
# go (e.g. the RNG key of the current step).
MEMORY_NOISE_FLOOR_PTS: Final = 1.0


@dataclass(frozen=True)
class RankTests:
    """Per tested row: two-sided p-value, its BH-adjusted q-value and Cliff's delta.

    ``effect`` is P(head step > base step) - P(head step < base step) for the frame: +1
    when every head step took longer than every base step, -1 for the reverse.
    """

    rows: np.ndarray
    p_values: np.ndarray
    q_values: np.ndarray
    effects: np.ndarray


def rank_tests(base: np.ndarray, head: np.ndarray, rows: np.ndarray) -> RankTests:
    """Mann-Whitney U per row (``base``/``head`` are frames x steps); BH across ``rows``."""
    from scipy.stats import false_discovery_control, mannwhitneyu

    rows = np.asarray(rows, np.int64)
    if not len(rows) or base.shape[1] == 0 or head.shape[1] == 0:
        empty = np.zeros(0)
        return RankTests(rows[:0], empty, empty, empty)
    x, y = base[rows], head[rows]
    # Rows where every step of both sides has the same value carry no information
    # (scipy answers NaN for them): they are "no change", p = 1.
    constant = (x.min(axis=1) == x.max(axis=1)) & (y.min(axis=1) == y.max(axis=1))
    constant &= x[:, 0] == y[:, 0]
    p = np.ones(len(rows))
    u = np.full(len(rows), x.shape[1] * y.shape[1] / 2)
    live = ~constant
    if live.any():
        result = mannwhitneyu(y[live], x[live], axis=1, alternative="two-sided")
        p[live] = np.nan_to_num(result.pvalue, nan=1.0)
        u[live] = result.statistic
    effects = 2 * u / (x.shape[1] * y.shape[1]) - 1
    q = false_discovery_control(p, method="bh")
    return RankTests(rows, p, np.asarray(q), effects)


def history_step_noise_pct(medians_ns: Sequence[float]) -> float:
    """The step-time change (%) beyond which a run differs from its history's runs."""
    logs = np.log(np.asarray(medians_ns, float))
    mad = float(np.median(np.abs(logs - np.median(logs)))) * 1.4826
    return round(max(HISTORY_FLOOR_PCT, 100 * (float(np.exp(HISTORY_SIGMAS * mad)) - 1)), 2)
