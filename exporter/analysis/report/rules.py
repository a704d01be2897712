"""Findings: one rule per finding, each with its thresholds and the reason for them.

As XProf's ``smart_suggestion`` rules do, each rule first checks its conditions on the
facts and only then writes a finding; unlike them, a finding carries structured
evidence (numbers with units in their names), not HTML. A fact that is unknown on a
backend (no steps, no memory capacity) makes its rule stay silent: "unknown" is never
reported as "fine" or as a problem.

Priorities: ``P0`` the run is losing most of its time or is about to fail, ``P1`` a
large, fixable loss, ``P2`` worth a look. A report ``NEEDS_ATTENTION`` when any finding
is P0 or P1.

Findings speak the capture's language (:class:`Vocabulary`): XLA and JAX for XProf
captures, PyTorch for torch.profiler traces (the work is GPU kernels, or torch ops on a
CPU-only trace; the advice names DataLoader, record_function, NCCL). The evidence keys
stay the same (``xla_pct`` is the work's share whatever the work is).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from exporter.analysis.facts.capture import CaptureFacts
from exporter.analysis.facts.torch_traces import TORCH_TRACE_FORMAT
from exporter.analysis.facts.types import (
    BaselineSummary,
    Breakdown,
    FormattingOp,
    HostFacts,
    Neighbour,
    Regression,
)

__all__ = [
    "RULES",
    "BaselineRegressionRule",
    "CommunicationBoundRule",
    "CompilerInefficiencyRule",
    "Finding",
    "HostWaitRule",
    "InputWaitRule",
    "LaunchBoundRule",
    "MemoryBoundRule",
    "OomRiskRule",
    "RecompilationRule",
    "Rule",
    "StepTimeSpreadRule",
    "StragglerRule",
    "Vocabulary",
    "apply_rules",
    "vocabulary",
]

Priority = Literal["P0", "P1", "P2"]

# Input wait (share of step time loading data while no XLA computation runs). XProf calls a TPU
# program input-bound from 10 % of step time waiting for infeed
# (smart_suggestion/constants.h, kInfeedPercentageThreshold); a quarter of the step is a
# large loss, and above half the accelerator idles more than it works.
INPUT_WAIT_P2_PCT: Final = 10.0
INPUT_WAIT_P1_PCT: Final = 25.0
INPUT_WAIT_P0_PCT: Final = 50.0
# Host wait: the rest of the XLA-idle time (Python, dispatch, a host starved of CPU).
# Dispatching a step costs a few percent; above 15 % the host, not the accelerator, sets
# the pace (XProf's host-processing threshold is 50 % of the input time,
# kHostProcessingBoundThresholdInPercent; this one is of the whole step).
HOST_WAIT_P2_PCT: Final = 15.0
HOST_WAIT_P1_PCT: Final = 30.0
HOST_WAIT_P0_PCT: Final = 50.0
# Slow steps: outliers by the modified z-score (facts.STEP_OUTLIER_Z); P1 when they cost
# a tenth of the captured step time, else P2.
STEP_OUTLIER_P1_SHARE: Final = 0.1
STEP_SPREAD_MIN_STEPS: Final = 3  # XProf's straggler signal gives no verdict below 3
# Communication-bound steps: share of step time a collective op runs on the device (not
# hidden under compute). XProf's input-pipeline analysis calls a program "highly"
# device-collectives bound from 15 % (kHighlyDeviceCollectivesBoundThresholdInPercent;
# "moderately" from 3 %, which every data-parallel step reaches) and its smart suggestion
# fires from 30 % (kCollectiveBoundThresholdInPercent); above half the step the chips
# communicate more than they compute. Measured (bench/communication.py, docs/analysis.md
# "Communication-bound (measured)"): 24 captures on 4 forced JAX CPU devices, each in its
# own process, the true share calibrated in-process, on a 2-core machine at load ~9:
# false alarms 4 / 12 (true share under 15 %; the product read +5 to +9 points high
# there), power 10 / 12, priority as the true share's 12 / 24. The error is the CPU
# measurement's (4 device threads on 2 busy cores wait for each other inside their
# all-reduces), not the threshold's; kept at XProf's values, unrefuted.
COMMUNICATION_P2_PCT: Final = 15.0
COMMUNICATION_P1_PCT: Final = 30.0
COMMUNICATION_P0_PCT: Final = 50.0
# A straggler host (hosts.STRAGGLER_Z over 3+ hosts) is a large loss (P1): every
# synchronous step waits for the slowest host. At twice the median host's step the
# session runs at half its speed or worse, the run losing most of its time (P0).
STRAGGLER_P0_SLOWDOWN: Final = 2.0
# Data formatting (copy / transpose / convert) share of XLA time: layout mismatches the
# compiler could not fuse away. XProf flags special ops above 10 % of step time
# (kSpecialOpBoundThresholdInPercent); a quarter of device time is a large loss.
FORMATTING_P2_PCT: Final = 10.0
FORMATTING_P1_PCT: Final = 25.0
# Recompilation inside the captured steps: compiling in the steady state means a shape,
# dtype or static argument changes from step to step. Any compile inside a step is
# worth a look; at 10 % of the step time it is a large loss.
RECOMPILE_P1_PCT: Final = 10.0
# ... and compiling a quarter of the step is the step's first problem (P0).
RECOMPILE_P0_PCT: Final = 25.0
# OOM risk from device memory peak against capacity. Above 90 % one larger batch or a
# fragmentation spike fails the run (XProf's memory viewer warns from the same level);
# 75 % leaves little headroom.
OOM_HIGH_PCT: Final = 90.0
OOM_MEDIUM_PCT: Final = 75.0
# Memory-bandwidth-bound programs (XProf's roofline says a memory space, not compute,
# bounds the program). Below the ridge point the program can reach at most
# intensity / ridge of peak FLOP/s even at full bandwidth: under a quarter of the ridge it
# leaves three quarters of the chip's compute idle, a large loss (P1); closer to the
# ridge it is worth a look (P2).
MEMORY_BOUND_P1_RIDGE_SHARE: Final = 0.25
# XLA's cost model counts custom calls as 0 FLOPs: when they take half the device time
# the program's intensity says little about the program, so the rule stays silent.
MEMORY_BOUND_MAX_CUSTOM_PCT: Final = 50.0
# Launch-bound GPU steps: device time spent idle waiting for kernel launches
# (gpu_kernels: from the launch call's start, or the stream going idle, to the kernel's
# start, while no kernel runs on the device), as a share of step time (of the kernel
# span without steps). XProf's input-pipeline analysis calls a GPU step "moderately"
# kernel-launch bound from 3 % of step time and "highly" from 15 %
# (op_stats_to_input_pipeline_analysis.cc, kModeratelyKernelLaunchBoundThresholdInPercent
# and kHighlyKernelLaunchBoundThresholdInPercent); XProf's figure is host time inside
# the launch calls, ours the device idle time they cause, so the levels are borrowed,
# not measured: no GPU runs here, and the rule's detection power and false-alarm rate
# on real GPU captures are unknown. There is no P0: XProf has no third level.
LAUNCH_BOUND_P2_PCT: Final = 3.0
LAUNCH_BOUND_P1_PCT: Final = 15.0
# A significant regression against the baseline: P0 when a frame grew by a fifth of its
# side's total or the step got half again as slow, else P1.
BASELINE_P0_PTS: Final = 20.0
BASELINE_P0_STEP_PCT: Final = 50.0
# ... or one frame's excess adds this much of the step (per-step comparisons).
BASELINE_P0_ADDED_PCT: Final = 20.0


@dataclass(frozen=True)
class Vocabulary:
    """How findings name the work, its absence, and the tools their advice points to."""

    work: str  # what computes: "XLA", "GPU kernels", "torch ops"
    worked: str  # "XLA computed", "GPU kernels ran"
    no_work: str  # "no XLA computation runs"
    annotate: str  # how to mark the input pipeline so it is told apart
    viewer: str  # where to look at single steps
    input_advice: str
    host_advice: str
    communication_advice: str
    memory_advice: str
    toolchain: str  # what else two runs may differ in
    fuse: str  # the compiler's part in launching fewer kernels


XLA_WORDS: Final = Vocabulary(
    work="XLA",
    worked="XLA computed",
    no_work="no XLA computation runs",
    annotate="If the input pipeline runs there without a TraceMe annotation, wrap it in "
    "jax.profiler.TraceAnnotation('data_loading') to tell the two apart.",
    viewer="xprof's trace viewer",
    input_advice="Overlap input with compute: prefetch the next batches to the device (a "
    "background thread, flax.jax_utils.prefetch_to_device), use more input workers "
    "(tf.data num_parallel_calls, grain worker_count), and cache or pre-process data "
    "offline.",
    host_advice="Move Python work out of the step or batch it: fuse small jitted calls into "
    "one, avoid per-step host syncs (float(loss), .block_until_ready()) and per-step array "
    "creation on the host; check that nothing else competes for the host's CPUs.",
    communication_advice="Overlap collectives with compute (XLA's latency-hiding scheduler "
    "and async collectives: --xla_tpu_enable_async_collective_fusion, --xla_gpu_enable_"
    "latency_hiding_scheduler), send fewer bytes (bf16 gradients, reduce-scatter "
    "with sharded optimizer state instead of all-reduce), and check for a straggler "
    "host: the others wait for it inside their collectives.",
    memory_advice="Free headroom: rematerialise activations (jax.checkpoint), shard optimizer "
    "state, donate buffers (donate_argnums), or lower the batch size",
    toolchain="the XLA flags and library versions",
    fuse="(XLA: --xla_gpu_enable_command_buffer; PyTorch: torch.cuda.graphs / "
    "torch.compile mode='reduce-overhead'), let XLA fuse more,",
)
_TORCH_INPUT = (
    "Overlap input with compute: more DataLoader workers (num_workers, "
    "persistent_workers=True, prefetch_factor), pinned memory with non_blocking copies "
    "(pin_memory=True, .to(device, non_blocking=True)), and cache or pre-process data "
    "offline."
)
_TORCH_ANNOTATE = (
    "If the input pipeline runs there without an annotation, wrap it in "
    "torch.profiler.record_function('data_loader') to tell the two apart."
)
_TORCH_HOST = (
    "Move Python work out of the step: avoid per-step host syncs (loss.item(), .cpu(), "
    "torch.cuda.synchronize()), cut per-op dispatch with torch.compile or CUDA graphs, and "
    "check that nothing else competes for the host's CPUs."
)
_TORCH_COMMUNICATION = (
    "Overlap collectives with compute (DDP's gradient buckets, bucket_cap_mb; FSDP's "
    "backward_prefetch and forward_prefetch), send fewer bytes (bf16 gradients, a "
    "compression comm hook, reduce-scatter with sharded optimizer state instead of "
    "all-reduce), and check for a straggler rank: the others wait for it inside their "
    "NCCL kernels."
)
_TORCH_MEMORY = (
    "Free headroom: recompute activations (torch.utils.checkpoint), shard optimizer state "
    "(FSDP, ZeroRedundancyOptimizer), zero_grad(set_to_none=True), or lower the batch size"
)
TORCH_GPU_WORDS: Final = Vocabulary(
    work="GPU kernels",
    worked="GPU kernels ran",
    no_work="no GPU kernel runs",
    annotate=_TORCH_ANNOTATE,
    viewer="the trace in Perfetto (ui.perfetto.dev) or TensorBoard",
    input_advice=_TORCH_INPUT,
    host_advice=_TORCH_HOST,
    communication_advice=_TORCH_COMMUNICATION,
    memory_advice=_TORCH_MEMORY,
    toolchain="the PyTorch, CUDA and NCCL versions and settings",
    fuse="(torch.cuda.graphs, torch.compile mode='reduce-overhead'), fuse elementwise "
    "ops with torch.compile,",
)
# A CPU-only trace: the work is the ops themselves, and no GPU software differs.
TORCH_CPU_WORDS: Final = replace(
    TORCH_GPU_WORDS,
    work="torch ops",
    worked="torch ops ran",
    no_work="no torch op runs",
    toolchain="the PyTorch version, its thread settings (torch.get_num_threads()) and the "
    "library versions",
)


def vocabulary(facts: CaptureFacts) -> Vocabulary:
    """The words of ``facts``' capture: PyTorch's for a torch.profiler trace, else XLA's."""
    if facts.capture_format != TORCH_TRACE_FORMAT:
        return XLA_WORDS
    return TORCH_GPU_WORDS if facts.backend == "gpu" else TORCH_CPU_WORDS


@dataclass
class Finding:
    """One finding (the JSON object of ``findings``)."""

    priority: Priority
    rule: str
    title: str
    detail: str
    evidence: dict[str, float | int]
    impact: str
    suggestion: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "priority": self.priority,
            "rule": self.rule,
            "title": self.title,
            "detail": self.detail,
            "evidence": self.evidence,
            "impact": self.impact,
            "suggestion": self.suggestion,
            **self.extra,
        }


class Rule:
    """A rule: ``conditions`` on the facts, then ``finding`` (only when they hold)."""

    name = "Rule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        raise NotImplementedError

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        raise NotImplementedError

    def apply(self, facts: CaptureFacts, baseline: BaselineSummary | None = None) -> Finding | None:
        return self.finding(facts, baseline) if self.conditions(facts, baseline) else None


def _wait_parts(facts: CaptureFacts) -> tuple[Breakdown, float, str]:
    assert facts.breakdown is not None and facts.steps is not None
    step_ms = facts.steps["mean_ms"]
    b = facts.breakdown
    names = sorted(facts.data_phase_names)
    named = f" ({', '.join(names[:4])})" if names else " (no host event named like one)"
    compiling = f"{b['compile_pct']:.1f}% compiling, " if b.get("compile_pct") else ""
    detail = (
        f"Over {facts.steps['count']} steps of {step_ms:.1f} ms, {vocabulary(facts).worked} during "
        f"{b['xla_pct']:.1f}% of the step; of the {b['input_wait_pct']:.1f}% without any, "
        f"{b['data_phase_pct']:.1f}% was inside the annotated data phase{named}, {compiling}"
        f"{b['between_steps_pct']:.1f}% between step annotations and "
        f"{b['host_other_pct']:.1f}% other host work."
    )
    return b, step_ms, detail


def _wait_evidence(facts: CaptureFacts, b: Breakdown, step_ms: float) -> dict[str, float | int]:
    assert facts.steps is not None
    return {
        "input_wait_pct": b["input_wait_pct"],
        "data_phase_pct": b["data_phase_pct"],
        "between_steps_pct": b["between_steps_pct"],
        "host_other_pct": b["host_other_pct"],
        "xla_pct": b["xla_pct"],
        "step_time_ms": step_ms,
        "steps": facts.steps["count"],
    }


def _speedup(share: float, step_ms: float) -> str:
    return (
        f"Removing it would make steps up to {100 / max(1e-9, 100 - share):.2f}x faster "
        f"({step_ms * share / 100:.1f} ms of every {step_ms:.1f} ms step)."
    )


def _input_speedup(share: float, xla_pct: float, step_ms: float, work: str = "XLA") -> str:
    """The input's cost in two parts: overlap alone, and a faster loader."""
    load, compute = step_ms * share / 100, step_ms * xla_pct / 100
    rest = step_ms - load  # the step without the input wait
    overlapped = max(load, rest)
    overlap = step_ms / overlapped if overlapped > 0 else 1.0
    fast = step_ms / rest if rest > 0 else float("inf")
    limit = (
        f" Loading ({load:.1f} ms) outlasts the rest of the step ({rest:.1f} ms, {compute:.1f} "
        f"ms of it {work}): overlap hides only the shorter, so the loader itself must get "
        "faster."
        if load > rest
        else ""
    )
    return (
        f"{load:.1f} ms of every {step_ms:.1f} ms step waits for input. Overlapping loading "
        f"with compute would make steps {overlap:.2f}x faster; a loader fast enough to leave "
        f"no wait, {fast:.2f}x.{limit}"
    )


def _priority(value: float, p2: float, p1: float, p0: float) -> Priority:
    return "P0" if value >= p0 else "P1" if value >= p1 else "P2"


class InputWaitRule(Rule):
    """XLA idles while the step loads data (the annotated data phase, or between steps).

    Input wait is time inside a step cycle when no XLA computation runs; the part of it
    spent in a data phase (host events named like ``data_loading``, ``input``,
    ``prefetch``...) or between two step annotations is what input costs.
    """

    name = "InputWaitRule"

    @staticmethod
    def share(facts: CaptureFacts) -> float:
        b = facts.breakdown
        return 0.0 if b is None else float(b["data_phase_pct"] + b["between_steps_pct"])

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        return facts.steps is not None and self.share(facts) >= INPUT_WAIT_P2_PCT

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        b, step_ms, detail = _wait_parts(facts)
        # The evidence holds the number the title quotes: both rounded once, here.
        share = round(self.share(facts), 1)
        where = (
            "the annotated data phase"
            if b["data_phase_pct"] >= b["between_steps_pct"]
            else "the gap between step annotations"
        )
        words = vocabulary(facts)
        return Finding(
            _priority(share, INPUT_WAIT_P2_PCT, INPUT_WAIT_P1_PCT, INPUT_WAIT_P0_PCT),
            self.name,
            f"Steps wait for input: {share:.1f}% of step time loads data while {words.no_work}",
            f"{detail} The input wait is mostly {where}.",
            _wait_evidence(facts, b, step_ms) | {"input_pct": share},
            _input_speedup(share, float(b["xla_pct"]), step_ms, words.work),
            words.input_advice,
        )


class HostWaitRule(Rule):
    """XLA idles inside the step while the host does other work (Python, dispatch)."""

    name = "HostWaitRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        b = facts.breakdown
        return facts.steps is not None and b is not None and b["host_other_pct"] >= HOST_WAIT_P2_PCT

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        b, step_ms, detail = _wait_parts(facts)
        share = float(b["host_other_pct"])
        words = vocabulary(facts)
        return Finding(
            _priority(share, HOST_WAIT_P2_PCT, HOST_WAIT_P1_PCT, HOST_WAIT_P0_PCT),
            self.name,
            f"Steps wait for the host: {share:.1f}% of step time runs neither {words.work} "
            "nor an annotated data phase",
            f"{detail} {words.annotate}",
            _wait_evidence(facts, b, step_ms),
            _speedup(share, step_ms),
            words.host_advice,
        )


class StepTimeSpreadRule(Rule):
    """Some steps are far slower than the rest (outliers by a robust rule)."""

    name = "StepTimeSpreadRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        s = facts.steps
        return (
            s is not None
            and s.get("count", 0) >= STEP_SPREAD_MIN_STEPS
            and s.get("outliers", 0) > 0
        )

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        assert facts.steps is not None
        s = facts.steps
        n, excess = s["outliers"], s["outlier_excess_ms"]
        total = s["mean_ms"] * s["count"]
        slowest = ", ".join(f"{d:.1f}" for d in reversed(s.get("outlier_ms", [])))
        return Finding(
            "P1" if total and excess / total >= STEP_OUTLIER_P1_SHARE else "P2",
            self.name,
            f"{n} slow step{'s' if n != 1 else ''}: {excess:.1f} ms beyond the median step",
            f"{s['count']} steps: median {s['median_ms']:.1f} ms, p90 {s['p90_ms']:.1f} ms, "
            f"max {s['max_ms']:.1f} ms; {n} outlier{'s' if n != 1 else ''} (modified z-score "
            f"above 3.5): {slowest} ms.",
            {
                "cv": s["cv"],
                "median_ms": s["median_ms"],
                "p90_ms": s["p90_ms"],
                "max_ms": s["max_ms"],
                "outlier_steps": n,
                "outlier_excess_ms": excess,
            },
            f"The slow steps cost {excess:.1f} ms more than median steps would have "
            f"({100 * excess / total:.1f}% of the captured step time)."
            if total
            else f"The slow steps cost {excess:.1f} ms more than median steps would have.",
            f"Look at the slowest steps in {vocabulary(facts).viewer}: garbage "
            "collection, checkpointing, data stalls or another process on the host.",
        )


class CommunicationBoundRule(Rule):
    """Steps spend a large share of their time in collectives the device waits for."""

    name = "CommunicationBoundRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        b = facts.breakdown
        return (
            facts.steps is not None
            and b is not None
            and b.get("communication_pct") is not None
            and b["communication_pct"] >= COMMUNICATION_P2_PCT
        )

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        assert facts.breakdown is not None and facts.steps is not None
        b = facts.breakdown
        share = round(float(b["communication_pct"]), 1)
        step_ms = facts.steps["mean_ms"]
        per_step = float(b["communication_ms_per_step"])
        kinds = b.get("communication_by_kind_ms") or {}
        named = ", ".join(f"{k} {v:.2f} ms" for k, v in list(kinds.items())[:3])
        evidence: dict[str, float | int] = {
            "communication_pct": share,
            "communication_ms_per_step": per_step,
            "compute_pct": b["compute_pct"],
            "xla_pct": b["xla_pct"],
            "step_time_ms": step_ms,
            "steps": facts.steps["count"],
        }
        overlap = b.get("communication_overlap")
        hidden = ""
        if overlap:
            hidden = (
                f" Of the asynchronous collectives' {overlap['async_ms_per_step']:.2f} ms per "
                f"step ({overlap['async_ops']} windows, from the {overlap['source']}), "
                f"{overlap['hidden_pct']:.1f}% ran under other ops and "
                f"{overlap['exposed_ms_per_step']:.2f} ms per step did not."
            )
            evidence["async_hidden_pct"] = overlap["hidden_pct"]
            evidence["async_exposed_ms_per_step"] = overlap["exposed_ms_per_step"]
        return Finding(
            _priority(share, COMMUNICATION_P2_PCT, COMMUNICATION_P1_PCT, COMMUNICATION_P0_PCT),
            self.name,
            f"Steps are communication-bound: collectives run during {share:.1f}% of step time "
            f"({per_step:.2f} ms per step)",
            f"Over {facts.steps['count']} steps of {step_ms:.1f} ms the device ran "
            f"{vocabulary(facts).work} during "
            f"{b['xla_pct']:.1f}% of the step: {b['compute_pct']:.1f}% compute and {share:.1f}% "
            f"collective ops{f' ({named} per step)' if named else ''}.{hidden}",
            evidence,
            f"Hiding the communication under compute would make steps up to "
            f"{100 / max(1e-9, 100 - share):.2f}x faster ({per_step:.2f} ms of every "
            f"{step_ms:.1f} ms step).",
            vocabulary(facts).communication_advice,
        )


# A host's per-step figures the straggler rule compares across hosts.
_HostMs = Literal[
    "step_median_ms",
    "own_median_ms",
    "step_mean_ms",
    "compute_ms_per_step",
    "communication_ms_per_step",
    "idle_ms_per_step",
]


def _ms(host: HostFacts, key: _HostMs) -> float:
    """A host's per-step figure (None only for a host without steps, which
    ``facts.hosts`` never lists; counted as 0 as it always was)."""
    return float(host[key] or 0.0)


class StragglerRule(Rule):
    """One host's steps are far slower than the other hosts' (3+ hosts), or, in
    lockstep, it works far longer outside collectives while the others wait in theirs."""

    name = "StragglerRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        return any(h.get("straggler") for h in facts.hosts)

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        hosts = facts.hosts
        stragglers = sorted(
            (h for h in hosts if h.get("straggler")), key=lambda h: -(h["straggler_z"] or 0.0)
        )
        host = stragglers[0]

        def typical(key: _HostMs) -> float:
            return float(statistics.median(_ms(h, key) for h in hosts))

        lockstep = host.get("straggler_basis") == "time outside collectives"
        key: _HostMs = "own_median_ms" if lockstep else "step_median_ms"
        ref_median = typical(key)
        slowdown = _ms(host, key) / ref_median if ref_median else float("inf")
        waiting = (
            f"waiting with no {vocabulary(facts).work} running (input, the host or other hosts)"
        )
        where_spent: tuple[tuple[str, _HostMs], ...] = (
            ("computing", "compute_ms_per_step"),
            ("in collectives", "communication_ms_per_step"),
            (waiting, "idle_ms_per_step"),
        )
        parts = {label: _ms(host, field) - typical(field) for label, field in where_spent}
        excess = (
            _ms(host, key) - ref_median
            if lockstep
            else _ms(host, "step_mean_ms") - typical("step_mean_ms")
        )
        where = max(parts, key=lambda k: parts[k])
        step_ms = _ms(host, "step_mean_ms")
        if lockstep:
            title = (
                f"Host {host['name']} holds the other hosts up: it works {host[key]:.1f} ms "
                f"per step outside collectives against {ref_median:.1f} ms on the median "
                f"host ({slowdown:.1f}x) while they wait in theirs, mostly {where}"
            )
            impact = (
                f"The other hosts wait about {excess:.1f} ms of every {step_ms:.1f} ms step "
                f"for it inside their collectives: steps could be up to "
                f"{step_ms / max(1e-9, step_ms - excess):.2f}x faster if it kept pace."
            )
        else:
            title = (
                f"Host {host['name']} is a straggler: its steps take {slowdown:.1f}x the "
                f"median host's ({host['step_median_ms']:.1f} ms vs {ref_median:.1f} ms), "
                f"mostly {where}"
            )
            impact = (
                f"Synchronous steps wait for the slowest host: the session could run up to "
                f"{slowdown:.1f}x faster ({excess:.1f} ms of every step) if {host['name']} "
                "kept pace."
            )
        slowest = ", ".join(
            f"step {s['step'] if s['step'] is not None else '?'} {s['ms']:.1f} ms"
            for s in host["slowest_steps"]
        )
        others = [h["name"] for h in stragglers[1:]]
        also = f" Also slower: {', '.join(others)}." if others else ""
        return Finding(
            "P0" if slowdown >= STRAGGLER_P0_SLOWDOWN else "P1",
            self.name,
            title,
            f"{len(hosts)} hosts; {host['name']} ({host['file']}): median step "
            f"{host['step_median_ms']:.1f} ms, p90 {host['step_p90_ms']:.1f} ms, "
            f"{host['own_median_ms']:.1f} ms of it outside collectives; modified z-score "
            f"{host['straggler_z']:.1f} of its {host['straggler_basis']} (above 3.5). Per "
            "step it spends "
            f"{parts['computing']:+.1f} ms computing, {parts['in collectives']:+.1f} ms in "
            f"collectives and {parts[waiting]:+.1f} ms "
            f"waiting against the median host. Its slowest steps: {slowest}.{also}",
            {
                "slowdown_x": round(slowdown, 2),
                "step_median_ms": _ms(host, "step_median_ms"),
                "hosts_median_step_ms": round(typical("step_median_ms"), 3),
                "own_median_ms": _ms(host, "own_median_ms"),
                "hosts_median_own_ms": round(typical("own_median_ms"), 3),
                "straggler_z": host["straggler_z"] or 0.0,
                "excess_ms_per_step": round(excess, 3),
                "excess_compute_ms_per_step": round(parts["computing"], 3),
                "excess_communication_ms_per_step": round(parts["in collectives"], 3),
                "excess_idle_ms_per_step": round(parts[waiting], 3),
                "hosts": len(hosts),
                "stragglers": len(stragglers),
            },
            impact,
            "Compare the straggler with a healthy host: its chips and their clocks or "
            "throttling, other processes on it, its input shard (a larger or slower shard "
            "shows as waiting), and its network path (waiting in collectives); replace or "
            "drain the host if the hardware is at fault.",
            {
                "host": host["name"],
                "basis": host["straggler_basis"],
                "slowest_steps": host["slowest_steps"],
                "stragglers": [h["name"] for h in stragglers],
            },
        )


class CompilerInefficiencyRule(Rule):
    """XLA spends time only moving or reformatting data."""

    name = "CompilerInefficiencyRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        c = facts.compiler
        return c is not None and c["data_formatting_pct"] >= FORMATTING_P2_PCT

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        assert facts.compiler is not None
        c = facts.compiler
        share = c["data_formatting_pct"]
        top = c["ops"][:3]
        ops = ", ".join(o["name"] for o in top)
        placed = [_between(o) for o in top if o.get("neighbourhood")]
        where = f" {'; '.join(placed)}." if placed else ""
        return Finding(
            "P1" if share >= FORMATTING_P1_PCT else "P2",
            self.name,
            f"{share:.1f}% of XLA time only moves data (copy / transpose / convert)",
            f"Data-formatting ops took {c['data_formatting_ms']:.1f} ms ({share:.1f}% of XLA "
            f"time); the largest: {ops}.{where}",
            {
                "data_formatting_pct": share,
                "data_formatting_ms": c["data_formatting_ms"],
                "ops_placed": len(placed),
            },
            f"Up to {share:.1f}% of device time could go to useful work.",
            "Keep arrays in the layout and dtype the consumer wants (avoid .T / astype in "
            "the hot loop, keep parameters in the compute dtype), and check the HLO for "
            "copies around custom calls or sharding changes"
            + (", starting with the producers and consumers named above." if placed else "."),
            {"formatting_ops": [_placed(o) for o in top]} if placed else {},
        )


def _names(entries: Sequence[Neighbour], total: int, role: str) -> str:
    """``fusion.2 (producer)``, ``fusion.2, p.1 and 1 more (producers)``."""
    names = [e["name"] for e in entries[:2]]
    more = f" and {total - len(names)} more" if total > len(names) else ""
    return f"{', '.join(names)}{more} ({role}{'s' if total > 1 else ''})"


def _between(op: FormattingOp) -> str:
    """``copy.3 between fusion.2 (producer) and dot.7 (consumer)``."""
    n = op.get("neighbourhood")
    assert n is not None  # only ops placed in their HLO are described
    producers = (
        _names(n["producers"], n["producers_total"], "producer")
        if n["producers"]
        else "nothing (no operand)"
    )
    consumers = (
        _names(n["consumers"], n["consumers_total"], "consumer")
        if n["consumers"]
        else "the program's output (no user)"
    )
    shape = f" {n['shape']}" if n.get("shape") else ""
    return f"{op['name']}{shape} between {producers} and {consumers}"


def _placed(op: FormattingOp) -> dict[str, Any]:
    """A formatting op's structured evidence: its time and its neighbours."""
    n = op.get("neighbourhood")

    def kept(e: Neighbour) -> dict[str, Any]:
        return {
            "name": e["name"],
            "opcode": e["opcode"],
            "shape": e["shape"],
            "share_pct": e["share_pct"],
        }

    return {
        "name": op["name"],
        "self_ms": op.get("self_ms"),
        "module": n["module"] if n else None,
        "opcode": n["opcode"] if n else None,
        "shape": n["shape"] if n else None,
        "producers": [kept(e) for e in n["producers"]] if n else [],
        "consumers": [kept(e) for e in n["consumers"]] if n else [],
    }


class RecompilationRule(Rule):
    """XLA compiled during the captured steps."""

    name = "RecompilationRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        r = facts.recompilation
        return r is not None and r["in_steps"] > 0

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        assert facts.recompilation is not None
        r = facts.recompilation
        return Finding(
            _priority(r["in_steps_pct"], 0.0, RECOMPILE_P1_PCT, RECOMPILE_P0_PCT),
            self.name,
            f"XLA recompiled {r['in_steps']} times during the captured steps",
            f"{r['compilations']} compilations in the capture, {r['in_steps']} inside steps, "
            f"{r['compile_ms']:.1f} ms in all ({r['in_steps_pct']:.1f}% of step time).",
            {
                "compilations": r["compilations"],
                "in_steps": r["in_steps"],
                "compile_ms": r["compile_ms"],
                "in_steps_pct": r["in_steps_pct"],
            },
            f"{r['in_steps_pct']:.1f}% of step time goes to compiling, and every new shape "
            "compiles again.",
            "Keep shapes, dtypes and static arguments constant from step to step: pad "
            "batches to fixed sizes (bucketing), mark changing Python values as traced "
            "arguments, and check jax.log_compiles / jax.explain_cache_misses.",
        )


class OomRiskRule(Rule):
    """Device memory peak close to capacity; names the largest buffers at the peak."""

    name = "OomRiskRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        return facts.memory is not None and facts.memory["peak_pct"] >= OOM_MEDIUM_PCT

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        assert facts.memory is not None
        m = facts.memory
        high = m["peak_pct"] >= OOM_HIGH_PCT
        evidence: dict[str, float | int] = {
            "peak_pct": m["peak_pct"],
            "peak_bytes": m["peak_bytes"],
            "capacity_bytes": m["capacity_bytes"],
        }
        peak = facts.peak_allocations
        largest = (peak.get("largest") or []) if peak and peak.get("available") else []
        tensors = ""
        if largest:
            named = "; ".join(
                f"{b['instruction']} {b['bytes'] / 2**20:.1f} MiB"
                + (f" {b['shape']}" if b.get("shape") else "")
                + (f" ({b['source']})" if b.get("source") else "")
                for b in largest[:3]
            )
            tensors = f" Largest buffers at the peak of {largest[0]['module']}: {named}."
            evidence["largest_buffer_bytes"] = largest[0]["bytes"]
        return Finding(
            "P0" if high else "P1",
            self.name,
            f"OOM risk {'HIGH' if high else 'MEDIUM'}: device memory peaked at "
            f"{m['peak_pct']:.1f}% of capacity",
            f"Peak {m['peak_bytes'] / 2**30:.2f} GiB of {m['capacity_bytes'] / 2**30:.2f} GiB "
            f"(from {m['source']}).{tensors}",
            evidence,
            "A larger batch, a longer sequence or fragmentation can fail the run with "
            "RESOURCE_EXHAUSTED.",
            vocabulary(facts).memory_advice
            + (", starting with the largest buffers named above." if largest else "."),
            {"largest_buffers": largest[:3]} if largest else {},
        )


class MemoryBoundRule(Rule):
    """XProf's roofline: memory bandwidth, not compute, bounds the program."""

    name = "MemoryBoundRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        r = facts.roofline
        return (
            r is not None
            and bool(r.get("available"))
            and r.get("bound_by") not in ("Compute", "Unknown", None)
            and bool(r.get("ridge_point_flop_per_byte"))
            and float(r.get("custom_call_share_pct") or 0.0) < MEMORY_BOUND_MAX_CUSTOM_PCT
        )

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        r = facts.roofline
        assert r is not None
        intensity = float(r["bottleneck_operational_intensity_flop_per_byte"])
        ridge = float(r["ridge_point_flop_per_byte"] or 0.0)  # not 0: the conditions
        share = intensity / ridge
        custom = float(r.get("custom_call_share_pct") or 0.0)
        bw = r.get("hbm_bw_utilization_pct")
        bw_text = f", HBM bandwidth {bw:.0f}% of peak" if bw is not None else ""
        evidence: dict[str, float | int] = {
            "operational_intensity_flop_per_byte": intensity,
            "ridge_point_flop_per_byte": ridge,
            "achieved_flop_rate_gflops": r["achieved_flop_rate_gflops"],
            "peak_flop_rate_gflops": r["peak_flop_rate_gflops"],
            "compute_efficiency_pct": r["compute_efficiency_pct"],
            "custom_call_share_pct": custom,
        }
        if bw is not None:
            evidence["hbm_bw_utilization_pct"] = bw
        return Finding(
            "P1" if share < MEMORY_BOUND_P1_RIDGE_SHARE else "P2",
            self.name,
            f"Memory-bandwidth bound ({r['bound_by']}): {intensity:.1f} FLOP/B against a "
            f"ridge point of {ridge:.1f} FLOP/B",
            f"XProf's roofline: the program is bound by {r['bound_by']} with an operational "
            f"intensity of {intensity:.1f} FLOP/B ({100 * share:.0f}% of the ridge point); "
            f"it computes {r['achieved_flop_rate_gflops']:.0f} of "
            f"{r['peak_flop_rate_gflops']:.0f} GFLOP/s ({r['compute_efficiency_pct']:.1f}%)"
            f"{bw_text}. {r.get('custom_call_note', '')}",
            evidence,
            f"Even at full bandwidth the program reaches at most {100 * min(share, 1.0):.0f}% "
            "of the chip's peak FLOP/s.",
            "Move fewer bytes per FLOP: fuse elementwise ops into their producers, keep "
            "activations in bf16, raise the batch (or the per-device batch) so matmuls "
            "reuse their weights, and look at the top HBM-bound ops in xprof's roofline.",
        )


class BaselineRegressionRule(Rule):
    """The top regression against the baseline (or a step-time verdict); always first."""

    name = "BaselineRegressionRule"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        if not baseline:
            return False
        verdict = baseline.get("step_verdict")
        slower = verdict is not None and verdict.get("verdict") == "slower"
        return bool(baseline.get("top_regression")) or slower

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        assert baseline is not None
        top = baseline.get("top_regression")
        verdict = baseline.get("step_verdict")
        step = baseline.get("step_time_change_pct")
        step_text = f"step time {step:+.0f}%: " if step is not None else ""
        against = baseline.get("session") or baseline.get("spec")
        if not top:
            assert verdict is not None  # no regression: the conditions saw a slower step
            scale = verdict.get("scale") or 1.0
            return Finding(
                "P0" if (step or 0) >= BASELINE_P0_STEP_PCT else "P1",
                self.name,
                f"{step_text}every op slower alike (x{scale:.2f}) against the baseline",
                f"Against baseline {against}: step time {verdict.get('base_median_ms')} ms -> "
                f"{verdict.get('head_median_ms')} ms, beyond the {verdict.get('noise_pct')} % "
                "that runs of the same workload differ by, and no frame explains it: all ops "
                f"scaled by x{scale:.2f}.",
                {"step_time_change_pct": round(step or 0.0, 2), "scale": round(scale, 3)},
                f"Each step takes {step or 0:.0f}% longer than in the baseline.",
                "A uniform slowdown is a machine, clock or configuration change rather than "
                "new work: compare the chips, their clocks and throttling, "
                f"{vocabulary(facts).toolchain} of both runs.",
                {},
            )
        basis = top["basis"]
        before, after, delta = _basis_shares(top)
        step_pct = float(top.get("step_pct") or 0.0)
        per_step = baseline.get("normalisation") == "per_step"
        high = (
            step_pct >= BASELINE_P0_ADDED_PCT
            or (step is not None and step >= BASELINE_P0_STEP_PCT)
            or (not per_step and delta >= BASELINE_P0_PTS)
        )
        steps = baseline.get("steps")
        how = (
            f"significant over {steps} steps (q={top['q_value']:.2g})"
            if per_step and top.get("q_value") is not None
            else f"beyond the {baseline.get('noise_floor_pts')} point noise floor"
        )
        evidence: dict[str, float | int] = {
            "base_ms": top.get("base_ms", 0.0),
            "head_ms": top.get("head_ms", 0.0),
            "excess_ms": top.get("excess_ms", 0.0),
            "step_pct": round(step_pct, 2),
            f"{basis}_base_pct": before,
            f"{basis}_head_pct": after,
            f"delta_{basis}_pts": delta,
        }
        if step is not None:
            evidence["step_time_change_pct"] = round(step, 2)
        if (q_value := top.get("q_value")) is not None:
            evidence["q_value"] = q_value
        what = "new work" if top.get("new") else f"{basis} time grew"
        # Named with its program (jit_extra_work > ynn_fusion): an op's name alone recurs.
        label = top.get("label") or top["name"]
        if per_step:
            title = (
                f"{step_text}{label}: {what}, +{top.get('excess_ms', 0):.3g} ms per step "
                f"({step_pct:.1f}% of the step) against the baseline"
            )
            detail = (
                f"Against baseline {against}: {top['frame']} {basis} time "
                f"{top.get('base_ms', 0):.3g} ms -> {top.get('head_ms', 0):.3g} ms per step; "
                f"{top.get('excess_ms', 0):.3g} ms beyond the machine-wide scale ({how})."
            )
            impact = f"It adds {step_pct:.1f}% to every step."
        else:
            title = (
                f"{step_text}{label} {basis} time grew from {before:.1f}% to "
                f"{after:.1f}% ({baseline.get('kind')}) against the baseline"
            )
            detail = (
                f"Against baseline {against}: {top['frame']} {basis} share {before:.1f}% -> "
                f"{after:.1f}% ({delta:+.1f} points, {how})."
            )
            impact = (
                f"This frame accounts for {delta:.1f} points more of the "
                f"{baseline.get('kind')} time than in the baseline."
            )
        return Finding(
            "P0" if high else "P1",
            self.name,
            title,
            detail,
            evidence,
            impact,
            f"Look at what changed in {label} since the baseline (code, data, "
            "configuration); the differential flame graph shows where it grew.",
            {"frame": top["frame"]},
        )


def _basis_shares(top: Regression) -> tuple[float, float, float]:
    """The regression's base and head shares (%) and their delta (points), of its
    basis: the frame's self time or its subtree's."""
    if top["basis"] == "self":
        return top["self_base_pct"], top["self_head_pct"], top["delta_self_pts"]
    return top["total_base_pct"], top["total_head_pct"], top["delta_total_pts"]


class LaunchBoundRule(Rule):
    """GPU kernels wait for the host to launch them: the device idles between kernels."""

    name = "LaunchBoundRule"

    @staticmethod
    def share(facts: CaptureFacts) -> tuple[float, str] | None:
        """The launch overhead's share and its denominator, None when unknown."""
        kernels = facts.gpu_kernels
        launch = kernels.get("launch_overhead") if kernels else None
        if not kernels or not kernels.get("available") or not launch or not launch.get("available"):
            return None
        per_step = launch.get("per_step")
        if per_step:
            return float(per_step["share_of_step_pct"]), "step time"
        return float(launch["share_pct"]), "the kernels' span"

    def conditions(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> bool:
        found = self.share(facts)
        return found is not None and found[0] >= LAUNCH_BOUND_P2_PCT

    def finding(self, facts: CaptureFacts, baseline: BaselineSummary | None) -> Finding:
        found = self.share(facts)
        assert found is not None and facts.gpu_kernels is not None
        share, of = found
        launch = facts.gpu_kernels["launch_overhead"]
        per_step = launch.get("per_step")
        evidence: dict[str, float | int] = {
            "launch_overhead_pct": round(share, 2),
            "launch_overhead_ms": launch["launch_overhead_ms"],
            "gaps": launch["gaps"],
            "launch_gaps": launch["launch_gaps"],
            "host_gaps": launch["host_gaps"],
            "kernels": facts.gpu_kernels["kernel_count"],
            "kernel_time_ms": facts.gpu_kernels["total_ms"],
        }
        if (median_gap := launch.get("median_gap_us")) is not None:
            evidence["median_gap_us"] = median_gap
        where = f"{launch['launch_overhead_ms']:.3f} ms"
        if per_step:
            evidence["launch_overhead_ms_per_step"] = per_step["launch_overhead_ms_per_step"]
            evidence["steps"] = per_step["steps"]
            where = f"{per_step['launch_overhead_ms_per_step']:.3f} ms per step"
        top = launch.get("top_latency") or []
        named = ", ".join(f"{t['name']} ({t['mean_us']:.1f} us)" for t in top[:3])
        return Finding(
            _priority(share, LAUNCH_BOUND_P2_PCT, LAUNCH_BOUND_P1_PCT, float("inf")),
            self.name,
            f"GPU kernels wait for their launches: the device idles {share:.1f}% of {of} ({where})",
            f"{launch['gaps']} gaps between {facts.gpu_kernels['kernel_count']} kernels on the "
            f"GPU streams (median {launch['median_gap_us']} us); in {launch['launch_gaps']} of "
            "them the kernel's launch call had begun when the stream went idle, in "
            f"{launch['host_gaps']} the host began it later. While no kernel ran, the device "
            f"waited {where} for launches in progress."
            + (f" Largest launch latency (kernel start - call start): {named}." if named else ""),
            evidence,
            f"Launching ahead of the device would make steps up to "
            f"{100 / max(1e-9, 100 - share):.2f}x faster.",
            f"Launch fewer, larger kernels: capture the step in a CUDA graph "
            f"{vocabulary(facts).fuse} and keep Python work between launches off the "
            "launching thread.",
            {"top_latency": top},
        )


RULES: Sequence[Rule] = (
    BaselineRegressionRule(),
    InputWaitRule(),
    HostWaitRule(),
    OomRiskRule(),
    MemoryBoundRule(),
    RecompilationRule(),
    CompilerInefficiencyRule(),
    StepTimeSpreadRule(),
    StragglerRule(),
    CommunicationBoundRule(),
    LaunchBoundRule(),
)


def apply_rules(
    facts: CaptureFacts, baseline: BaselineSummary | None = None, rules: Sequence[Rule] = RULES
) -> list[Finding]:
    """Every finding, P0 first; the baseline regression leads whatever its priority."""
    found = [f for rule in rules if (f := rule.apply(facts, baseline)) is not None]
    lead = [f for f in found if f.rule == BaselineRegressionRule.name]
    rest = sorted(
        (f for f in found if f.rule != BaselineRegressionRule.name), key=lambda f: f.priority
    )
    return lead + rest
