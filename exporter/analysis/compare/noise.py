"""When is a change real? Step time against run-to-run noise; frames by their excess time
per step, a rank test across steps, corrected across frames.

Two captures of the same unchanged workload differ, and on a shared CPU machine they
differ a lot: the median step moves by tens of percent between processes, and single
frames move systematically (a rank test across the steps of one capture calls a
5-point move q = 5e-20). So a frame is only called a *regression* when it is both

* **large**: its excess time per step (beyond the machine-wide scale, see
  :mod:`exporter.analysis.compare.comparison`) is at least :data:`MIN_NEW_STEP_PCT` of the step for
  new work, or :data:`MIN_GROWN_STEP_PCT` and :data:`MIN_RELATIVE_CHANGE` of its own
  time for work that grew; these floors are measured between *processes*
  (``bench/detection.py``), the unit a user compares; and
* **significant**: every step is a sample of each frame's time, and a two-sided
  Mann-Whitney U test of the base's steps against the head's rejects "same
  distribution" at a false-discovery rate of :data:`FDR_ALPHA` across the frames tested
  (Benjamini-Hochberg; both computed as scipy computes them, in
  :mod:`exporter.analysis.compare.rank_tests`).

The step's own change is judged in ratio (log) space, alike in both directions: with one
capture a side against :data:`STEP_NOISE_PCT` (a factor either way: on a CPU x8, so
+700 % is slower as -87.5 % is faster), or the spread of the workload's history
(:func:`history_step_noise_pct`).

**Replicates.** With several captures a side (each capture one process: a replicate)
the noise between runs is measured instead of assumed: the step verdict is Student's t
on the captures' log median steps, and each frame's verdict Student's t on its time per
step in each capture, against the rest of that capture's work (the frame left out)
(:func:`replicate_tests`, BH across frames), the variance between captures floored by
the variance of a capture's mean that its own steps show (two captures that agree by
chance are no proof of a quiet machine). Size floors then only keep trivia out
(:data:`REPLICATE_MIN_STEP_PCT`, :data:`MIN_STEP_CHANGE_PCT`). Below :data:`MIN_STEPS` steps on
either side no verdict is given (the p-values are still reported). Without steps on both
sides the comparison falls back to share deltas and calls a change significant only
beyond a measured noise floor (:data:`SHARE_NOISE_FLOOR_PTS`,
:data:`MEMORY_NOISE_FLOOR_PTS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from exporter.analysis.compare.rank_tests import (
    benjamini_hochberg,
    mann_whitney_u,
    student_t_critical,
    student_t_two_sided,
)

__all__ = [
    "FDR_ALPHA",
    "HISTORY_FLOOR_PCT",
    "HOST_PHASE",
    "MEMORY_NOISE_FLOOR_PTS",
    "MIN_GROWN_STEP_PCT",
    "MIN_HISTORY",
    "MIN_HISTORY_ALONE",
    "MIN_INFLATION_FRAMES",
    "MIN_NEW_STEP_PCT",
    "MIN_RELATIVE_CHANGE",
    "MIN_STEPS",
    "MIN_STEP_CHANGE_PCT",
    "MIN_STEP_DF",
    "REPLICATE_MIN_STEP_PCT",
    "SHARE_NOISE_FLOOR_PTS",
    "STEP_NOISE_PCT",
    "STEP_NOISE_SOURCE",
    "RankTests",
    "between_variance",
    "history_step_noise_pct",
    "inflation",
    "rank_tests",
    "replicate_tests",
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
# share of the base step at the head's speed) a frame must add to count as large: new
# work (absent from every base step) and work that grew. CPU figures measured by
# bench/detection.py on a JAX MLP loop, every capture its own process, on this 2-core
# machine while three other test suites ran (docs/analysis.md, "Detection"): over 66
# same-workload pairs no new frame was significant at all, and the largest significant
# excess of a frame that grew was 17.9 % of the step in the step view, 27.4 % in the
# device view (a while loop of small matmuls slowing unlike the large ones), 17.9 % for
# input_pipeline; with these floors 0 of 66 same-workload pairs has a verdict in any view
# and a new function at 2 % of the step is named in 10 of 10 pairs. TPU and GPU planes
# time the hardware, not the host's load: not measured here (no accelerator); their
# floors are the old 2-point share threshold's, and --history measures a workload's own.
MIN_NEW_STEP_PCT: Final = {"device": 1.0, "xla_host": 2.0, "host": 2.0, "memory": 1.0}
MIN_GROWN_STEP_PCT: Final = {
    "device": 2.0,
    "xla_host": 30.0,
    "host": 30.0,
    "memory": 2.0,
    HOST_PHASE: 20.0,
}
# ... and a frame that grew, by this fraction of its own scaled time per step.
MIN_RELATIVE_CHANGE: Final = 0.1
# The median step's change, as a factor either way, that separate runs of the same
# unchanged workload show, per view: the floor with one capture a side (the between-run
# noise unmeasured). CPU: measured by bench/detection.py on the transformer workload,
# each capture its own process, on this 2-core machine under other engineers' work: 16
# unchanged captures at load 6-9 (two processes' median steps x1.86 apart at the
# median, x5.6 at the 95th percentile, x9.8 at most) and 20 at load 10-33 (x2.25,
# x6.9, x8.6; medians 51-440 ms). x8 (700 %) leaves 1 of 120 and 3 of 190 pairs beyond
# it (1.3 %); the x6 before it left 16 of 190 (8.4 % of orientations had a false step
# verdict at the heavier load), the 80 % before that, measured at load 3-5 and applied
# in percent both ways, 124 of 240 at load 6-9. Replicates measure the noise instead.
# Device planes: not measured (see MIN_GROWN_STEP_PCT); 5 % is twice the run-to-run
# spread XProf's step time shows on a steady TPU job, and --history replaces it.
STEP_NOISE_PCT: Final = {"device": 5.0, "xla_host": 700.0, "host": 700.0, "memory": 5.0}
# Where each view's step noise comes from, as the comparison states it.
STEP_NOISE_SOURCE: Final = {
    "device": "device planes time the hardware; not measured between runs on TPU/GPU yet "
    "(give the workload's history)",
    "xla_host": "measured between processes of one CPU workload (bench/detection.py)",
    "host": "measured between processes of one CPU workload (bench/detection.py)",
    "memory": "not a time",
}
# Frames needed to estimate how much wider today's runs spread than the history's
# (inflation): a median of fewer moves with a single frame.
MIN_INFLATION_FRAMES: Final = 5
# With replicates, the smallest step change a verdict is given for, whatever the test
# says: captures that agree to 0.1 % make a 0.5 % change significant, and no reader acts
# on it. A choice, not a measurement.
MIN_STEP_CHANGE_PCT: Final = 1.0
# With replicates, the fewest degrees of freedom for Student's t on the step alone;
# below, a step verdict must also pass the one-capture floor (STEP_NOISE_PCT or the
# history's). Process speeds on a shared machine are bimodal (a busy or a quiet spell),
# which the t test on 2 + 2 log medians does not expect: 14 of 240 orientations of
# unchanged 2 + 2 comparisons were "slower" or "faster" (5.8 %; bench/detection.py,
# /tmp/det6-grown5, 40 unchanged transformer captures at load 2-7), none with the floor.
MIN_STEP_DF: Final = 4
# With replicates, the smallest excess (% of the step) of work that grew for a frame's
# verdict: the between-capture test decides above it. bench/detection.py (transformer,
# changes of a fixed size in every capture, load 10-33, both orientations,
# docs/analysis.md "Detection"): same workload 2 of 240 orientations with a verdict at 2
# and 4 captures a side (step verdicts), 0 of 120 at 8; an op grown by 10 % of the step
# named in 0 / 96-100 / 100 % at 2 / 4 / 8 a side, the data phase +10 % in 4-8 / 96 /
# 100 %.
REPLICATE_MIN_STEP_PCT: Final = 2.0
# Earlier runs needed before their own spread replaces STEP_NOISE_PCT (and, given their
# captures, the fixed floors of a frame's verdict).
MIN_HISTORY: Final = 3
# The history's step noise: the prediction bound of Student's t for two new runs (see
# history_step_noise_pct), with a floor for runs that happened to agree closely. The
# bound replaced 4 robust standard deviations (MAD) of the runs' log median steps: from
# 3-5 runs the MAD is often near 0, and with 3 unchanged captures of the transformer as
# the history 6 of 40 orientations of unchanged pairs were "slower" or "faster"
# (bench/frame_history.py, docs/analysis.md "Each frame's own history").
HISTORY_FLOOR_PCT: Final = 2.0
# Earlier runs needed before, with one capture a side, their spread judges each frame in
# place of the fixed floors (with replicates MIN_HISTORY adds them to the replicates'
# spread). bench/frame_history.py, transformer, one capture a side, both orientations,
# 40 pairs per cell, its first run (before the scale and floors were made symmetric and
# the widening; docs/analysis.md, "Each frame's own history", has today's): a loop grown by 10 %
# of the step named in 0 / 10 / 46 % with 3 / 5 / 8 earlier runs against the floors'
# 6 %, the data phase +10 % in 1 / 8 / 16 % against 15 %, and no unchanged pair with a
# frame verdict either way (0-1 of 80); from 2 captures a side 3 runs already help (the
# grown loop 0 -> 39 % of orientations, 8 runs 91 %).
MIN_HISTORY_ALONE: Final = 8
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
    rows = np.asarray(rows, np.int64)
    if not len(rows) or base.shape[1] == 0 or head.shape[1] == 0:
        empty = np.zeros(0)
        return RankTests(rows[:0], empty, empty, empty)
    x, y = base[rows], head[rows]
    # Rows where every step of both sides has the same value carry no information
    # (the test answers NaN for them): they are "no change", p = 1.
    constant = (x.min(axis=1) == x.max(axis=1)) & (y.min(axis=1) == y.max(axis=1))
    constant &= x[:, 0] == y[:, 0]
    p = np.ones(len(rows))
    u = np.full(len(rows), x.shape[1] * y.shape[1] / 2)
    live = ~constant
    if live.any():
        statistic, pvalue = mann_whitney_u(y[live], x[live])
        p[live] = np.nan_to_num(pvalue, nan=1.0)
        u[live] = statistic
    effects = 2 * u / (x.shape[1] * y.shape[1]) - 1
    return RankTests(rows, p, benjamini_hochberg(p), effects)


def history_step_noise_pct(medians_ns: Sequence[float]) -> float:
    """The step-time change (%) beyond which two runs differ more than the history's runs
    do: Student's t at :data:`FDR_ALPHA` (two-sided, N - 1 degrees of freedom) times the
    standard deviation of the runs' log median steps times sqrt 2 (two new runs, each
    as far from the workload's level as any run), as a ratio."""
    logs = np.log(np.maximum(np.asarray(medians_ns, float), 1.0))
    if len(logs) < 2:
        raise ValueError("history_step_noise_pct: at least 2 runs")
    spread = float(np.std(logs, ddof=1)) * math.sqrt(2)
    bound = student_t_critical(FDR_ALPHA, len(logs) - 1) * spread
    return round(max(HISTORY_FLOOR_PCT, 100 * math.expm1(bound)), 2)


def _squares(values: np.ndarray) -> np.ndarray:
    """Per row: the sum of squared deviations from the row's mean (0 for no columns)."""
    if values.shape[1] == 0:
        return np.zeros(len(values))
    return np.asarray(((values - values.mean(axis=1, keepdims=True)) ** 2).sum(axis=1))


def between_variance(
    base: np.ndarray,
    head: np.ndarray,
    history: np.ndarray | None = None,
    covered: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row (``base``/``head``/``history``: rows x captures), the variance between
    captures, each group about its own mean, pooled, with its degrees of freedom; the
    history's only in the rows ``covered`` says the earlier runs all ran."""
    if history is None:
        history = np.zeros((len(base), 0))
    if covered is None:
        covered = np.ones(len(base), bool)
    earlier = history.shape[1] - 1 if history.shape[1] > 1 else 0
    df = base.shape[1] + head.shape[1] - 2 + np.where(covered, earlier, 0)
    squares = _squares(base) + _squares(head) + np.where(covered, _squares(history), 0.0)
    return squares / np.maximum(df, 1), df


def replicate_tests(
    base: np.ndarray,
    head: np.ndarray,
    base_within: np.ndarray,
    head_within: np.ndarray,
    history: np.ndarray | None = None,
    covered: np.ndarray | None = None,
    inflation: float = 1.0,
) -> RankTests:
    """Student's t per row between replicates (``base``/``head``: rows x captures of each
    capture's mean), BH across rows; ``*_within``: each capture's variance of its mean
    (its steps' variance / their count), the floor of the variance between captures.
    ``history`` (rows x earlier runs, the same values of the workload's earlier
    captures): their spread joins the between-capture variance and its degrees of
    freedom, so that one capture a side can be judged against the workload's own
    run-to-run noise; only in the rows ``covered`` says the earlier runs all ran (a
    frame they never ran has no spread there, not a zero one). A row left with no
    degree of freedom is not tested (p = 1). ``inflation`` multiplies every row's
    variance (today's runs spread wider than the history's, :func:`inflation`).

    ``effect`` is Cliff's delta between the captures' values, as :func:`rank_tests`'s is
    between steps.
    """
    rows = np.arange(len(base), dtype=np.int64)
    nb, nh = base.shape[1], head.shape[1]
    if not len(rows) or nb == 0 or nh == 0:
        empty = np.zeros(0)
        return RankTests(rows[:0], empty, empty, empty)
    between, df = between_variance(base, head, history, covered)
    if df.max() < 1:
        empty = np.zeros(0)
        return RankTests(rows[:0], empty, empty, empty)
    within = np.concatenate([base_within, head_within], axis=1).mean(axis=1)
    variance = np.maximum(between, within) * inflation
    diff = head.mean(axis=1) - base.mean(axis=1)
    se = np.sqrt(variance * (1 / nb + 1 / nh))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, diff / se, np.where(diff == 0, 0.0, np.inf))
    p = np.ones(len(rows))
    for value in np.unique(df[df >= 1]).tolist():  # the t distribution per df
        group = df == value
        p[group] = student_t_two_sided(t[group], int(value))
    greater = (head[:, :, None] > base[:, None, :]).sum(axis=(1, 2))
    less = (head[:, :, None] < base[:, None, :]).sum(axis=(1, 2))
    effects = (greater - less) / (nb * nh)
    return RankTests(rows, p, benjamini_hochberg(p), effects.astype(float))


def inflation(t: np.ndarray, df: int) -> float:
    """How much wider today's runs spread than the variance behind ``t`` assumed: the
    median of t² over many frames against its median under Student's t with ``df``
    degrees of freedom (genomic control, Devlin & Roeder 1999), at least 1. The median
    is robust to the few frames that did change; a history taken on a quieter machine
    gives a variance too small for today's runs, and every frame's t grows alike.
    Fewer than :data:`MIN_INFLATION_FRAMES` frames say nothing (1)."""
    t = np.asarray(t, float)
    t = t[np.isfinite(t)]
    if len(t) < MIN_INFLATION_FRAMES or df < 1:
        return 1.0
    expected = student_t_critical(0.5, df) ** 2
    return max(1.0, float(np.median(t**2)) / expected)
