"""Compare two sides: which frames grew or shrank, by how much, and is it real.

Normalisation: ``per_step`` when both sides have step markers (every value is the
frame's mean time per step cycle, and every step is a sample for
:mod:`exporter.analysis.noise`); ``share`` otherwise (every value is the side's whole
value, and only shares of each side's total are compared).

Denominator: a frame's share is of **its own side's total** (the root: all device time,
all host thread time, or all bytes in use; per step in ``per_step``), as Grafana's diff
colours compare each side's share of its own total. ``delta_*_pts`` is head share minus
base share, in percentage points; the sign is always head - base.

Entries (``regressions`` grow, ``improvements`` shrink) come in two bases: ``self``
(the frame's own time moved: the usual answer, "``fusion.2`` self grew from 4 % to
29 %") and ``total`` (the frame's subtree moved while no frame below it explains at
least half of the move, e.g. growth spread over many small children). Each list is
ordered by importance: regressions (large and significant) first, by how many points
they moved, then the other changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from exporter.analysis import noise
from exporter.analysis.diff import AlignedTree, DiffFrame, align
from exporter.analysis.sides import Side

__all__ = ["DEFAULT_TOP", "Comparison", "Entry", "compare_sides"]

DEFAULT_TOP: Final = 20
# A "total" entry is listed when the self entries below it explain less than this
# fraction of its total's move.
UNEXPLAINED_FRACTION: Final = 0.5
# Files of installed packages and the interpreter: not a user's allocation site.
_LIBRARY_FILE = re.compile(r"(site-packages|dist-packages|/lib/python\d|<frozen|^<)")
# Entries kept per list (the JSON shows ``top`` of them; the CI gate looks at all).
MAX_ENTRIES: Final = 200

Normalisation = Literal["per_step", "share"]


@dataclass
class Entry:
    """One frame's change (the JSON object of ``regressions``/``improvements``)."""

    frame: DiffFrame
    basis: Literal["self", "total"]
    values: dict[str, float]  # self_base, self_head, total_base, total_head and *_pct
    delta_self_pts: float
    delta_total_pts: float
    relative_change: float | None  # of the basis value's mean per step; None: new frame
    significant: bool
    regression: bool  # large and significant (an improvement when it shrank)
    p_value: float | None
    q_value: float | None
    effect: float | None

    @property
    def delta_pts(self) -> float:
        return self.delta_self_pts if self.basis == "self" else self.delta_total_pts

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
    """Both sides, their aligned tree, and every frame's change."""

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

    @property
    def min_delta_pts(self) -> float:
        """How many points of share a change needs to be large, for these two sides."""
        return noise.MIN_DELTA_PTS[_noise_view(self.base, self.head)]

    @property
    def top_regression(self) -> Entry | None:
        """The most important regression that is large and significant, if any."""
        return next((e for e in self.regressions if e.regression), None)

    def step_time(self) -> dict[str, float | None]:
        def mean(values: list[int]) -> float | None:
            return float(np.mean(values)) if values else None

        base, head = mean(self.base.step_ns), mean(self.head.step_ns)
        change = 100 * (head - base) / base if base and head is not None else None
        return {"base_mean_ns": base, "head_mean_ns": head, "change_pct": change}

    def failing(self, threshold_pts: float) -> list[Entry]:
        """Significant regressions whose self share grew by more than ``threshold_pts``."""
        return [e for e in self.regressions if e.significant and e.delta_self_pts > threshold_pts]

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        base, head = self.base.describe(), self.head.describe()
        means = self.tree.means()
        base["total"], head["total"] = _num(means[1][0]), _num(means[3][0])
        base["whole_total"], head["whole_total"] = (
            self.base.whole.root.total,
            self.head.whole.root.total,
        )
        if self.normalisation == "per_step":
            noise_model: dict[str, Any] = {
                "method": "mann-whitney-u across steps, benjamini-hochberg across frames",
                "fdr_alpha": noise.FDR_ALPHA,
                "min_steps": noise.MIN_STEPS,
                "min_delta_pts": self.min_delta_pts,
                "min_relative_change_pct": 100 * noise.MIN_RELATIVE_CHANGE,
                "verdict": self.verdict_possible,
            }
        else:
            noise_model = {
                "method": "share delta beyond a noise floor",
                "noise_floor_pts": self.noise_floor_pts,
            }
        return {
            "kind": self.kind,
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
    return max(views, key=lambda view: noise.MIN_DELTA_PTS[view])


def compare_sides(base: Side, head: Side) -> Comparison:
    """Compare ``head`` against ``base`` (see the module docstring)."""
    if base.kind != head.kind:
        raise ValueError(f"cannot compare {base.kind} ({base.spec}) with {head.kind} ({head.spec})")
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
    verdict = per_step and min(len(base.steps), len(head.steps)) >= noise.MIN_STEPS
    if per_step and not verdict:
        notes.append(
            f"{min(len(base.steps), len(head.steps))} steps on one side: fewer than "
            f"{noise.MIN_STEPS}, so no change is called significant"
        )
    min_pts = noise.MIN_DELTA_PTS[_noise_view(base, head)]
    bs, bt, hs, ht = tree.means()
    shares = {
        "bs": _shares_of(bs, bt),
        "bt": _shares(bt),
        "hs": _shares_of(hs, ht),
        "ht": _shares(ht),
    }
    d_self = shares["hs"] - shares["bs"]
    d_total = shares["ht"] - shares["bt"]
    tests: dict[tuple[str, int], tuple[float, float, float]] = {}
    if per_step:
        eligible_self = np.flatnonzero(np.maximum(shares["bs"], shares["hs"]) >= min_pts)
        eligible_total = np.flatnonzero(np.maximum(shares["bt"], shares["ht"]) >= min_pts)
        eligible_total = eligible_total[eligible_total > 0]  # the root's share is always 100
        # One family for the correction: every test made in this comparison.
        # Samples are each step's share of that step's total: a slowdown of the whole
        # step (another process on the machine) moves no share, a frame's own growth does.
        base_root = np.where(tree.base_total[0] > 0, tree.base_total[0], 1.0)
        head_root = np.where(tree.head_total[0] > 0, tree.head_total[0], 1.0)
        base_m = (
            np.concatenate([tree.base_self[eligible_self], tree.base_total[eligible_total]])
            / base_root
        )
        head_m = (
            np.concatenate([tree.head_self[eligible_self], tree.head_total[eligible_total]])
            / head_root
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

    def entry(frame: DiffFrame, basis: Literal["self", "total"]) -> Entry:
        i = frame.index
        before, after = (bs[i], hs[i]) if basis == "self" else (bt[i], ht[i])
        delta = d_self[i] if basis == "self" else d_total[i]
        relative = None if before == 0 else float((after - before) / before)
        test = tests.get((basis, i))
        if per_step:
            significant = bool(verdict and test is not None and test[1] < noise.FDR_ALPHA)
            # Large: the share, the time per step and the ranks all moved the same way
            # (a frame whose share fell only because the other side grew is no change).
            sign = 1.0 if delta > 0 else -1.0
            large = bool(
                abs(delta) >= min_pts
                and (relative is None or sign * relative >= noise.MIN_RELATIVE_CHANGE)
                and (test is None or sign * test[2] > 0)
            )
        else:
            assert floor is not None
            significant = large = bool(abs(delta) >= floor)
            if base.kind == "memory":
                # Bytes in use compare as they are (no length to normalise away): a share
                # that fell only because the other side allocated more is no change.
                sign = 1.0 if delta > 0 else -1.0
                large = large and (relative is None or sign * relative >= noise.MIN_RELATIVE_CHANGE)
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
        )

    frames = list(tree.walk())
    regressions = _ranked(frames, d_self, d_total, entry, grow=True)
    improvements = _ranked(frames, d_self, d_total, entry, grow=False)
    return Comparison(
        base.kind,
        normalisation,
        base,
        head,
        tree,
        regressions,
        improvements,
        floor,
        verdict,
        notes,
        tests,
    )


def _shares_of(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    root = totals[0]
    return 100 * values / root if root > 0 else np.zeros_like(values)


def _ranked(
    frames: list[DiffFrame],
    d_self: np.ndarray,
    d_total: np.ndarray,
    entry: Callable[[DiffFrame, Literal["self", "total"]], Entry],
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
        outermost = [
            e
            for e in inside
            if not any(
                o is not e and o.basis == "total" and _within(e.frame, o.frame) for o in inside
            )
        ]
        explained = sum(sign * e.delta_pts for e in outermost)
        if explained < UNEXPLAINED_FRACTION * sign * candidate.delta_total_pts:
            total_entries.append(candidate)
            explainers.append(candidate)
    ordered = [*self_entries, *total_entries]
    ordered.sort(key=lambda e: (not e.regression, -sign * e.delta_pts))
    return ordered


def _within(node: DiffFrame, ancestor: DiffFrame) -> bool:
    """Whether ``node`` is ``ancestor`` or below it."""
    probe: DiffFrame | None = node
    while probe is not None:
        if probe is ancestor:
            return True
        probe = probe.parent
    return False
