"""The analysis report: verdict, summary, facts, findings and the baseline comparison.

JSON contract (``analysis.json``; documented in docs/analysis.md)::

    {"status": "OPTIMAL" | "NEEDS_ATTENTION", "summary": str, "facts": {...},
     "findings": [{"priority": "P0"|"P1"|"P2", "title", "detail", "evidence": {name: number},
                   "impact", "suggestion", ...}],
     "baseline": {...comparison summary, when one was made} | null, ...}
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from exporter.analysis.compare.comparison import Comparison, compare_sides
from exporter.analysis.facts.capture import CaptureFacts, gather_facts
from exporter.analysis.facts.types import BaselineSummary, Regression, StepVerdict
from exporter.analysis.report.rules import XLA_WORDS, Finding, apply_rules, vocabulary
from exporter.analysis.sides.load import (
    Kind,
    Side,
    SideContext,
    join_step_view,
    load_side,
    load_sides,
)
from exporter.errors import InputError
from exporter.profiles.capture_files import CAPTURES_NAMED, find_captures
from exporter.profiles.torch_trace import find_traces, is_torch_trace

__all__ = [
    "REPORT_VERSION",
    "Report",
    "analyze",
    "baseline_summary",
    "capture_paths",
    "xprof_step_time",
]

REPORT_VERSION: Final = 1
OPTIMAL: Final = "OPTIMAL"
NEEDS_ATTENTION: Final = "NEEDS_ATTENTION"
BASELINE_TOP: Final = 5  # entries per list kept in the report's baseline section


@dataclass
class Report:
    """One analysis; ``to_json`` is ``analysis.json``."""

    input: dict[str, Any]
    facts: CaptureFacts
    findings: list[Finding]
    baseline: BaselineSummary | None = None
    comparisons: dict[str, Comparison] = field(default_factory=dict)  # for the HTML page
    timings: dict[str, float] = field(default_factory=dict)  # seconds per part
    links: dict[str, str] = field(default_factory=dict)
    generated: float = field(default_factory=time.time)

    @property
    def status(self) -> str:
        urgent = any(f.priority in ("P0", "P1") for f in self.findings)
        return NEEDS_ATTENTION if urgent else OPTIMAL

    def counts(self) -> dict[str, int]:
        return {p: sum(f.priority == p for f in self.findings) for p in ("P0", "P1", "P2")}

    @property
    def summary(self) -> str:
        return _summary(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "status": self.status,
            "summary": self.summary,
            "input": self.input,
            "facts": self.facts.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "finding_counts": self.counts(),
            "baseline": self.baseline,
            "links": self.links,
            "timings": self.timings,
            "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.generated)),
        }


def xprof_step_time(xprof: dict[str, Any]) -> str | None:
    """XProf's own step time (its ``input_pipeline_analyzer``), labelled as such: the one
    figure the summary, the key numbers and the text call "XProf step time"."""
    tools = xprof.get("tools") or {}
    ipa = (tools.get("input_pipeline_analyzer") or {}).get("summary") or {}
    average = (ipa.get("step_time_ms") or {}).get("average")
    if average is None:
        return None
    return (
        f"XProf step time {average:.1f} ms (input_pipeline_analyzer's average over "
        f"{ipa.get('steps')} steps, {ipa.get('hardware_type')})"
    )


def _summary(report: Report) -> str:
    f = report.facts
    sentences = []
    words = vocabulary(f)  # XLA's, or PyTorch's for torch.profiler traces
    what = "torch.profiler trace" if words is not XLA_WORDS else "capture"
    where = f"{len(f.files)} {what}{'s' if len(f.files) != 1 else ''} on {f.backend.upper()}"
    if f.steps:
        s = f.steps
        xprof = ""
        if (measured := xprof_step_time(f.xprof)) is not None:
            xprof = f"; {measured}"
        elif s.get("xprof_mean_ms") is not None and words is XLA_WORDS:
            # Our own reading of XProf's definition, never called XProf's: the converter's
            # figure (Key numbers) can differ from it, and a page held two "XProf step times".
            xprof = (
                f"; mean without each capture's first and last step (XProf's definition; "
                f"its converter did not run): {s['xprof_mean_ms']:.1f} ms"
            )
        sentences.append(
            f"{s['count']} steps from {where}: median {s['median_ms']:.1f} ms, mean "
            f"{s['mean_ms']:.1f} ms, from one step's start to the next's{xprof}."
        )
    else:
        sentences.append(f"No step markers in {where}, so step time and input wait are unknown.")
    if f.breakdown:
        b = f.breakdown
        comm = (
            f" (collectives {b['communication_pct']:.1f}% of the step)"
            if b.get("communication_pct")
            else ""
        )
        sentences.append(
            f"{words.worked} during {b['xla_pct']:.1f}% of step time{comm}; "
            f"{b['input_wait_pct']:.1f}% had {words.no_work.replace('runs', 'running')} "
            f"({b['data_phase_pct']:.1f}% in the data phase)."
        )
    if f.top_ops:
        top = f.top_ops[0]
        sentences.append(
            f"The top op is {top['name']} with {top['share_pct']:.1f}% of {words.work} time."
        )
    elif words is XLA_WORDS:
        sentences.append("No XLA computation was found, so device time and top ops are unknown.")
    else:
        sentences.append("No GPU kernels in the trace, so device time and top ops are unknown.")
    counts = report.counts()
    if report.findings:
        urgent = [x for x in report.findings if x.priority in ("P0", "P1")]
        lead = urgent[0] if urgent else report.findings[0]
        sentences.append(
            f"{report.status}: {counts['P0']} P0, {counts['P1']} P1 and {counts['P2']} P2 "
            f"findings; first: {lead.title}."
        )
    else:
        sentences.append(f"{report.status}: no finding crossed a threshold.")
    base = report.baseline
    if base and not base.get("top_regression") and base.get("session"):
        change = base.get("step_time_change_pct")
        moved = f" (step time {change:+.0f}%)" if change is not None else ""
        sentences.append(
            f"Against baseline {base['session']} no frame changed significantly{moved}."
        )
    return " ".join(sentences[:5])


def capture_paths(spec: str, context: SideContext) -> tuple[list[Path], dict[str, Any]]:
    """The capture files an analysis input names (a file, a session, ``run:<id>``)."""
    from exporter.analysis.sides.load import (
        RUN_PREFIX,
        one_kind_of_run,
        run_session_files,
        run_spec,
    )
    from exporter.capture.inputs import existing_input

    if spec.startswith(RUN_PREFIX):
        from exporter.capture.store import SessionStore

        run_id, newest = run_spec(spec)
        if context.store is None:
            raise InputError(f"{spec}: needs the session store (--store or MLPROF_STORE)")
        store = SessionStore(context.store)
        paths: list[Path] = []
        # XProf captures or torch.profiler traces: one kind read, the other skipped (said).
        sessions, other_kind = one_kind_of_run(store.run_sessions(run_id), spec)
        for r in sessions[-newest:] if newest else sessions:  # run:<id>~N: the N newest
            for name in run_session_files(r):
                try:
                    # A remote store's session is read from a local copy, as a local one.
                    path = store.local_copy_file(r.id, name)
                except ValueError:
                    continue  # not a plain file name: session.json is the workload's too
                except OSError as exc:
                    raise InputError(
                        f"{spec}: cannot read session {r.id} from {store.url} ({exc})"
                    ) from None
                if path is not None:
                    paths.append(path)
        if not paths:
            raise InputError(f"{spec}: no captures of run {run_id!r} in {store.url}")
        described = {"spec": spec, "kind": "run", "run_id": run_id}
        if other_kind:
            described["skipped"] = other_kind
        return paths, described
    path = existing_input(spec, context.store)
    if path.is_dir():
        paths = find_captures(path) or find_traces(path)  # XProf's, else torch.profiler's
        if not paths:
            raise InputError(f"{path}: no XProf captures ({CAPTURES_NAMED}) in this directory")
        shown = str(path)
        url = context.store or ""
        if path != Path(spec) and "://" in url and not url.startswith("file://"):
            shown = f"{url.rstrip('/')}/plugins/profile/{spec}"  # not the local copy's path
        return paths, {"spec": spec, "kind": "session", "path": shown}
    return [path], {"spec": spec, "kind": "capture", "path": str(path)}


def baseline_summary(
    comparisons: dict[str, Comparison], spec: str, session: str | None, reason: str
) -> BaselineSummary:
    """The report's ``baseline``: per-kind comparisons and the top regression of all."""
    # The step view answers first (it holds device work and host phases); a narrower
    # kind's regression leads only when the step view has none.
    tops = [
        (kind, c, entry)
        for kind, c in comparisons.items()
        if (entry := c.top_regression) is not None
    ][:1]
    out: BaselineSummary = {
        "spec": spec,
        "session": session,
        "reason": reason,
        "comparisons": {k: c.to_json(top=BASELINE_TOP) for k, c in comparisons.items()},
        "top_regression": None,
    }
    first = next(iter(comparisons.values()), None)
    if first is not None:
        verdict = first.step_verdict
        out["step_time_change_pct"] = (
            verdict.change_pct
            if verdict.change_pct is not None
            else first.step_time()["change_pct"]
        )
        # compare.py writes its JSON as plain dicts: these are their shapes.
        out["step_verdict"] = cast(StepVerdict, verdict.to_json())
    if tops:
        kind, comparison, entry = tops[0]
        out["kind"] = kind
        out["normalisation"] = comparison.normalisation
        out["steps"] = min(len(comparison.base.steps), len(comparison.head.steps))
        out["noise_floor_pts"] = comparison.noise_floor_pts
        out["top_regression"] = cast(Regression, entry.to_json())
    return out


def _compare_kinds(facts: CaptureFacts) -> list[Kind]:
    kinds: list[Kind] = [k for k in ("device", "host") if k in facts.graphs]
    return kinds or ["host"]


def analyze(
    spec: str,
    context: SideContext | None = None,
    *,
    baseline: str | Sequence[str] | None = None,
    baseline_session: str | None = None,
    baseline_reason: str = "given",
    xprof: bool = True,
    xprof_max_mb: float | None = None,
    memory_samples: Sequence[dict[str, Any]] = (),
    history: Sequence[float] | None = None,
    replicates: Sequence[str] = (),
    history_specs: Sequence[str] = (),
) -> Report:
    """Analyse what ``spec`` names; compare against ``baseline`` when one is given.

    ``baseline``: one spec, or several (replicates: one capture each, whose spread is the
    noise between captures); ``replicates``: what ``spec`` holds as such captures (an
    alert's session of several), compared one by one instead of as one side.
    ``xprof``: run the XProf converters whose facts the capture can have, unless it is
    over ``xprof_max_mb`` (default: the setting ``MLPROF_REPORT_XPROF_MAX_CAPTURE_MB``).
    ``history``: earlier runs' median step (ns); their spread judges the step time.
    ``history_specs``: earlier runs of the workload (one capture each), whose frames'
    spread between them joins the comparison's between-run noise.
    """
    context = context or SideContext()
    paths, described = capture_paths(spec, context)
    started = time.perf_counter()
    if all(is_torch_trace(p) for p in paths):  # torch.profiler traces: their own reader
        from exporter.analysis.facts.torch_traces import trace_facts

        facts = trace_facts(paths, memory_samples)
    else:
        facts = gather_facts(
            paths, xprof=xprof, memory_samples=memory_samples, xprof_max_mb=xprof_max_mb
        )
    xprof_s = float(facts.xprof.get("seconds", 0.0))
    timings = {"facts_s": round(time.perf_counter() - started - xprof_s, 3), "xprof_s": xprof_s}
    started = time.perf_counter()
    comparisons: dict[str, Comparison] = {}
    summary = None
    if baseline is not None:
        kinds: list[Kind] = _compare_kinds(facts)
        base_specs = [baseline] if isinstance(baseline, str) else list(baseline)
        head_specs = list(replicates) or [str(paths[0]) if len(paths) == 1 else spec]
        bases = [_load_kinds(one, kinds, context, facts) for one in base_specs]
        read = [k for k in kinds if all(k in b for b in bases)]
        heads = [_load_kinds(one, read, context, facts) for one in head_specs]
        # An earlier run that cannot be read is left out of the history, not the report.
        earlier = [_load_kinds(one, read, context, CaptureFacts()) for one in history_specs]
        timings["load_s"] = round(time.perf_counter() - started, 3)
        pairs: dict[str, tuple[list[Side], list[Side]]] = {
            k: ([b[k] for b in bases], [h[k] for h in heads])
            for k in read
            if all(k in h for h in heads)
        }
        histories: dict[str, list[Side]] = {k: [e[k] for e in earlier if k in e] for k in pairs}
        if "device" in pairs and "host" in pairs:
            # The step view first: what explains the step, device work and host phases.
            joined = (
                [join_step_view(b["device"], b["host"]) for b in bases],
                [join_step_view(h["device"], h["host"]) for h in heads],
            )
            if all(side.scope == "step" for side in [*joined[0], *joined[1]]):
                pairs = {"step": joined, **pairs}
                steps = [join_step_view(e["device"], e["host"]) for e in earlier
                         if "device" in e and "host" in e]  # fmt: skip
                histories["step"] = [e for e in steps if e.scope == "step"]
        for kind, (base_sides, head_sides) in pairs.items():
            begun = time.perf_counter()
            try:
                comparisons[kind] = compare_sides(
                    base_sides, head_sides, history=history, history_sides=histories[kind]
                )
            except ValueError as exc:
                facts.unavailable[f"baseline_{kind}"] = str(exc)
            timings[f"compare_{kind}_s"] = round(time.perf_counter() - begun, 3)
        shown = " + ".join(base_specs)  # as a comparison's spec joins its replicates'
        summary = baseline_summary(comparisons, shown, baseline_session, baseline_reason)
    findings = apply_rules(facts, summary)
    timings["compare_s"] = round(time.perf_counter() - started, 3)
    return Report(described, facts, findings, summary, comparisons, timings=timings)


def _load_kinds(
    spec: str, kinds: list[Kind], context: SideContext, facts: CaptureFacts
) -> dict[Kind, Side]:
    """Every kind of ``spec`` that can be read (each capture once); the rest noted."""
    try:
        return load_sides(spec, kinds, context)
    except InputError:
        found: dict[Kind, Side] = {}
        for kind in kinds:  # one kind missing must not lose the others
            try:
                found[kind] = load_side(spec, kind, context)
            except InputError as exc:
                facts.unavailable[f"baseline_{kind}"] = str(exc)
        return found
