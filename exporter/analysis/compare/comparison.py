"""Compare two sides: did the step get slower, by how much, beyond noise, and which work
explains the difference, in time per step.

A side is one :class:`Side` or several: **replicates**, each one capture (one process)
of the same workload. Their steps are pooled for the times shown, and the spread
*between* them is the run-to-run noise the verdicts are judged against; with one
capture a side that noise is not measured and fixed floors stand in for it (the JSON
says which: ``noise.between_runs``).

The answer comes in this order:

1. **Step time** (:class:`StepVerdict`): the median step of each side (of several
   captures, the geometric mean of their medians), the change, and a verdict judged in
   ratio (log) space so that A vs B and B vs A mirror each other ("faster" is "slower"
   read backwards). One capture a side: a bootstrap interval and the factor that
   separate runs of the same workload show on that backend
   (:data:`exporter.analysis.compare.noise.STEP_NOISE_PCT`, or the spread of the workload's own
   history); replicates: Student's t on the captures' log median steps.
2. **Attribution in absolute time.** Every frame's mean time per step on each side
   (``base_ms``/``head_ms``), its change (``delta_ms``) and its **excess**: the change
   beyond the machine-wide factor ``scale`` (the time-weighted median of head/base over
   the work both sides ran; another process on the machine slows every op alike, new
   work does not). ``step_pct`` is the excess as a share of the base step at the head's
   speed (``scale`` x base median step): "this function adds 5 % to the step".
   ``explains_pct`` is the excess as a share of the step-time change, given only when
   that change is a verdict (beyond noise).
3. **Verdicts.** A frame is a regression when it is significant and large. One capture a
   side: significant by Mann-Whitney U across steps of its scaled time per step
   (Benjamini-Hochberg across the frames tested), large from
   :data:`~exporter.analysis.compare.noise.MIN_NEW_STEP_PCT` of the step for new (or, read
   backwards, removed) work, from :data:`~exporter.analysis.compare.noise.MIN_GROWN_STEP_PCT`
   and :data:`~exporter.analysis.compare.noise.MIN_RELATIVE_CHANGE` of its own time (in ratio
   terms, both ways) for work that grew. Replicates: significant by Student's t between
   the captures' values, each divided by the rest of that capture's work (the frame
   left out) against the same over all captures of both sides
   (:func:`exporter.analysis.compare.noise.replicate_tests`), large from
   :data:`~exporter.analysis.compare.noise.REPLICATE_MIN_STEP_PCT`; work found changed
   is set aside from the others' rest and they are tested again, and a subtree holding
   most of the work on both sides is left to its own frames. **History**: given 3 or
   more earlier captures of the workload (``history_sides``), each frame's spread between
   them joins the between-capture variance (with one capture a side, it is the whole of
   it, and the fixed floors give way: ``noise.between_runs.source`` says which). Runtime waits
   (XLA's executor waiting for its thunks, a host thread in dispatch, the step
   annotation's own time while XLA works) are kept out of the candidates: their time
   is the work they wait on, which is judged itself (``"wait": true`` in the JSON).
   When the step changed and the frames explain less than half of it, the change is
   **uniform** (every op scaled alike: a machine, clock or configuration change).
4. **What it could have seen** (``min_detectable``): the smallest step change and
   per-frame excess these captures could call at the false-alarm rate, and how many
   captures a side would bring them to 5 % (only when the between-run noise is
   measured).

``delta_*_pts`` (each side's share of its own total, head - base) are still given: the
flame-graph colours use them. ``share`` normalisation (no steps on a side) compares
those shares against a measured floor, as before.

Entries (``regressions`` grow, ``improvements`` shrink) come in two bases: ``self``
(the frame's own time) and ``total`` (a subtree whose frames below do not explain at
least half of its excess, e.g. a new program whose time is spread over many ops).
Each list is ordered by verdict, then by excess time per step.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from exporter.analysis.compare import noise
from exporter.analysis.compare.diff import AlignedTree, DiffFrame, align
from exporter.analysis.compare.noise import HOST_PHASE
from exporter.analysis.compare.rank_tests import (
    benjamini_hochberg,
    student_t_critical,
    student_t_two_sided,
)
from exporter.analysis.sides.load import HOST_FRAME, XLA_THREAD, Side
from exporter.analysis.sides.xla_host import RUNTIME_WAIT_RE

__all__ = [
    "DEFAULT_TOP",
    "Comparison",
    "Entry",
    "StepVerdict",
    "compare_sides",
    "frame_label",
    "is_host_phase",
    "is_wait",
]

DEFAULT_TOP: Final = 20
# A "total" entry is listed when the self entries below it explain less than this
# fraction of its excess.
UNEXPLAINED_FRACTION: Final = 0.5
# The step got slower and the frames explain less than this fraction of it: uniform.
UNIFORM_UNEXPLAINED: Final = 0.5
# Files of installed packages and the interpreter: not a user's allocation site.
_LIBRARY_FILE = re.compile(r"(site-packages|dist-packages|/lib/python\d|<frozen|^<)")
# Entries kept per list (the JSON shows ``top`` of them; the CI gate looks at all).
MAX_ENTRIES: Final = 200
# Frames whose time is the runtime waiting for work judged elsewhere.
_WAIT = RUNTIME_WAIT_RE
# The machine-wide scale (see _scales): frames with this share of the common work vote,
# and the frames within this factor of their median ratio make it.
SCALE_MIN_WEIGHT: Final = 0.01
SCALE_BAND: Final = 1.5
# Bootstrap resamples for the interval of the median step's change.
BOOTSTRAP_RESAMPLES: Final = 2000
_RNG_SEED: Final = 20261201  # fixed: the same inputs give the same interval
# min_detectable: the step change and frame excess (% of the step) whose number of
# captures a side it states, and the most captures it will name.
TARGET_DETECTABLE_PCT: Final = 5.0
MAX_CAPTURES_NAMED: Final = 64
# min_detectable states a figure up to this (% of the step); above, null ("not with these
# captures": 2 + 2 captures give the t test 2 degrees of freedom).
BEYOND_REACH_PCT: Final = 1000.0
# The share of a comparison's time in frames that every earlier run ran, below which the
# history's spread is not used (a history from before ops were renamed speaks for few of
# today's frames). A choice: the frames it does not cover are judged without it.
HISTORY_MIN_COVERAGE: Final = 0.9
# The inflation of the history's variance (noise.inflation) below which it is taken for
# chance (1: none): the median of 10-30 frames' t² moves that far by chance alone, and
# applying every inflation above 1 cost a history from the same hours a third of its
# power (a grown loop at 2 captures a side: 95 -> 65 % of orientations), while one from
# a quieter machine inflates x4-10 (bench/frame_history.py --history-from).
INFLATION_MIN: Final = 2.0
INFLATION_NOTED: Final = INFLATION_MIN
# Between runs, subtrees holding more than this share of the work on both sides are not
# judged against the rest of it (see compare_sides).
MAJORITY_SHARE: Final = 0.5
# Replicates: a frame's time per step is compared in log space, floored at this share of
# the step (see _ReplicateValues).
LOG_FLOOR_STEP_FRACTION: Final = 0.001
# A robust standard deviation from a median absolute deviation (a normal's).
_MAD_SIGMA: Final = 1.4826
# The standard error of a median is this times the one of a mean (a normal's, sqrt(pi/2)).
_MEDIAN_SE: Final = 1.2533

Normalisation = Literal["per_step", "share"]
Verdict = Literal["slower", "faster", "unchanged", "unknown"]


def is_wait(
    frame: DiffFrame,
    step_names: set[str] | frozenset[str] = frozenset(),
    host_view: bool = False,
    pool_threads: bool = True,
) -> bool:
    """Whether ``frame``'s own time is a runtime wait, not work (see the module doc).

    In the host's own threads, what runs inside a dispatch (XLA ops a small program runs
    inline on the calling thread) is device work, judged there: a wait here. In the host
    view, the threads of XLA's pools are too: which pool thread ran an op changes from
    one process to the next (measured: a thread's total +81 % between two processes of
    one workload), so their ops are judged in the device view (``pool_threads=False``:
    they are work all the same, as the machine-wide scale needs).
    """
    stack = frame.stack()
    if _WAIT.match(frame.name):
        return True
    if host_view:
        if pool_threads and stack and XLA_THREAD.search(stack[0].name):
            return True
        threads = stack
    elif stack and stack[0].name == HOST_FRAME:
        threads = stack[1:]
    else:
        return False
    if len(threads) <= 1:  # a thread: its total is its frames', judged one by one
        return True
    # The host's step annotation: its own time is the thread blocked inside the step.
    return frame.name in step_names or any(_WAIT.match(f.name) for f in stack[:-1])


def frame_label(names: Sequence[str]) -> str:
    """A frame as titles name it: its program (or, in the host part, its thread) > itself.

    Always, not only when the name recurs in this comparison: XLA names ops per HLO
    module, so ``fusion.2`` or ``ynn_fusion`` is an op of most programs (a new
    ``jit_extra_work``'s ``ynn_fusion`` beside the step's own), and a title that changed
    with what else a capture held could not be searched for. The stack between the two
    (a ``while`` body) is in ``frame``; XLA's op names are unique within a module.
    """
    shown = list(names[1:] if len(names) > 1 and names[0] == HOST_FRAME else names)
    if len(shown) <= 1:
        return "".join(shown)
    return f"{shown[0]} > {shown[-1]}"


def is_host_phase(frame: DiffFrame) -> bool:
    """Whether ``frame`` is in the step view's host part (the host's own threads)."""
    stack = frame.stack()
    return bool(stack) and stack[0].name == HOST_FRAME


@dataclass
class StepVerdict:
    """Step time base -> head and whether it moved beyond run-to-run noise.

    The verdict is judged on the ratio head/base, so a change and its mirror image
    (base and head swapped) get mirrored verdicts: ``noise_pct`` is the factor either
    way (80 %: slower beyond x1.8, faster beyond x1/1.8, i.e. -44.4 %).
    """

    base_median_ms: float | None
    head_median_ms: float | None
    change_pct: float | None
    interval_pct: tuple[float, float] | None  # 95 % interval of change_pct
    noise_pct: float  # a change within this factor is what separate runs show
    noise_source: str
    verdict: Verdict
    scale: float | None  # machine-wide factor: head/base time of the work both ran
    uniform: bool = False
    explained_pct: float | None = None  # share of the change the verdicts explain
    replicates: tuple[int, int] = (1, 1)  # captures on each side
    between_runs: bool = False  # noise measured between the replicates
    p_value: float | None = None  # of the between-replicate test

    @property
    def statistic(self) -> str:
        return (
            "median step of each side"
            if self.replicates == (1, 1)
            else "geometric mean of each capture's median step"
        )

    def to_json(self) -> dict[str, Any]:
        def num(v: float | None) -> float | None:
            return None if v is None else round(float(v), 3)

        return {
            "base_median_ms": num(self.base_median_ms),
            "head_median_ms": num(self.head_median_ms),
            "statistic": self.statistic,
            "change_pct": num(self.change_pct),
            "interval_pct": None
            if self.interval_pct is None
            else [num(v) for v in self.interval_pct],
            "noise_pct": num(self.noise_pct),
            "noise_ratio": num(1 + self.noise_pct / 100),
            "noise_source": self.noise_source,
            "between_runs": self.between_runs,
            "replicates": list(self.replicates),
            "p_value": None if self.p_value is None else float(f"{self.p_value:.3g}"),
            "verdict": self.verdict,
            "scale": num(self.scale),
            "uniform": self.uniform,
            "explained_pct": num(self.explained_pct),
        }

    def sentence(self) -> str:
        """One line: the step's change and what it means."""
        if self.base_median_ms is None or self.head_median_ms is None or self.change_pct is None:
            return "step time: no steps on a side, no step-time verdict"
        ci = (
            f" (95 % interval {self.interval_pct[0]:+.1f}..{self.interval_pct[1]:+.1f} %)"
            if self.interval_pct
            else ""
        )
        said = {
            "slower": "SLOWER",
            "faster": "faster",
            "unchanged": "within noise",
            "unknown": "too few steps for a verdict",
        }[self.verdict]
        what = "median step" if self.replicates == (1, 1) else "median step (captures' geo-mean)"
        line = (
            f"{what} {self.base_median_ms:.2f} ms -> {self.head_median_ms:.2f} ms "
            f"({self.change_pct:+.1f} %){ci}: {said} (noise x{1 + self.noise_pct / 100:.3g} "
            f"either way, {self.noise_source})"
        )
        if self.uniform and self.scale is not None:
            line += (
                f"; uniform: all ops x{self.scale:.2f}, a machine, clock or configuration "
                "change rather than new work"
            )
        return line


@dataclass
class Entry:
    """One frame's change (the JSON object of ``regressions``/``improvements``)."""

    frame: DiffFrame
    basis: Literal["self", "total"]
    values: dict[str, float]  # self_base, self_head, total_base, total_head and *_pct
    delta_self_pts: float
    delta_total_pts: float
    relative_change: float | None  # of the basis value's scaled mean per step; None: new
    significant: bool
    regression: bool  # large and significant (an improvement when it shrank)
    p_value: float | None
    q_value: float | None
    effect: float | None
    base_ms: float = 0.0
    head_ms: float = 0.0
    excess_ms: float = 0.0  # head - scale x base, ms per step
    step_pct: float = 0.0  # excess as % of the base step at the head's speed
    explains_pct: float | None = None  # excess as % of the step-time change
    new: bool = False
    wait: bool = False

    @property
    def delta_pts(self) -> float:
        return self.delta_self_pts if self.basis == "self" else self.delta_total_pts

    @property
    def delta_ms(self) -> float:
        return self.head_ms - self.base_ms

    @property
    def label(self) -> str:
        """The frame as a title names it (:func:`frame_label`): ``jit_extra_work > ynn_fusion``."""
        return frame_label([f.name for f in self.frame.stack()])

    @property
    def site(self) -> DiffFrame | None:
        """The innermost frame of the user's own code (a file outside installed packages).

        A memory profile's stack ends in the framework (``jnp.ones`` ... ``__call__``);
        the allocation site a reader acts on is the last frame of their own code.
        """
        for frame in reversed(self.frame.stack()):
            if frame.file and not _LIBRARY_FILE.search(frame.file):
                return frame
        return None

    def to_json(self) -> dict[str, Any]:
        stack = self.frame.stack()
        site = self.site
        return {
            "frame": ";".join(f.name.replace(";", ":") for f in stack),
            "name": self.frame.name,
            "label": self.label,
            "file": self.frame.file,
            "line": self.frame.line,
            "site": None if site is None else f"{site.name} ({site.file}:{site.line})",
            "basis": self.basis,
            **{k: _num(v) for k, v in self.values.items()},
            "delta_self_pts": _num(self.delta_self_pts),
            "delta_total_pts": _num(self.delta_total_pts),
            "relative_change_pct": None
            if self.relative_change is None
            else _num(100 * self.relative_change),
            "base_ms": _num(self.base_ms),
            "head_ms": _num(self.head_ms),
            "delta_ms": _num(self.delta_ms),
            "excess_ms": _num(self.excess_ms),
            "step_pct": _num(self.step_pct),
            "explains_pct": None if self.explains_pct is None else _num(self.explains_pct),
            "new": self.new,
            "wait": self.wait,
            "significant": self.significant,
            "regression": self.regression,
            "p_value": None if self.p_value is None else float(f"{self.p_value:.3g}"),
            "q_value": None if self.q_value is None else float(f"{self.q_value:.3g}"),
            "effect": None if self.effect is None else round(self.effect, 3),
        }


def _num(value: float) -> float:
    return round(float(value), 3)


@dataclass
class Comparison:
    """Both sides, their aligned tree, the step-time verdict and every frame's change."""

    kind: str
    normalisation: Normalisation
    base: Side
    head: Side
    tree: AlignedTree
    regressions: list[Entry]
    improvements: list[Entry]
    noise_floor_pts: float | None
    verdict_possible: bool
    notes: list[str] = field(default_factory=list)
    # (basis, frame index) -> (p, q, effect) of every test made.
    tests: dict[tuple[str, int], tuple[float, float, float]] = field(default_factory=dict)
    step_verdict: StepVerdict = field(
        default_factory=lambda: StepVerdict(None, None, None, None, 0.0, "", "unknown", None)
    )
    # Each side's captures (replicates); base/head above are them pooled.
    base_replicates: list[Side] = field(default_factory=list)
    head_replicates: list[Side] = field(default_factory=list)
    replicated: bool = False  # the noise between runs measured between the replicates
    # Earlier runs whose frames' spread joined the between-run noise (0: none).
    history_runs: int = 0
    min_detectable: dict[str, Any] = field(default_factory=dict)

    @property
    def view(self) -> str:
        """``step`` (device work and host phases), or the one kind compared."""
        return "step" if self.base.scope == "step" else self.kind

    @property
    def measured(self) -> bool:
        """Whether the frames' between-run noise is measured (replicates or history)."""
        return self.replicated or self.history_runs > 0

    @property
    def noise_source(self) -> str:
        """Where the frames' between-run noise comes from, as the output names it."""
        if self.replicated and self.history_runs:
            return "replicates and history"
        if self.replicated:
            return "replicates"
        return "history" if self.history_runs else "fixed floors"

    @property
    def noise_view(self) -> str:
        return _noise_view(self.base, self.head)

    @property
    def min_new_step_pct(self) -> float:
        return noise.MIN_NEW_STEP_PCT[self.noise_view]

    @property
    def min_grown_step_pct(self) -> float:
        return noise.MIN_GROWN_STEP_PCT[self.noise_view]

    @property
    def top_regression(self) -> Entry | None:
        """The regression that explains the most step time, if any."""
        return next((e for e in self.regressions if e.regression), None)

    def step_time(self) -> dict[str, float | None]:
        """Mean step cycle of each side (kept for the report's older key)."""

        def mean(values: list[int]) -> float | None:
            return float(np.mean(values)) if values else None

        base, head = mean(self.base.step_ns), mean(self.head.step_ns)
        change = 100 * (head - base) / base if base and head is not None else None
        return {"base_mean_ns": base, "head_mean_ns": head, "change_pct": change}

    def failing(self, threshold_pct: float) -> list[Entry]:
        """Regression verdicts whose excess time is more than ``threshold_pct`` % of the step."""
        return [e for e in self.regressions if e.regression and e.step_pct > threshold_pct]

    def gate_reasons(self, threshold_pct: float) -> list[str]:
        """Why ``--fail-on-regression threshold_pct`` fails (empty: it passes).

        It fails exactly on the verdicts: a regression whose excess is more than
        ``threshold_pct`` % of the base step, or a step-time verdict "slower" by more
        than ``threshold_pct`` %.
        """
        reasons = [
            f"{e.to_json()['frame']} ({e.basis}) adds {e.excess_ms:.3g} ms per step, "
            f"{e.step_pct:.1f} % of the step (> {threshold_pct:g} %)"
            for e in self.failing(threshold_pct)
        ]
        v = self.step_verdict
        if v.verdict == "slower" and v.change_pct is not None and v.change_pct > threshold_pct:
            reasons.append(
                f"step time {v.change_pct:+.1f} % (> {threshold_pct:g} %, beyond the "
                f"{v.noise_pct:g} % noise{'; uniform' if v.uniform else ''})"
            )
        return reasons

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        base, head = self.base.describe(), self.head.describe()
        base["replicates"] = len(self.base_replicates) or 1
        head["replicates"] = len(self.head_replicates) or 1
        means = self.tree.means()
        base["total"], head["total"] = _num(means[1][0]), _num(means[3][0])
        base["whole_total"], head["whole_total"] = (
            self.base.whole.root.total,
            self.head.whole.root.total,
        )
        if self.normalisation == "per_step":
            noise_model: dict[str, Any] = {
                "method": "time per step beyond the machine-wide scale; mann-whitney-u "
                "across steps, benjamini-hochberg across frames",
                "fdr_alpha": noise.FDR_ALPHA,
                "min_steps": noise.MIN_STEPS,
                "min_new_step_pct": self.min_new_step_pct,
                "min_grown_step_pct": self.min_grown_step_pct,
                "min_relative_change_pct": 100 * noise.MIN_RELATIVE_CHANGE,
                "step_noise_pct": self.step_verdict.noise_pct,
                "noise_view": self.noise_view,
                "verdict": self.verdict_possible,
                "between_runs": {
                    "measured": self.measured,
                    "source": self.noise_source,
                    "replicates": [len(self.base_replicates), len(self.head_replicates)],
                    "history_runs": self.history_runs,
                    "method": "student's t between the captures"
                    + (" and the earlier runs" if self.history_runs else "")
                    + ", each against the rest of its own work (leave-one-out); "
                    "benjamini-hochberg across frames"
                    if self.measured
                    else "not measured (one capture a side): the fixed floors stand in",
                    "min_replicate_step_pct": noise.REPLICATE_MIN_STEP_PCT,
                },
            }
        else:
            noise_model = {
                "method": "share delta beyond a noise floor",
                "noise_floor_pts": self.noise_floor_pts,
            }
        return {
            "kind": self.kind,
            "view": self.view,
            "sample_type": self.tree.sample_type,
            "unit": self.tree.unit,
            "normalisation": self.normalisation,
            "denominator": "each side's own total"
            + (" per step" if self.normalisation == "per_step" else ""),
            "values": "mean per step" if self.normalisation == "per_step" else "whole side",
            "noise": noise_model,
            "base": base,
            "head": head,
            "step_time": self.step_time(),
            "step_verdict": self.step_verdict.to_json(),
            "min_detectable": self.min_detectable,
            "regressions": [e.to_json() for e in self.regressions[:top]],
            "improvements": [e.to_json() for e in self.improvements[:top]],
            "notes": self.notes,
        }


def _shares(values: np.ndarray) -> np.ndarray:
    root = values[0]
    return 100 * values / root if root > 0 else np.zeros_like(values)


def _noise_view(base: Side, head: Side) -> str:
    """The noisier of the two sides' views decides how large a change must be."""
    views = {base.view, head.view}
    return max(views, key=lambda view: noise.MIN_GROWN_STEP_PCT[view])


def _scales(base: np.ndarray, head: np.ndarray, candidates: np.ndarray) -> list[float]:
    """Candidate machine-wide scales: head over base time of the work both sides ran.

    Two estimates: of all the common work, and of the frames' consensus (the frames
    within :data:`SCALE_BAND` of the median ratio of the frames holding at least
    :data:`SCALE_MIN_WEIGHT` of it). New work moves neither (it is not common). The
    caller keeps the one that leaves fewer frames changed: one frame that changed
    alone, however large, is outside the consensus; ops that slow unevenly under a
    loaded CPU are best scaled all together (bench/detection.py measured both).
    """
    both = candidates[(base[candidates] > 0) & (head[candidates] > 0)]
    total = float(base[both].sum())
    if total <= 0:
        return []
    ratios = head[both] / base[both]
    heavy = base[both] >= SCALE_MIN_WEIGHT * total
    middle = float(np.median(ratios[heavy] if heavy.any() else ratios))
    scales = [float(head[both].sum()) / total]
    if middle > 0:
        near = np.abs(np.log(ratios / middle)) <= np.log(SCALE_BAND)
        agreeing = float(base[both][near].sum())
        if agreeing > 0:
            scales.append(float(head[both][near].sum()) / agreeing)
    return scales


def _step_verdict(
    base_groups: Sequence[Sequence[int]],
    head_groups: Sequence[Sequence[int]],
    view: str,
    history: Sequence[float] | None,
) -> StepVerdict:
    """The step verdict from each side's captures' step lengths (one list per capture)."""
    noise_pct, source = noise.STEP_NOISE_PCT[view], noise.STEP_NOISE_SOURCE[view]
    if history is not None and len(history) >= noise.MIN_HISTORY:
        noise_pct, source = noise.history_step_noise_pct(history), f"{len(history)} earlier runs"
    base_ns = [n for g in base_groups for n in g]
    head_ns = [n for g in head_groups for n in g]
    shape = (len(base_groups), len(head_groups))
    if not base_ns or not head_ns:
        return StepVerdict(None, None, None, None, noise_pct, source, "unknown", None,
                           replicates=shape)  # fmt: skip
    if sum(shape) >= 3 and all(len(g) for g in [*base_groups, *head_groups]):
        earlier = history if history is not None and len(history) >= noise.MIN_HISTORY else ()
        return _replicate_step_verdict(base_groups, head_groups, earlier, noise_pct)
    b, h = np.asarray(base_ns, float), np.asarray(head_ns, float)
    b_med, h_med = float(np.median(b)), float(np.median(h))
    if b_med <= 0 or h_med <= 0:
        return StepVerdict(b_med / 1e6, h_med / 1e6, None, None, noise_pct, source, "unknown",
                           None, replicates=shape)  # fmt: skip
    change = 100 * (h_med / b_med - 1)
    if min(len(b), len(h)) < noise.MIN_STEPS:
        return StepVerdict(b_med / 1e6, h_med / 1e6, change, None, noise_pct, source, "unknown",
                           None, replicates=shape)  # fmt: skip
    # The bootstrap of each side's median, in log space; each side's resamples are seeded
    # by its own values, so that swapping base and head negates the interval exactly.
    log_rb = np.log(_bootstrap_medians(b))
    log_rh = np.log(_bootstrap_medians(h))
    lo, hi = (float(v) for v in np.percentile(log_rh - log_rb, [2.5, 97.5]))
    d, bound = math.log(h_med / b_med), math.log1p(noise_pct / 100)
    verdict: Verdict = "unchanged"
    if d > bound and lo > 0:
        verdict = "slower"
    elif d < -bound and hi < 0:
        verdict = "faster"
    interval = (100 * math.expm1(lo), 100 * math.expm1(hi))
    return StepVerdict(b_med / 1e6, h_med / 1e6, change, interval, noise_pct, source, verdict,
                       None, replicates=shape)  # fmt: skip


def _bootstrap_medians(values: np.ndarray) -> np.ndarray:
    seed = zlib.crc32(np.sort(values).tobytes()) ^ _RNG_SEED
    rng = np.random.default_rng(seed)
    return np.asarray(np.median(rng.choice(values, (BOOTSTRAP_RESAMPLES, len(values))), axis=1))


def _log_median_within(groups: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per capture: its log median step, and that median's variance its own steps show."""
    medians, within = [], []
    for group in groups:
        logs = np.log(np.maximum(np.asarray(group, float), 1.0))
        med = float(np.median(logs))
        sigma = _MAD_SIGMA * float(np.median(np.abs(logs - med)))
        medians.append(med)
        within.append((_MEDIAN_SE * sigma) ** 2 / len(logs))
    return np.asarray(medians), np.asarray(within)


def _replicate_step_verdict(
    base_groups: Sequence[Sequence[int]],
    head_groups: Sequence[Sequence[int]],
    history: Sequence[float] = (),
    floor_pct: float = 0.0,
) -> StepVerdict:
    """Student's t on the captures' log median steps (see the module doc); ``history``:
    earlier runs' median steps, whose spread joins the captures' (pooled, N - 1 more
    degrees of freedom). Below :data:`~exporter.analysis.compare.noise.MIN_STEP_DF`
    degrees of freedom a verdict must also pass ``floor_pct``, the one-capture floor."""
    mb, wb = _log_median_within(base_groups)
    mh, wh = _log_median_within(head_groups)
    nb, nh = len(mb), len(mh)
    earlier = np.log(np.maximum(np.asarray(history, float), 1.0))
    df = nb + nh - 2 + max(len(earlier) - 1, 0)
    sd = _pooled_sd([mb, mh, earlier], float(np.concatenate([wb, wh]).mean()))
    se = sd * math.sqrt(1 / nb + 1 / nh)
    d = float(mh.mean() - mb.mean())
    p = float(student_t_two_sided(d / se, df)) if se > 0 else (0.0 if d else 1.0)
    half = student_t_critical(0.05, df) * se
    detectable = max(
        100 * math.expm1(student_t_critical(noise.FDR_ALPHA, df) * se), noise.MIN_STEP_CHANGE_PCT
    )
    least = noise.MIN_STEP_CHANGE_PCT
    if df < noise.MIN_STEP_DF:
        least = max(least, floor_pct)
        detectable = max(detectable, floor_pct)
    verdict: Verdict = "unchanged"
    if p < noise.FDR_ALPHA and abs(d) >= math.log1p(least / 100):
        verdict = "slower" if d > 0 else "faster"
    b_ms, h_ms = math.exp(float(mb.mean())) / 1e6, math.exp(float(mh.mean())) / 1e6
    return StepVerdict(
        b_ms,
        h_ms,
        100 * math.expm1(d),
        (100 * math.expm1(d - half), 100 * math.expm1(d + half)),
        round(detectable, 2),
        f"measured between the {nb} + {nh} captures"
        + (f" and {len(earlier)} earlier runs" if len(earlier) else "")
        + " (Student's t on their log median steps"
        + (
            f"; with {df} degrees of freedom, also beyond the one-capture floor: 3 "
            "captures a side or 3 earlier runs lift it"
            if df < noise.MIN_STEP_DF
            else ""
        )
        + ")",
        verdict,
        None,
        replicates=(nb, nh),
        between_runs=True,
        p_value=p,
    )


def _pooled_sd(groups: Sequence[np.ndarray], within: float) -> float:
    """The standard deviation between captures (each group about its own mean, pooled),
    floored by the one of a capture's own statistic."""
    df = sum(max(len(g) - 1, 0) for g in groups)
    squares = sum(float(((g - g.mean()) ** 2).sum()) for g in groups if len(g))
    return math.sqrt(max(squares / df if df > 0 else 0.0, within))


def captures_needed(sd: float, target: float, alpha: float) -> int | None:
    """Fewest captures a side (n each) whose t test calls a change of ``target`` (same
    units as ``sd``, the standard deviation between captures) at ``alpha``."""
    if sd <= 0:
        return 2

    def enough(n: int) -> bool:
        return student_t_critical(alpha, 2 * n - 2) * sd * math.sqrt(2 / n) <= target

    if not enough(MAX_CAPTURES_NAMED):
        return None
    lo, hi = 1, MAX_CAPTURES_NAMED  # enough(hi); not known for lo (a side needs 2)
    while hi - lo > 1:  # the detectable change falls as n grows: bisect
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return max(2, hi)


def compare_sides(
    base: Side | Sequence[Side],
    head: Side | Sequence[Side],
    history: Sequence[float] | None = None,
    history_sides: Sequence[Side] = (),
) -> Comparison:
    """Compare ``head`` against ``base`` (see the module docstring).

    Each side is one :class:`Side` or a non-empty sequence of them, one per capture
    (process): replicates, whose spread is the noise between runs. ``history``: median
    step times (ns) of earlier runs of the same workload; with
    :data:`~exporter.analysis.compare.noise.MIN_HISTORY` or more, their spread replaces the
    measured step-time noise of the backend (one capture a side). ``history_sides``:
    earlier captures of the same workload, one per run; with
    :data:`~exporter.analysis.compare.noise.MIN_HISTORY` or more that hold steps, each
    frame's spread between them joins the replicates' (with one capture a side, from
    :data:`~exporter.analysis.compare.noise.MIN_HISTORY_ALONE`, it stands for it), only
    for the frames every one of them ran; their median steps are the step history when
    ``history`` is not given.
    """
    base_reps, head_reps = _replicates(base, "base"), _replicates(head, "head")
    if history is not None:  # a report's median may be missing, zero or not a number
        history = [float(m) for m in history if math.isfinite(m) and m > 0]
    first = base_reps[0]
    for side in [*base_reps[1:], *head_reps, *history_sides]:
        if side.kind != first.kind or side.scope != first.scope:
            raise ValueError(
                f"cannot compare {first.scope or first.kind} ({first.spec}) with "
                f"{side.scope or side.kind} ({side.spec})"
            )
    base, head = _pooled(base_reps), _pooled(head_reps)
    notes: list[str] = []
    per_step = bool(base.steps and head.steps)
    if per_step:
        tree = align(base.steps, head.steps)
        normalisation: Normalisation = "per_step"
        floor = None
    else:
        tree = align([base.whole], [head.whole])
        normalisation = "share"
        floor = (
            noise.MEMORY_NOISE_FLOOR_PTS if base.kind == "memory" else noise.SHARE_NOISE_FLOOR_PTS
        )
        missing = [s.spec for s in (base, head) if not s.steps]
        if base.kind != "memory":
            notes.append(
                f"no step markers on {' and '.join(missing)}: compared as shares of each side's "
                f"total; a change counts only beyond the noise floor of {floor:g} points "
                "measured between captures of the same workload"
            )
    # Replicates: every capture holds steps, and there are enough for a spread.
    replicated = (
        per_step
        and len(base_reps) + len(head_reps) >= 3
        and all(r.steps for r in [*base_reps, *head_reps])
    )
    earlier = [s for s in history_sides if s.steps] if per_step else []
    if len(earlier) < noise.MIN_HISTORY:
        if history_sides and per_step:
            notes.append(
                f"{len(earlier)} earlier runs with steps: fewer than {noise.MIN_HISTORY}, so "
                "their spread is not used"
            )
        earlier = []
    if history is None and earlier:
        history = [float(np.median(s.step_ns)) for s in earlier]
    if earlier and not replicated and len(earlier) < noise.MIN_HISTORY_ALONE:
        notes.append(
            f"{len(earlier)} earlier runs judge the step time; with one capture a side the "
            f"frames keep the fixed floors until {noise.MIN_HISTORY_ALONE} earlier runs (fewer "
            "named less than the floors do)"
        )
        earlier = []
    history_values = _History.aligned(tree, earlier) if earlier else None
    if history_values is not None:
        # Only frames every earlier run ran have a spread there (renamed ops after a
        # code change have none): most of the time compared must be such frames.
        weight = tree.base_self.mean(axis=1) + tree.head_self.mean(axis=1)
        held = float(weight[history_values.covered()].sum() / max(float(weight.sum()), 1e-300))
        if held < HISTORY_MIN_COVERAGE:
            notes.append(
                f"the {len(earlier)} earlier runs ran the frames of only {100 * held:.0f} % of "
                "this comparison's time (renamed ops, another build?): their spread is not used"
            )
            earlier, history_values = [], None
    # The frames' between-run noise is measured: by replicates, the history, or both.
    measured = replicated or bool(earlier and all(r.steps for r in [*base_reps, *head_reps]))
    if per_step and len(base_reps) + len(head_reps) >= 3 and not replicated:
        notes.append(
            "a capture without step markers: the captures are pooled, with no measured "
            "between-run noise"
        )
    verdict_possible = per_step and (
        measured or min(len(base.steps), len(head.steps)) >= noise.MIN_STEPS
    )
    if per_step and not verdict_possible:
        notes.append(
            f"{min(len(base.steps), len(head.steps))} steps on one side: fewer than "
            f"{noise.MIN_STEPS}, so no change is called significant"
        )
    view = _noise_view(base, head)
    step = None
    if per_step:
        groups = (
            ([r.step_ns for r in base_reps], [r.step_ns for r in head_reps])
            if replicated
            else ([base.step_ns], [head.step_ns])
        )
        step = _step_verdict(*groups, view, history)
        step.replicates = (len(base_reps), len(head_reps))
    bs, bt, hs, ht = tree.means()
    shares = {
        "bs": _shares_of(bs, bt),
        "bt": _shares(bt),
        "hs": _shares_of(hs, ht),
        "ht": _shares(ht),
    }
    d_self = shares["hs"] - shares["bs"]
    d_total = shares["ht"] - shares["bt"]
    frames = list(tree.walk())
    step_names = base.step_names | head.step_names
    waits = np.zeros(len(tree.frames), bool)
    # The host view of a capture (threads at the top); a pprof or Pyroscope side's top
    # frames are functions, not threads.
    host_view = base.kind == "host" and per_step
    # The scale is measured on all the work, XLA's pool threads included even in the
    # host view (where their ops are no candidates): a view's few host frames alone
    # would make the scale their own ratio and hide their change.
    not_work = np.zeros(len(tree.frames), bool)
    for frame in frames:
        waits[frame.index] = is_wait(frame, step_names, host_view)
        not_work[frame.index] = (
            is_wait(frame, step_names, host_view, pool_threads=False)
            if host_view
            else waits[frame.index]
        )
    phases = np.zeros(len(tree.frames), bool)
    for frame in frames:
        phases[frame.index] = is_host_phase(frame)
    work = np.flatnonzero(~not_work)
    work = work[work > 0]
    base_step_ns = float(np.median(base.step_ns)) if per_step and base.step_ns else 0.0
    if step is not None and step.base_median_ms is not None:
        base_step_ns = step.base_median_ms * 1e6  # one number: the verdict's own
    head_step_ns = float(np.median(head.step_ns)) if per_step and head.step_ns else 0.0
    if step is not None and step.head_median_ms is not None:
        head_step_ns = step.head_median_ms * 1e6
    # "Changed" by the scale (see scale_of) is by the floor that the verdicts use.
    floor_pct = noise.REPLICATE_MIN_STEP_PCT if measured else noise.MIN_GROWN_STEP_PCT[view]

    def scale_of(reference: np.ndarray, other: np.ndarray, other_step: float) -> float | None:
        def changed(k: float) -> int:
            # Fewest frames changed by the floor's time; on a tie the first (all the
            # common work) is kept: measured the steadier on loaded CPU captures.
            floor_ns = floor_pct / 100 * other_step
            return int((np.abs(other[work] - k * reference[work]) >= floor_ns).sum())

        scales = _scales(reference, other, work)
        return min(scales, key=changed) if scales else None

    scale = None
    if per_step and base_step_ns > 0:
        # Found both ways and met in the middle, so that read backwards the scale is its
        # inverse: each way alone weighs the frames by its own base and picks by its own
        # step, and 4 of 25 pairs of one capture a side got verdicts that did not mirror.
        forward = scale_of(bs, hs, head_step_ns or base_step_ns)
        backward = scale_of(hs, bs, base_step_ns)
        if forward is not None and backward is not None:
            scale = math.sqrt(forward / backward)
        else:
            scale = forward if backward is None else 1 / backward
    s = scale if scale is not None else 1.0
    expected_step = s * base_step_ns  # what step_pct shows a share of
    # What the floors are judged against: the geometric mean of the base step at the
    # head's speed and the head's own, so that read backwards a change is the same
    # share, negated. Of the base step alone, a loop grown by 10 % of the step was a
    # verdict in 20 % of comparisons forward and none backward at one capture a side
    # (the grown side's longer step made its share smaller; bench/frame_history.py).
    judged_step = expected_step
    if expected_step > 0 and head_step_ns > 0:
        judged_step = math.sqrt(expected_step * head_step_ns)
    # Excess per frame and basis: head minus the base scaled to the head's speed.
    ex_self, ex_total = hs - s * bs, ht - s * bt
    # A total is the sum of its frames less its waits: a program's own excess.
    wait_self = np.where(waits, 1.0, 0.0)
    if per_step:
        wait_base_total, wait_head_total = _subtree_sums(tree, bs * wait_self, hs * wait_self)
        ex_total = (ht - wait_head_total) - s * (bt - wait_base_total)
    new_self = tree.base_self.max(axis=1) == 0
    new_total = tree.base_total.max(axis=1) == 0
    gone_self = tree.head_self.max(axis=1) == 0
    gone_total = tree.head_total.max(axis=1) == 0
    tests: dict[tuple[str, int], tuple[float, float, float]] = {}
    small = min(noise.MIN_NEW_STEP_PCT[view], noise.MIN_GROWN_STEP_PCT[view]) / 2
    if measured:
        # Between captures the floor is low and the test's degrees of freedom few: only
        # frames that could be verdicts are tested, so that BH divides alpha among them.
        small = min(noise.MIN_NEW_STEP_PCT[view], noise.REPLICATE_MIN_STEP_PCT)
    detect_rows: tuple[np.ndarray, np.ndarray] | None = None
    if per_step and expected_step > 0:
        # Only frames that could be large are tested: the others cannot be regressions,
        # and testing them would weaken the correction across frames.
        def could(excess: np.ndarray) -> np.ndarray:
            rows = np.flatnonzero(np.abs(excess) / judged_step * 100 >= small)
            return rows[~waits[rows] & (rows > 0)]

        eligible_self, eligible_total = could(ex_self), could(ex_total)
        eligible_total = np.asarray(
            [i for i in eligible_total.tolist() if tree.frames[i].children], np.int64
        )
        if measured:
            # Between runs a frame is judged against the rest of its capture's work. A
            # subtree holding most of the work on both sides has the smaller part as its
            # rest, whose change reads as its own (a data phase +15 % made the program
            # beside it "-21 %", a verdict in 17 of 60 orientations with a history;
            # bench/frame_history.py): its own frames and the step verdict judge it. A
            # single frame is still judged, however large (its rest is many frames).
            work_b, work_h = float(bs[work].sum()), float(hs[work].sum())
            share = np.minimum(bt / max(work_b, 1e-300), ht / max(work_h, 1e-300))
            held = (share > MAJORITY_SHARE) & ~(new_total | gone_total)
            eligible_total = eligible_total[~held[eligible_total]]
            between = _ReplicateValues(tree, base_reps, head_reps, work, history_values)
            heavy = work[bs[work] >= SCALE_MIN_WEIGHT * bs[work].sum()]
            result = between.tests(eligible_self, eligible_total)
            # Work found changed is set aside from every other frame's rest, and the
            # frames tested again: a loop grown by 10 % of the step, part of every other
            # op's rest, made them look faster, and an op beside it was a verdict in 10
            # of 48 comparisons at 4 captures a side (0 set aside; bench/frame_history.py).
            called = result.q_values[: len(eligible_self)] < noise.FDR_ALPHA
            big = np.abs(ex_self[eligible_self]) / judged_step * 100 >= small
            changed = np.zeros(len(tree.frames), bool)
            changed[eligible_self[called & big]] = True
            if changed.any():
                between = _ReplicateValues(
                    tree, base_reps, head_reps, work, history_values, changed
                )
            # How much wider today's captures spread than the history said, measured on
            # the frames once the changed work is set aside (before, its move was every
            # other frame's, and the inflation hid the change itself).
            # The frames both sides hold 1 % of the work or more: chosen alike both ways.
            both = (bs + hs)[work]
            inflation = between.inflation(work[both >= SCALE_MIN_WEIGHT * both.sum()])
            if inflation < INFLATION_MIN:  # within what chance moves a median of few t²
                inflation = 1.0
            if changed.any() or inflation > 1:
                result = between.tests(eligible_self, eligible_total, inflation)
            if inflation > INFLATION_NOTED:
                notes.append(
                    f"today's captures spread x{math.sqrt(inflation):.2f} wider than the "
                    f"{len(earlier)} earlier runs did: their spread is widened to match"
                )
            # New (or removed) work is absent from every capture of one side: no run of
            # that side has it to vary, so its steps are the samples, as with one capture
            # a side (where new work had no false alarm, bench/detection.py).
            appeared = np.concatenate(
                [
                    (new_self | gone_self)[eligible_self],
                    (new_total | gone_total)[eligible_total],
                ]
            )
            if appeared.any():
                rows = np.flatnonzero(appeared)
                pooled = noise.rank_tests(
                    np.concatenate(
                        [tree.base_self[eligible_self], tree.base_total[eligible_total]]
                    )[rows],
                    np.concatenate(
                        [tree.head_self[eligible_self], tree.head_total[eligible_total]]
                    )[rows]
                    / s,
                    np.arange(len(rows)),
                )
                p_values, effects = result.p_values.copy(), result.effects.copy()
                p_values[rows], effects[rows] = pooled.p_values, pooled.effects
                result = noise.RankTests(
                    result.rows, p_values, benjamini_hochberg(p_values), effects
                )
            detect_rows = between.spread(heavy, inflation)
        else:
            base_m = np.concatenate(
                [tree.base_self[eligible_self], tree.base_total[eligible_total]]
            )
            head_m = (
                np.concatenate([tree.head_self[eligible_self], tree.head_total[eligible_total]]) / s
            )
            result = noise.rank_tests(base_m, head_m, np.arange(len(base_m)))
        n = len(eligible_self)
        for k, row in enumerate(eligible_self.tolist()):
            tests[("self", row)] = (result.p_values[k], result.q_values[k], result.effects[k])
        for k, row in enumerate(eligible_total.tolist()):
            tests[("total", row)] = (
                result.p_values[n + k],
                result.q_values[n + k],
                result.effects[n + k],
            )
    step_change_ns = (
        (step.head_median_ms - step.base_median_ms) * 1e6
        if step and step.head_median_ms is not None and step.base_median_ms is not None
        else 0.0
    )
    beyond_noise = step is not None and step.verdict in ("slower", "faster")

    def entry(frame: DiffFrame, basis: Literal["self", "total"]) -> Entry:
        i = frame.index
        before, after = (bs[i], hs[i]) if basis == "self" else (bt[i], ht[i])
        delta = d_self[i] if basis == "self" else d_total[i]
        excess = float(ex_self[i] if basis == "self" else ex_total[i])
        is_new = bool(new_self[i] if basis == "self" else new_total[i])
        is_gone = bool(gone_self[i] if basis == "self" else gone_total[i])
        relative = None if before == 0 else float((after - s * before) / (s * before))
        test = tests.get((basis, i))
        # A thread's (or a wait's) total is no work of its own: its frames are judged.
        wait = bool(waits[i]) and (basis == "self" or len(frame.stack()) <= 2)
        step_pct = 100 * excess / expected_step if expected_step > 0 else 0.0
        judged_pct = 100 * excess / judged_step if judged_step > 0 else 0.0
        if per_step:
            significant = bool(verdict_possible and test is not None and test[1] < noise.FDR_ALPHA)
            sign = 1.0 if excess > 0 else -1.0
            # New work read backwards is removed work: the same floor, so that swapping
            # base and head mirrors the verdict.
            appeared = is_new if sign > 0 else is_gone
            if measured:
                floor_pct = (
                    noise.MIN_NEW_STEP_PCT[view] if appeared else noise.REPLICATE_MIN_STEP_PCT
                )
            else:
                floor_pct = (
                    noise.MIN_NEW_STEP_PCT[view]
                    if appeared
                    else noise.MIN_GROWN_STEP_PCT[HOST_PHASE if phases[i] else view]
                )
            # Of its own time, in ratio terms both ways (x1.1 grown is x1/1.1 shrunk).
            ratio = None if before == 0 or after == 0 else float(after / (s * before))
            # Judged beyond the machine's scale both ways alike: an improvement needed
            # fewer ms than the base as well, a regression no more ms, so a grown loop
            # between processes of different speeds was named 96 % forward and 12 %
            # read backwards (bench/detection.py, 8 a side, issue 29's "both
            # orientations alike").
            large = bool(
                not wait
                and sign * judged_pct >= floor_pct
                and (ratio is None or abs(math.log(ratio)) >= math.log1p(noise.MIN_RELATIVE_CHANGE))
                and (test is None or sign * test[2] > 0)
            )
        else:
            assert floor is not None
            significant = bool(abs(delta) >= floor)
            large = significant and not wait
            if base.kind == "memory":
                # Bytes in use compare as they are (no length to normalise away): a share
                # that fell only because the other side allocated more is no change.
                sign = 1.0 if delta > 0 else -1.0
                rel = None if before == 0 else float((after - before) / before)
                large = large and (rel is None or sign * rel >= noise.MIN_RELATIVE_CHANGE)
        values = {
            "self_base": bs[i],
            "self_head": hs[i],
            "total_base": bt[i],
            "total_head": ht[i],
            "self_base_pct": shares["bs"][i],
            "self_head_pct": shares["hs"][i],
            "total_base_pct": shares["bt"][i],
            "total_head_pct": shares["ht"][i],
        }
        ms = 1e-6 if tree.unit == "nanoseconds" else 1.0
        return Entry(
            frame,
            basis,
            values,
            float(d_self[i]),
            float(d_total[i]),
            relative,
            significant,
            significant and large,
            None if test is None else float(test[0]),
            None if test is None else float(test[1]),
            None if test is None else float(test[2]),
            base_ms=float(before) * ms,
            head_ms=float(after) * ms,
            excess_ms=excess * ms if per_step else float(after - before) * ms,
            step_pct=step_pct,
            # Only a step change beyond noise is explained: a share of noise is noise.
            explains_pct=100 * excess / step_change_ns if step_change_ns and beyond_noise else None,
            new=is_new,
            wait=wait,
        )

    key_self = ex_self if per_step else d_self
    key_total = ex_total if per_step else d_total
    rank_by: Callable[[Entry], float] = (
        (lambda e: e.excess_ms) if per_step else (lambda e: e.delta_pts)
    )
    regressions = _ranked(frames, key_self, key_total, entry, rank_by, grow=True)
    # An improvement: with steps, work that shrank beyond the machine's scale (the mirror
    # of a regression; its ms may have grown on a slower machine: excess_ms says by how
    # much it beat the scale); as shares, a frame that took less.
    if per_step:
        shrank_self, shrank_total = np.minimum(ex_self, 0.0), np.minimum(ex_total, 0.0)
    else:
        shrank_self, shrank_total = np.minimum(hs - bs, 0.0), np.minimum(ht - bt, 0.0)
    improvements = _ranked(
        frames,
        np.where(shrank_self < 0, key_self, 0.0),
        np.where(shrank_total < 0, key_total, 0.0),
        entry,
        rank_by,
        grow=False,
    )
    if step is not None:
        step.scale = scale
        if beyond_noise and step_change_ns:
            # What the verdicts explain, in the change's own direction (mirrored).
            listed = regressions if step_change_ns > 0 else improvements
            explained = sum(e.excess_ms for e in _outermost([e for e in listed if e.regression]))
            step.explained_pct = 100 * explained * 1e6 / step_change_ns
            step.uniform = step.explained_pct < 100 * UNIFORM_UNEXPLAINED
        waited = [e for e in regressions if e.wait and e.step_pct >= small]
        if waited:
            notes.append(
                "runtime waits left out of the verdicts (their time is the work they wait "
                f"on): {', '.join(sorted({e.frame.name for e in waited})[:4])}"
            )
    if per_step and not measured:
        notes.append(
            "one capture a side: no measured between-run noise, fixed floors stand in for it "
            "(give several captures a side, or 8 or more earlier runs as history, to measure it)"
        )
    comparison = Comparison(
        base.kind,
        normalisation,
        base,
        head,
        tree,
        regressions,
        improvements,
        floor,
        verdict_possible,
        notes,
        tests,
        step
        if step is not None
        else StepVerdict(None, None, None, None, 0.0, "no steps", "unknown", None),
    )
    comparison.base_replicates, comparison.head_replicates = base_reps, head_reps
    comparison.replicated = replicated
    comparison.history_runs = len(earlier) if measured else 0
    comparison.min_detectable = _min_detectable(
        comparison, expected_step, view, detect_rows, [s.step_ns for s in earlier]
    )
    return comparison


def _replicates(sides: Side | Sequence[Side], role: str) -> list[Side]:
    if isinstance(sides, Side):
        return [sides]
    out = list(sides)
    if not out:
        raise ValueError(f"no {role} side: expected one capture or more")
    return out


def _pooled(reps: list[Side]) -> Side:
    """The replicates' steps and graphs as one side (each replicate left as it was)."""
    if len(reps) == 1:
        return reps[0]
    first = reps[0]
    whole = first.whole.copy()
    for rep in reps[1:]:
        whole.merge(rep.whole)
    sources = {r.step_source for r in reps}
    notes = [n for r in reps for n in r.notes]
    return Side(
        " + ".join(r.spec for r in reps),
        "replicates",
        first.kind,
        whole,
        [g for r in reps for g in r.steps],
        [n for r in reps for n in r.step_ns],
        first.step_source if len(sources) == 1 else "mixed",
        [f for r in reps for f in r.files],
        list(dict.fromkeys(notes)),
        view=max((r.view for r in reps), key=lambda v: noise.MIN_GROWN_STEP_PCT.get(v, 0.0)),
        scope=first.scope,
        step_names=set().union(*(r.step_names for r in reps)),
    )


@dataclass
class _History:
    """Earlier captures of the workload, their per-step values on the tree's rows (a
    frame they never ran is 0; what only they ran is left out)."""

    sides: list[Side]
    self_m: np.ndarray
    total_m: np.ndarray

    @classmethod
    def aligned(cls, tree: AlignedTree, sides: list[Side]) -> _History:
        # align() wants a head: the first step again, whose column goes unused.
        own = align([g for s in sides for g in s.steps], [sides[0].steps[0]])
        rows = _rows_in(tree, own)
        found = rows >= 0
        self_m = np.zeros((len(tree.frames), own.base_self.shape[1]))
        total_m = np.zeros_like(self_m)
        self_m[found], total_m[found] = own.base_self[rows[found]], own.base_total[rows[found]]
        return cls(sides, self_m, total_m)

    def covered(self) -> np.ndarray:
        """Per row: whether every earlier capture ran the frame (its own time > 0)."""
        bounds = np.cumsum([0, *(len(s.steps) for s in self.sides)])
        means = np.stack(
            [self.self_m[:, a:b].mean(axis=1) for a, b in itertools.pairwise(bounds)], axis=1
        )
        return np.asarray((means > 0).all(axis=1))


def _holders(tree: AlignedTree, row: int) -> list[int]:
    """The rows of ``row``'s frame and of every frame holding it (the root included)."""
    out: list[int] = []
    node: DiffFrame | None = tree.frames[row]
    while node is not None:
        out.append(node.index)
        node = node.parent
    return out


def _rows_in(tree: AlignedTree, other: AlignedTree) -> np.ndarray:
    """For each frame of ``tree``, the row of the same stack in ``other`` (-1: absent)."""
    out = np.full(len(tree.frames), -1, np.int64)
    out[0] = 0
    stack = [(tree.root, other.root)]
    while stack:
        mine, theirs = stack.pop()
        for key, child in mine.children.items():
            match = theirs.children.get(key)
            if match is not None:
                out[child.index] = match.index
                stack.append((child, match))
    return out


class _ReplicateValues:
    """Each frame's time per step in each capture, at one common speed and in log space:
    a capture's means divided by that capture's own speed, their logs, and the variance
    of each log mean that the capture's own steps show (delta method).

    A capture's speed, for a frame, is the rest of its work: all the work of that capture
    but the frame (its subtree for a total), against the same in the reference, every
    capture of both sides together. Leave-one-out, because a frame's verdict asks
    whether it moved against everything else the process did: its own change stays out
    of its denominator (a machine-wide scale that held it shrank a grown loop's change,
    one of frames' consensus was noisy: at 4 captures a side an op grown by 10 % of the
    step was named in 71-79 % of orientations, the data phase +10 % in 67-71 %; leaving
    the frame out, 96-100 % and 96 %, false verdicts unchanged, bench/detection.py); the
    common reference, because then the side called the base changes nothing (a change
    read backwards gets the same test, ``tests/unit/test_replicate_mirror.py``).

    ``changed`` frames (found changed by a first pass) are taken out of every other
    frame's rest: a frame that changed would otherwise move everyone's speed, and the
    frames beside it would read as changed the other way. ``history``: earlier captures
    of the workload, whose values give the spread only (:func:`compare_sides`).

    Logs, because what varies between processes multiplies: a frame's time moves by a
    share of itself (measured: a grown loop whose size varied x3 between its captures
    was p = 0.13 in ms and every head capture above every base one). A frame's time is
    floored at :data:`LOG_FLOOR_STEP_FRACTION` of the step, so that frames near zero do
    not swing in log space.
    """

    def __init__(
        self,
        tree: AlignedTree,
        base_reps: list[Side],
        head_reps: list[Side],
        work: np.ndarray,
        history: _History | None = None,
        changed: np.ndarray | None = None,
    ) -> None:
        self.tree = tree
        self.sides: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        blocks: dict[str, tuple[np.ndarray, np.ndarray, list[slice], np.ndarray, np.ndarray]] = {}
        parts = [
            ("base", base_reps, tree.base_self, tree.base_total),
            ("head", head_reps, tree.head_self, tree.head_total),
        ]
        if history is not None:
            parts.append(("history", history.sides, history.self_m, history.total_m))
        for name, reps, self_m, total_m in parts:
            bounds = np.cumsum([0, *(len(r.steps) for r in reps)])
            cols = [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
            means_s = np.stack([self_m[:, c].mean(axis=1) for c in cols], axis=1)
            means_t = np.stack([total_m[:, c].mean(axis=1) for c in cols], axis=1)
            blocks[name] = (self_m, total_m, cols, means_s, means_t)
        # The reference is both sides' captures alone: the history only measures spread.
        every = {k: np.concatenate([blocks["base"][k], blocks["head"][k]], axis=1) for k in (3, 4)}
        ref_self, ref_total = every[3].mean(axis=1), every[4].mean(axis=1)
        ref_work = float(ref_self[work].sum())
        self.eps = max(LOG_FLOOR_STEP_FRACTION * ref_work, 1e-12)

        def rest(frame: np.ndarray, all_work: np.ndarray | float) -> np.ndarray:
            # The work but the frame's; at least 5 % of it (a total holding nearly all the
            # work, or its waits, would leave nothing to compare against).
            return np.asarray(
                np.maximum(all_work - np.minimum(frame, 0.95 * all_work), 0.05 * all_work)
            )

        ref_rest_s, ref_rest_t = rest(ref_self, ref_work), rest(ref_total, ref_work)
        # Frames found changed are no part of another frame's rest (see the class doc).
        set_aside = [int(x) for x in np.flatnonzero(changed)] if changed is not None else []
        holders = {x: _holders(tree, x) for x in set_aside}
        for name, (self_m, total_m, cols, means_s, means_t) in blocks.items():
            captured = means_s[work].sum(axis=0)[None, :]  # each capture's work per step
            rest_s, rest_t = rest(means_s, captured), rest(means_t, captured)
            ref_s, ref_t = ref_rest_s.copy(), ref_rest_t.copy()
            for x in set_aside:
                others = np.ones(len(tree.frames), bool)
                others[x] = False
                inside = others.copy()
                inside[holders[x]] = False  # a total holding x already left x out
                rest_s[others] -= means_s[x]
                ref_s[others] -= ref_self[x]
                rest_t[inside] -= means_s[x]
                ref_t[inside] -= ref_self[x]
            floor_c, floor_r = 0.05 * captured, 0.05 * ref_work
            rest_s, rest_t = np.maximum(rest_s, floor_c), np.maximum(rest_t, floor_c)
            ref_s, ref_t = np.maximum(ref_s, floor_r), np.maximum(ref_t, floor_r)

            def logged(
                m: np.ndarray, means: np.ndarray, speed: np.ndarray, cols: list[slice] = cols
            ) -> tuple[np.ndarray, np.ndarray]:
                level = means / speed + self.eps
                var = np.stack(
                    [
                        m[:, c].var(axis=1, ddof=1) / (c.stop - c.start)
                        if c.stop - c.start > 1
                        else np.zeros(len(m))
                        for c in cols
                    ],
                    axis=1,
                )
                return np.log(level), var / speed**2 / level**2

            ls, ws = logged(self_m, means_s, rest_s / ref_s[:, None])
            lt, wt = logged(total_m, means_t, rest_t / ref_t[:, None])
            self.sides[name] = (ls, lt, ws, wt)
        # The rows the earlier runs all ran: only there does their spread count.
        everywhere = np.ones(len(tree.frames), bool)
        self.covered_self, self.covered_total = everywhere, everywhere
        if "history" in blocks:
            _, _, _, hist_s, hist_t = blocks["history"]
            self.covered_self = np.asarray((hist_s > 0).all(axis=1))
            self.covered_total = np.asarray((hist_t > 0).all(axis=1))

    def between_variances(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the variance between captures of its log self time (both sides' and,
        where the earlier runs all ran it, the history's pooled), and its degrees of
        freedom."""
        history = self.sides["history"][0][rows] if "history" in self.sides else None
        base, head = self.sides["base"][0][rows], self.sides["head"][0][rows]
        return noise.between_variance(base, head, history, self.covered_self[rows])

    def inflation(self, rows: np.ndarray) -> float:
        """With a history: how much wider today's captures spread than the pooled
        variance says, from the t of the ``rows`` (the heavy frames the earlier runs
        all ran; :func:`exporter.analysis.compare.noise.inflation`); 1 without."""
        if "history" not in self.sides:
            return 1.0
        rows = rows[self.covered_self[rows]]
        (bm, _, bw, _), (hm, _, hw, _) = self.sides["base"], self.sides["head"]
        between, df = self.between_variances(rows)
        within = np.concatenate([bw[rows], hw[rows]], axis=1).mean(axis=1)
        nb, nh = bm.shape[1], hm.shape[1]
        se = np.sqrt(np.maximum(between, within) * (1 / nb + 1 / nh))
        diff = hm[rows].mean(axis=1) - bm[rows].mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = diff / se
        return noise.inflation(t, int(df.max()) if len(df) else 0)

    def tests(
        self, rows_self: np.ndarray, rows_total: np.ndarray, inflation: float = 1.0
    ) -> noise.RankTests:
        def stacked(name: str) -> tuple[np.ndarray, np.ndarray]:
            ms, mt, ws, wt = self.sides[name]
            return (
                np.concatenate([ms[rows_self], mt[rows_total]]),
                np.concatenate([ws[rows_self], wt[rows_total]]),
            )

        (b, bw), (h, hw) = stacked("base"), stacked("head")
        earlier = stacked("history")[0] if "history" in self.sides else None
        covered = np.concatenate([self.covered_self[rows_self], self.covered_total[rows_total]])
        return noise.replicate_tests(b, h, bw, hw, earlier, covered, inflation)

    def spread(self, rows: np.ndarray, inflation: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the between-capture standard deviation of its log time per step, and
        its time per step (ns, the base captures' geometric mean, at the speed of both
        sides' captures together)."""
        (bm, _, bw, _), (_, _, hw, _) = self.sides["base"], self.sides["head"]
        between, _ = self.between_variances(rows)
        bm = bm[rows]
        within = np.concatenate([bw[rows], hw[rows]], axis=1).mean(axis=1)
        return np.sqrt(np.maximum(between, within) * inflation), np.exp(bm.mean(axis=1))


def _min_detectable(
    comparison: Comparison,
    expected_step_ns: float,
    view: str,
    frame_spread: tuple[np.ndarray, np.ndarray] | None,
    earlier: Sequence[Sequence[int]],
) -> dict[str, Any]:
    """The smallest step change and frame excess these captures could call (see the
    module doc), and the captures a side that would bring them to 5 %. ``earlier``:
    the step lengths of each earlier run whose spread the frames were judged with."""
    step = comparison.step_verdict
    measured = comparison.measured
    nb, nh = len(comparison.base_replicates), len(comparison.head_replicates)
    out: dict[str, Any] = {
        "false_alarm_rate": noise.FDR_ALPHA,
        "captures": [nb, nh],
        "history_runs": comparison.history_runs,
        "between_run_noise": "measured" if measured else "not measured",
        "step_change_pct": None,
        "frame_excess_ms": None,
        "frame_excess_pct": None,
        "new_frame_excess_pct": None,
        "captures_for_5pct": {"step": None, "frame": None},
        "basis": "",
    }
    if comparison.normalisation != "per_step" or expected_step_ns <= 0:
        out["basis"] = "no steps on both sides: no time per step to detect"
        return out
    new_pct = noise.MIN_NEW_STEP_PCT[view]
    out["new_frame_excess_pct"] = new_pct
    if not measured:
        step_pct = step.noise_pct
        if step.interval_pct is not None:
            step_pct = max(step_pct, (step.interval_pct[1] - step.interval_pct[0]) / 2)
        frame_pct = noise.MIN_GROWN_STEP_PCT[view]
        out |= {
            "step_change_pct": round(step_pct, 2),
            "frame_excess_pct": frame_pct,
            "frame_excess_ms": round(frame_pct / 100 * expected_step_ns / 1e6, 4),
            "basis": "one capture a side: the fixed floors of the "
            f"{view} view stand in for the unmeasured between-run noise; give 2 or more "
            "captures a side (or 8 or more earlier runs as history) to measure it",
        }
        return out
    df = nb + nh - 2 + max(len(earlier) - 1, 0)
    # Beyond BEYOND_REACH_PCT a figure says only "not with these captures": null, and
    # captures_for_5pct says what would do.
    out["step_change_pct"] = step.noise_pct if step.noise_pct <= BEYOND_REACH_PCT else None
    m = max(1, 0 if frame_spread is None else len(frame_spread[0]))
    alpha = noise.FDR_ALPHA / m  # the first rejection of BH among m frames
    groups = [
        _log_median_within(g)
        for g in ([r.step_ns for r in comparison.base_replicates],
                  [r.step_ns for r in comparison.head_replicates], earlier)
    ]  # fmt: skip
    step_sd = _pooled_sd(
        [g[0] for g in groups], float(np.concatenate([g[1] for g in groups]).mean())
    )
    target = TARGET_DETECTABLE_PCT / 100
    out["captures_for_5pct"]["step"] = captures_needed(step_sd, math.log1p(target), noise.FDR_ALPHA)
    if frame_spread is not None and len(frame_spread[0]):
        sd_log, level = frame_spread
        # Per frame: the smallest excess its own spread lets the test call.
        factor = student_t_critical(alpha, df) * math.sqrt(1 / nb + 1 / nh)
        excesses = level * np.expm1(factor * sd_log)
        k = int(np.argsort(excesses)[len(excesses) // 2])  # the median frame
        excess = max(float(excesses[k]), noise.REPLICATE_MIN_STEP_PCT / 100 * expected_step_ns)
        if 100 * excess / expected_step_ns <= BEYOND_REACH_PCT:
            out |= {
                "frame_excess_ms": round(excess / 1e6, 4),
                "frame_excess_pct": round(100 * excess / expected_step_ns, 2),
            }
        out["captures_for_5pct"]["frame"] = captures_needed(
            float(sd_log[k]), math.log1p(target * expected_step_ns / float(level[k])), alpha
        )
    between = f"the {nb} + {nh} captures"
    if comparison.history_runs:
        between += f" and the workload's {comparison.history_runs} earlier runs"
    out["basis"] = (
        f"measured between {between} at a false-alarm rate of "
        f"{noise.FDR_ALPHA:g}; a frame's figure is the median over the {m} frames "
        f"holding {100 * SCALE_MIN_WEIGHT:g} % of the work or more (BH among them)"
    )
    return out


def _subtree_sums(
    tree: AlignedTree, base: np.ndarray, head: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per frame, the sum of ``base``/``head`` over its subtree (itself included)."""
    out_b, out_h = base.copy(), head.copy()
    for frame in reversed(list(tree.walk())):  # children before parents
        if frame.parent is not None:
            out_b[frame.parent.index] += out_b[frame.index]
            out_h[frame.parent.index] += out_h[frame.index]
    return out_b, out_h


def _shares_of(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    root = totals[0]
    return 100 * values / root if root > 0 else np.zeros_like(values)


def _outermost(entries: list[Entry]) -> list[Entry]:
    """Entries not inside another listed total entry (each time counted once)."""
    return [
        e
        for e in entries
        if not any(
            o is not e
            and o.basis == "total"
            and _within(e.frame, o.frame)
            and (e.basis == "self" or e.frame is not o.frame)
            for o in entries
        )
    ]


def _ranked(
    frames: list[DiffFrame],
    d_self: np.ndarray,
    d_total: np.ndarray,
    entry: Callable[[DiffFrame, Literal["self", "total"]], Entry],
    key: Callable[[Entry], float],
    grow: bool,
) -> list[Entry]:
    sign = 1.0 if grow else -1.0
    moved = [f for f in frames if sign * d_self[f.index] > 0]
    moved.sort(key=lambda f: -sign * d_self[f.index])
    self_entries = [entry(f, "self") for f in moved[:MAX_ENTRIES]]
    explainers = [e for e in self_entries if e.regression]
    total_entries: list[Entry] = []
    # Deepest frames first, so that a subtree already listed explains its ancestors.
    for frame in reversed(frames):
        if not frame.children or sign * d_total[frame.index] <= 0:
            continue
        candidate = entry(frame, "total")
        if not candidate.regression:
            continue
        inside = [
            e
            for e in explainers
            if _within(e.frame, frame) and (e.basis == "self" or e.frame is not frame)
        ]
        explained = sum(sign * key(e) for e in _outermost(inside))
        if explained < UNEXPLAINED_FRACTION * sign * key(candidate):
            total_entries.append(candidate)
            explainers.append(candidate)
    ordered = [*self_entries, *total_entries]
    ordered.sort(key=lambda e: (not e.regression, -sign * key(e)))
    return ordered


def _within(node: DiffFrame, ancestor: DiffFrame) -> bool:
    """Whether ``node`` is ``ancestor`` or below it."""
    probe: DiffFrame | None = node
    while probe is not None:
        if probe is ancestor:
            return True
        probe = probe.parent
    return False
