"""Comparisons and reports as text tables and self-contained HTML pages.

The differential flame graph (``diff.html``) colours each frame by how its share of its
own side's total moved (red grew, green shrank, grey within the noise floor), outlines
the large and significant changes, and shows both sides' self and total with the
significance on hover. The report page (``report.html``) has the status banner, the
summary, key numbers, findings, the baseline's top changes, and the flame graphs (and
the differential one) embedded as ``srcdoc`` frames: one file, no external resources.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any, Final

from exporter.analysis.compare.comparison import Comparison, Entry
from exporter.analysis.report.document import Report, xprof_step_time
from exporter.analysis.report.rules import vocabulary
from exporter.profiles.flamegraph import format_value
from exporter.profiles.html import flame_graph_page, render_html, script_json

__all__ = [
    "EMBED_MAX_FRAMES",
    "comparison_html",
    "comparison_text",
    "report_html",
    "report_text",
]

# Frames drawn in an HTML page: enough for every frame a reader can see at full width,
# few enough that a page stays a few hundred kilobytes.
EMBED_MAX_FRAMES: Final = 2000
# In share mode the page greys frames within the noise floor; per step, within this.
PER_STEP_COLOUR_FLOOR_PTS: Final = 0.5


def _entry_row(entry: Entry, unit: str, per_step: bool) -> list[str]:
    v = entry.values
    basis = entry.basis
    q = "-" if entry.q_value is None else f"{entry.q_value:.2g}"
    grew = entry.excess_ms > 0 if per_step else entry.delta_pts > 0
    verdict = (
        ("REGRESSION" if grew else "IMPROVEMENT")
        if entry.regression
        else ("wait" if entry.wait else ("significant" if entry.significant else ""))
    )
    if entry.regression and entry.new:
        verdict += " (new)"
    # The title's own name (program > op), so text, page and JSON name a frame alike.
    name = entry.label + (" (total)" if basis == "total" else "")
    if per_step and unit == "nanoseconds":
        explains = "-" if entry.explains_pct is None else f"{entry.explains_pct:.0f}%"
        return [
            name,
            f"{entry.base_ms:.3f}",
            f"{entry.head_ms:.3f}",
            f"{entry.excess_ms:+.3f}",
            f"{entry.step_pct:+.1f}%",
            explains,
            f"{entry.delta_pts:+.2f}",
            q,
            verdict,
        ]
    return [
        name,
        f"{v[f'{basis}_base_pct']:.2f}%",
        f"{v[f'{basis}_head_pct']:.2f}%",
        f"{entry.delta_pts:+.2f}",
        format_value(v[f"{basis}_base"], unit),
        format_value(v[f"{basis}_head"], unit),
        q,
        verdict,
    ]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def comparison_text(comparison: Comparison, top: int = 20) -> str:
    """The comparison as text: the step-time verdict, then what explains the change."""
    data = comparison.to_json(top=top)
    unit = data["unit"]
    per_step = data["normalisation"] == "per_step"
    per = " per step" if per_step else ""
    view = {"step": "step view (device work and host phases)"}.get(data["view"], data["view"])
    # The tables below show ms per step when the values are nanoseconds per step: the
    # header names what the columns hold, not the profile's raw unit.
    shown = "ms per step" if per_step and unit == "nanoseconds" else unit
    out = [
        f"{view}, {data['sample_type']} ({shown}), normalisation {data['normalisation']}",
        f"  base {data['base']['spec']}: {data['base']['steps']} steps",
        f"  head {data['head']['spec']}: {data['head']['steps']} steps",
    ]
    if per_step:
        out.append("  " + comparison.step_verdict.sentence())
        noise = data["noise"]
        scale = comparison.step_verdict.scale
        if scale is not None:
            out.append(
                f"  machine-wide scale x{scale:.3f} (head/base time of the work both ran, or "
                "of the frames that agree); excess = head - scale x base"
            )
        between = noise["between_runs"]
        if between["measured"]:
            nb, nh = between["replicates"]
            runs = between.get("history_runs") or 0
            among = f"the {nb} + {nh} captures" + (
                f" and {runs} earlier runs of the workload" if runs else ""
            )
            out.append(
                f"  a regression: q < {noise['fdr_alpha']:g} (Student's t between {among}, "
                f"each against the rest of its own work; new work: Mann-Whitney "
                f"U across steps; Benjamini-Hochberg) and excess >= "
                f"{noise['min_new_step_pct']:g} % of the step for new work, >= "
                f"{between['min_replicate_step_pct']:g} % and "
                f"{noise['min_relative_change_pct']:g} % of its own time for work that grew"
            )
        else:
            out.append(
                f"  a regression: q < {noise['fdr_alpha']:g} (Mann-Whitney U across steps, "
                f"Benjamini-Hochberg) and excess >= {noise['min_new_step_pct']:g} % of the step "
                f"for new work, >= {noise['min_grown_step_pct']:g} % and "
                f"{noise['min_relative_change_pct']:g} % of its own time for work that grew "
                f"(noise of the {noise['noise_view']} view; one capture a side: between-run "
                "noise not measured)"
            )
        out.append("  " + detectable_sentence(data["min_detectable"]))
    else:
        out.append(
            f"  no steps on both sides: a change counts beyond {data['noise']['noise_floor_pts']:g}"
            " pts of share"
        )
    out.extend(f"  note: {n}" for n in data["notes"])
    if per_step and unit == "nanoseconds":
        header = ["frame", "base ms", "head ms", "excess ms", "of step", "explains",
                  "Δ pts", "q", "verdict"]  # fmt: skip
    else:
        header = ["frame", "base", "head", "Δ pts", f"base{per}", f"head{per}", "q", "verdict"]
    for title, entries in (
        ("Regressions", comparison.regressions),
        ("Improvements", comparison.improvements),
    ):
        shown = entries[:top]
        out.append("")
        what = "time per step" if per_step else "share of each side's total"
        out.append(f"{title} ({what}):")
        rows = [_entry_row(e, unit, per_step) for e in shown]
        out.append(_table(rows, header) if shown else "  none")
    return "\n".join(out) + "\n"


def detectable_sentence(md: dict[str, Any]) -> str:
    """``min_detectable`` in one line: the smallest change these captures could show."""
    if md.get("new_frame_excess_pct") is None:
        return f"smallest detectable change: {md.get('basis') or 'none (no steps)'}"
    nb, nh = md["captures"]
    step = "beyond reach" if md["step_change_pct"] is None else f"±{md['step_change_pct']:g} %"
    frame = (
        "beyond reach"
        if md["frame_excess_pct"] is None
        else f"{md['frame_excess_ms']:.3g} ms/step ({md['frame_excess_pct']:g} % of the step)"
    )
    line = (
        f"smallest change {nb} + {nh} captures could show (false alarms "
        f"{100 * md['false_alarm_rate']:g} %): step {step} (as a ratio), a frame's excess "
        f"{frame}, new work {md['new_frame_excess_pct']:g} %"
    )
    needed = md["captures_for_5pct"]
    if md["between_run_noise"] != "measured":
        return line + "; between-run noise not measured (one capture a side)"

    def n(value: int | None) -> str:
        return "more than 64" if value is None else str(value)

    return line + (
        f"; captures a side for 5 %: step {n(needed['step'])}, a frame {n(needed['frame'])}"
    )


def _diff_tree(comparison: Comparison, max_frames: int) -> dict[str, Any]:
    tree = comparison.tree.truncated(max_frames)
    bs, bt, hs, ht = tree.means()
    per_step = comparison.normalisation == "per_step"
    flagged = {
        (e.frame.index, e.basis): (1 if (e.excess_ms if per_step else e.delta_pts) > 0 else -1)
        for e in [*comparison.regressions, *comparison.improvements]
        if e.regression
    }

    # Per step the page colours by excess time per step (head - scale x base), the number
    # the verdicts use: by share, unchanged work beside a regression read "shrank".
    scale = comparison.step_verdict.scale or 1.0

    def build(node: Any) -> dict[str, Any]:
        i = node.index
        out: dict[str, Any] = {
            "n": node.name,
            "bs": round(float(bs[i]), 1),
            "bt": round(float(bt[i]), 1),
            "hs": round(float(hs[i]), 1),
            "ht": round(float(ht[i]), 1),
        }
        if per_step:
            out["ex"] = round(float(ht[i] - scale * bt[i]), 1)
        if node.file:
            out["f"] = f"{node.file}:{node.line}" if node.line else node.file
        source = node.source
        test = comparison.tests.get(("self", source)) or comparison.tests.get(("total", source))
        if test is not None:
            out["p"], out["q"] = float(f"{test[0]:.3g}"), float(f"{test[1]:.3g}")
            out["sig"] = bool(comparison.verdict_possible and test[1] < _alpha())
        reg = flagged.get((source, "self")) or flagged.get((source, "total"))
        if reg:
            out["reg"] = reg
        return out

    root = build(tree.root)
    stack = [(tree.root, root)]
    while stack:
        node, out = stack.pop()
        kids = sorted(node.children.values(), key=lambda c: -(bt[c.index] + ht[c.index]))
        built = [build(c) for c in kids]
        if built:
            out["c"] = built
        stack.extend(zip(kids, built, strict=True))
    return root


def _alpha() -> float:
    from exporter.analysis.compare.noise import FDR_ALPHA

    return FDR_ALPHA


def comparison_html(comparison: Comparison, title: str | None = None) -> str:
    """The differential flame graph page of ``comparison``."""
    template = resources.files("exporter.analysis.report").joinpath("diff.html").read_text("utf-8")
    data = comparison.to_json(top=0)
    view = "step view" if data["view"] == "step" else data["kind"]
    title = title or f"{view} diff: {comparison.base.spec} → {comparison.head.spec}"
    per = "mean per step" if comparison.normalisation == "per_step" else "whole capture"
    step = data["step_verdict"]
    meta = (
        f"{data['sample_type']} ({data['unit']}), values {per}, shares of each side's own "
        f"total; base {comparison.base.spec} ({data['base']['steps']} steps), head "
        f"{comparison.head.spec} ({data['head']['steps']} steps)"
    )
    if step["change_pct"] is not None:
        # The verdict's own statistic (medians), as the text says it: one number per fact.
        meta += f"; median step {step['change_pct']:+.1f}% ({step['verdict']})"
    if comparison.normalisation == "per_step":
        meta += "; " + detectable_sentence(data["min_detectable"])
    floor = comparison.noise_floor_pts
    payload = {
        "title": title,
        "meta": meta,
        "unit": data["unit"],
        "colourFloorPts": floor if floor is not None else PER_STEP_COLOUR_FLOOR_PTS,
        # Per step: colour by excess per step, neutral within this share of the step.
        "colourBy": "excess" if comparison.normalisation == "per_step" else "share",
        "stepValue": (comparison.step_verdict.scale or 1.0)
        * (comparison.step_verdict.base_median_ms or 0.0)
        * (1e6 if comparison.tree.unit == "nanoseconds" else 1.0),
        "excessFloorPct": PER_STEP_COLOUR_FLOOR_PTS,
        "untested": "not tested (no steps on both sides)"
        if comparison.normalisation == "share"
        else "not tested (too small on both sides to be a regression)",
        "root": _diff_tree(comparison, EMBED_MAX_FRAMES),
    }
    return flame_graph_page(template, title, payload)


def _esc(value: object) -> str:
    return html.escape(str(value))


def _numbers(report: Report) -> str:
    f = report.facts
    rows: list[tuple[str, str]] = [("backend", f.backend.upper()), ("captures", str(len(f.files)))]
    if f.steps:
        s = f.steps
        rows += [
            ("steps", f"{s['count']} ({s.get('source', '')})"),
            (
                "step time",
                f"median {s['median_ms']:.2f} ms, mean {s['mean_ms']:.2f} ms, "
                f"p90 {s['p90_ms']:.2f} ms, CV {s['cv']:.2f}",
            ),
        ]
    if f.breakdown:
        b = f.breakdown
        words = vocabulary(f)  # XLA's, or PyTorch's for torch.profiler traces
        rows += [
            (f"{words.work} computing", f"{b['xla_pct']:.1f}% of step time"),
            (
                f"no {words.work} running (input wait)",
                f"{b['input_wait_pct']:.1f}% (data phase "
                f"{b['data_phase_pct']:.1f}%, between steps {b['between_steps_pct']:.1f}%, "
                f"other host {b['host_other_pct']:.1f}%)",
            ),
        ]
    if f.top_ops:
        rows.append(
            ("top ops", ", ".join(f"{o['name']} {o['share_pct']:.1f}%" for o in f.top_ops[:5]))
        )
    if f.compiler:
        rows.append(("data formatting", f"{f.compiler['data_formatting_pct']:.1f}% of XLA time"))
    if f.recompilation:
        r = f.recompilation
        rows.append(("compilations", f"{r['compilations']} ({r['in_steps']} inside steps)"))
    if f.memory:
        m = f.memory
        rows.append(("device memory peak", f"{m['peak_pct']:.1f}% of capacity ({m['source']})"))
    if (measured := xprof_step_time(f.xprof)) is not None:
        # The summary's own sentence: one "XProf step time" on the page.
        rows.append(("XProf step time", measured.removeprefix("XProf step time ")))
    rows += _program_rows(f)
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f'<table id="numbers">{body}</table>' + _program_tables(f)


def _program_rows(f: Any) -> list[tuple[str, str]]:
    """Key numbers from the roofline and the peak allocations (program_facts)."""
    rows: list[tuple[str, str]] = []
    r = f.roofline or {}
    if r.get("available"):
        bw = r.get("hbm_bw_utilization_pct")
        mxu = r.get("mxu_utilization_pct")
        rows.append(
            (
                "roofline",
                f"{r['bound_by']}-bound, {r['bottleneck_operational_intensity_flop_per_byte']:.1f}"
                f" FLOP/B (ridge {r.get('ridge_point_flop_per_byte') or 0:.1f}); "
                f"{r['achieved_flop_rate_gflops']:.0f} of {r['peak_flop_rate_gflops']:.0f} "
                f"GFLOP/s ({r['compute_efficiency_pct']:.1f}%)"
                + (f", HBM {bw:.0f}% of peak" if bw is not None else "")
                + (f", MXU {mxu:.1f}%" if mxu else "")
                + f"; custom calls {r['custom_call_share_pct']:.1f}% of device time (0 FLOPs "
                "in XLA's cost model)",
            )
        )
    peak = f.peak_allocations or {}
    if peak.get("available") and peak.get("largest"):
        rows.append(
            (
                "largest buffers at the peak",
                f"{peak['largest'][0]['module']}: "
                + ", ".join(
                    f"{b['instruction']} {format_value(b['bytes'], 'bytes')}"
                    + (f" {b['shape']}" if b.get("shape") else "")
                    for b in peak["largest"][:3]
                ),
            )
        )
    return rows


def _neighbours(hood: dict[str, Any] | None) -> list[tuple[str, str]]:
    """("producers" | "consumers", "a (opcode, shape), b (...), +N more") of one op's HLO
    neighbourhood (neighbourhood.py); none where it has none (its reason is in
    ``unavailable``). Plain text: the HTML table escapes it, the text report prints it."""
    if not hood:
        return []
    out = []
    for side in ("producers", "consumers"):
        shown = hood.get(side) or []
        total = int(hood.get(f"{side}_total") or len(shown))
        parts = [
            f"{n['name']} ({n['opcode']}"
            + (f", {n['shape']}" if n.get("shape") else "")
            + (f", {n['share_pct']:.1f}%" if n.get("share_pct") is not None else "")
            + ")"
            for n in shown
        ]
        if total > len(shown):
            # At most MAX_NEIGHBOURS are kept: say how many were left out, not nothing.
            parts.append(f"+{total - len(shown)} more")
        out.append((side, ", ".join(parts) or "none"))
    return out


def _neighbourhood_cell(hood: dict[str, Any] | None) -> str:
    pairs = _neighbours(hood)
    if not pairs:
        return '<td class="neighbourhood">-</td>'
    items = "".join(
        f'<li data-side="{side}"><span class="label">{side}:</span> {_esc(text)}</li>'
        for side, text in pairs
    )
    return f'<td class="neighbourhood"><ul>{items}</ul></td>'


def _program_tables(f: Any) -> str:
    """The op-category table, the top ops with their source lines and HLO neighbourhood,
    the data-formatting ops with theirs, the peak buffers."""
    out = []
    c = f.op_categories
    if c:
        body = "".join(
            f'<tr><td>{_esc(r["category"])}</td><td class="num">{r["share_pct"]:.1f}%</td>'
            f'<td class="num">{r["self_ms"]:.3f}</td><td>{_esc(r["top_op"] or "")}</td></tr>'
            for r in c["rows"]
            if r["self_ms"] > 0
        )
        out.append(
            f"<h3>Op categories ({_esc(c['denominator'])})</h3>"
            '<table id="op-categories"><tr><th>category</th><th>share</th><th>ms</th>'
            f"<th>top op</th></tr>{body}</table>"
        )
    if f.top_ops:
        body = "".join(
            f'<tr><td>{_esc(o["name"])}</td><td class="num">{o["share_pct"]:.1f}%</td>'
            f"<td>{_esc(o.get('category') or '')}</td><td>{_esc(o.get('source') or '')}</td>"
            f"{_neighbourhood_cell(o.get('neighbourhood'))}</tr>"
            for o in f.top_ops
        )
        out.append(
            '<h3>Top ops</h3><table id="top-ops"><tr><th>op</th><th>share</th>'
            "<th>category</th><th>source</th><th>HLO neighbourhood (radius 1)</th></tr>"
            f"{body}</table>"
        )
    formatting = [o for o in (f.compiler or {}).get("ops") or [] if o.get("neighbourhood")]
    if formatting:
        # What each copy / transpose / convert sits between: where the layout changes.
        body = "".join(
            f'<tr><td>{_esc(o["name"])}</td><td class="num">{o["self_ms"]:.3f}</td>'
            f"{_neighbourhood_cell(o['neighbourhood'])}</tr>"
            for o in formatting
        )
        out.append(
            '<h3>Data-formatting ops</h3><table id="formatting-ops"><tr><th>op</th><th>ms</th>'
            f"<th>HLO neighbourhood (radius 1)</th></tr>{body}</table>"
        )
    out.append(_kernel_table(f.gpu_kernels or {}))
    peak = f.peak_allocations or {}
    if peak.get("available") and peak.get("largest"):
        body = "".join(
            f"<tr><td>{_esc(b['module'])}</td><td>{_esc(b['instruction'])}</td>"
            f'<td class="num">{_esc(format_value(b["bytes"], "bytes"))}</td>'
            f"<td>{_esc(b.get('shape') or '')}</td><td>{_esc(b.get('source') or '')}</td></tr>"
            for b in peak["largest"]
        )
        out.append(
            "<h3>Largest buffers at the memory peak (XProf memory viewer)</h3>"
            '<table id="peak-allocations"><tr><th>module</th><th>instruction</th><th>size</th>'
            f"<th>shape</th><th>source</th></tr>{body}</table>"
        )
    return "".join(out)


def _launch_text(k: dict[str, Any]) -> str:
    """One launch configuration, as CUDA writes it: grid x block, registers, shared."""
    if not k:
        return ""
    occupancy = k.get("occupancy_pct")
    shared = k["static_shared_memory_bytes"] + k["dynamic_shared_memory_bytes"]
    return (
        f"grid {','.join(map(str, k['grid']))} block {','.join(map(str, k['block']))}, "
        f"{k['registers_per_thread']} regs, {shared} B shared"
        + (f", occupancy {occupancy:g}%" if occupancy is not None else "")
    )


def _launch_overhead_text(launch: dict[str, Any]) -> str:
    if not launch.get("available"):
        return f"launch overhead unknown: {launch.get('reason', '')}"
    per_step = launch.get("per_step")
    share = (
        f"{per_step['share_of_step_pct']:.1f}% of step time, "
        f"{per_step['launch_overhead_ms_per_step']:.3f} ms per step"
        if per_step
        else f"{launch['share_pct']:.1f}% of the kernels' span"
    )
    return (
        f"launch overhead {launch['launch_overhead_ms']:.3f} ms ({share}); {launch['gaps']} "
        f"gaps between kernels ({launch['launch_gaps']} waiting for a launch under way, "
        f"{launch['host_gaps']} for the host to begin one), median {launch['median_gap_us']} us"
    )


def _kernel_table(g: dict[str, Any]) -> str:
    """The GPU kernels by total time, with launch configuration and launch latency."""
    if not g.get("available"):
        return ""
    body = "".join(
        f"<tr><td>{_esc(k['name'])}</td><td>{_esc(k.get('hlo_op') or '')}</td>"
        f'<td class="num">{k["occurrences"]}</td><td class="num">{k["total_ms"]:.3f}</td>'
        f'<td class="num">{k["mean_us"]:.2f}</td><td class="num">{k["share_pct"]:.1f}%</td>'
        f"<td>{_esc(_launch_text(k.get('launch') or {}))}</td>"
        f'<td class="num">{_esc(k.get("launch_latency_mean_us") or "")}</td></tr>'
        for k in g["kernels"]
    )
    return (
        f"<h3>GPU kernels ({g['kernel_count']} kernels, {g['distinct_kernels']} distinct, "
        f"{g['total_ms']:.3f} ms; share of {_esc(g['denominator'])})</h3>"
        f'<p id="launch-overhead">{_esc(_launch_overhead_text(g["launch_overhead"]))}</p>'
        '<table id="gpu-kernels"><tr><th>kernel</th><th>HLO op</th><th>count</th>'
        "<th>total ms</th><th>mean us</th><th>share</th><th>launch configuration</th>"
        f"<th>launch latency us</th></tr>{body}</table>"
    )


def _findings(report: Report) -> str:
    if not report.findings:
        return '<p class="finding-none">No finding crossed a threshold.</p>'
    out = []
    for finding in report.findings:
        evidence = "".join(
            f'<tr><th>{_esc(k)}</th><td class="num">{_esc(v)}</td></tr>'
            for k, v in finding.evidence.items()
        )
        out.append(
            f'<div class="finding {finding.priority}" data-priority="{finding.priority}" '
            f'data-rule="{_esc(finding.rule)}">'
            f'<h3><span class="priority">{finding.priority}</span>{_esc(finding.title)}</h3>'
            f"<p>{_esc(finding.detail)}</p>"
            f'<table class="evidence">{evidence}</table>'
            f'<p><span class="label">Impact:</span> {_esc(finding.impact)}</p>'
            f'<p><span class="label">Suggestion:</span> {_esc(finding.suggestion)}</p></div>'
        )
    return "".join(out)


def _frame(page: str, name: str) -> str:
    source = html.escape(page, quote=True)
    return f'<iframe title="{_esc(name)}" data-name="{_esc(name)}" srcdoc="{source}"></iframe>'


def _baseline(report: Report) -> str:
    base = report.baseline
    if not base:
        return ""
    out = [
        "<h2>Against the baseline</h2>",
        f'<p id="baseline">Baseline {_esc(base.get("session") or base.get("spec"))} '
        f"({_esc(base.get('reason'))}).</p>",
    ]
    for kind, comparison in report.comparisons.items():
        per_step = comparison.normalisation == "per_step" and comparison.tree.unit == "nanoseconds"
        rows = "".join(
            "<tr>"
            + "".join(f"<td>{_esc(c)}</td>" for c in _entry_row(e, comparison.tree.unit, per_step))
            + "</tr>"
            for e in comparison.regressions[:5]
        )
        names = (
            ("frame", "base ms", "head ms", "excess ms", "of step", "explains", "Δ pts", "q",
             "verdict")
            if per_step
            else ("frame", "base", "head", "Δ pts", "base value", "head value", "q", "verdict")
        )  # fmt: skip
        header = "".join(f"<th>{h}</th>" for h in names)
        out.append(f"<h3>{_esc(kind)}: top growth</h3>")
        if comparison.normalisation == "per_step":
            out.append(f"<p>{_esc(comparison.step_verdict.sentence())}</p>")
        kind_attr = _esc(kind)
        out.append(
            f'<table class="baseline-table" data-kind="{kind_attr}"><tr>{header}</tr>{rows}</table>'
        )
        out.append(_frame(comparison_html(comparison), f"diff-{kind}"))
    return "".join(out)


def _graphs(report: Report) -> str:
    out = []
    for kind, graph in report.facts.graphs.items():
        shown = graph.truncated(EMBED_MAX_FRAMES)
        out.append(f"<h2>Flame graph: {_esc(kind)} ({_esc(graph.sample_type)})</h2>")
        out.append(_frame(render_html(shown, f"{kind} time"), f"flamegraph-{kind}"))
    return "".join(out)


def report_html(report: Report, title: str | None = None) -> str:
    """The ``summary.html`` page of ``report``."""
    template = (
        resources.files("exporter.analysis.report").joinpath("report.html").read_text("utf-8")
    )
    data = report.to_json()
    title = title or f"mlprof report: {report.input.get('spec', '')}"
    counts = report.counts()
    spec = report.input.get("spec", "")
    subtitle = f"{counts['P0']} P0 · {counts['P1']} P1 · {counts['P2']} P2 — {spec}"
    links = "".join(
        f'<a href="{_esc(url)}" data-link="{_esc(name)}">{_esc(name)}</a> '
        for name, url in report.links.items()
    )
    unavailable = "".join(
        f'<li class="unavailable"><b>{_esc(k)}</b>: {_esc(v)}</li>'
        for k, v in report.facts.unavailable.items()
    )
    parts = {
        "__TITLE__": _esc(title),
        "__STATUS__": _esc(report.status),
        "__SUBTITLE__": _esc(subtitle),
        "__SUMMARY__": _esc(report.summary),
        "__LINKS__": f'<p id="links">{links}</p>' if links else "",
        "__NUMBERS__": _numbers(report),
        "__FINDINGS__": _findings(report),
        "__BASELINE__": _baseline(report),
        "__GRAPHS__": _graphs(report),
        "__UNAVAILABLE__": f"<ul>{unavailable}</ul>" if unavailable else "<p>Nothing.</p>",
    }
    page = template
    for key in (
        "__TITLE__",
        "__STATUS__",
        "__SUBTITLE__",
        "__SUMMARY__",
        "__LINKS__",
        "__NUMBERS__",
        "__FINDINGS__",
        "__BASELINE__",
        "__GRAPHS__",
        "__UNAVAILABLE__",
    ):
        page = page.replace(key, parts[key])
    return page.replace(
        "__DATA__", script_json({"status": data["status"], "findings": data["finding_counts"]})
    )


def report_text(report: Report) -> str:
    """The report as text: status, summary, findings."""
    lines = [f"{report.status}: {report.input.get('spec', '')}", "", report.summary, ""]
    for f in report.findings:
        lines.append(f"[{f.priority}] {f.title}")
        lines.append(f"    {f.detail}")
        evidence = ", ".join(f"{k}={v}" for k, v in f.evidence.items())
        lines.append(f"    evidence: {evidence}")
        lines.append(f"    impact: {f.impact}")
        lines.append(f"    suggestion: {f.suggestion}")
    if not report.findings:
        lines.append("No finding crossed a threshold.")
    lines.extend(_program_text(report.facts))
    for kind, reason in report.facts.unavailable.items():
        lines.append(f"not available ({kind}): {reason}")
    return "\n".join(lines) + "\n"


def _program_text(f: Any) -> list[str]:
    """Roofline, op categories, top ops' sources and peak buffers, a line each."""
    lines: list[str] = []
    for name, value in _program_rows(f):
        lines.append(f"{name}: {value}")
    if f.op_categories:
        shown = [r for r in f.op_categories["rows"] if r["share_pct"] > 0]
        lines.append(
            "op categories: "
            + ", ".join(f"{r['category']} {r['share_pct']:.1f}%" for r in shown)
            + " of device self time"
        )
    for o in f.top_ops[:5]:
        if o.get("source"):
            lines.append(f"top op {o['name']} ({o.get('category')}): {o['source']}")
        for side, text in _neighbours(o.get("neighbourhood")):
            lines.append(f"    {o['name']} {side}: {text}")
    for o in (f.compiler or {}).get("ops") or []:
        for side, text in _neighbours(o.get("neighbourhood")):
            lines.append(f"data formatting op {o['name']} {side}: {text}")
    g = f.gpu_kernels or {}
    if g.get("available"):
        lines.append(
            f"GPU kernels: {g['kernel_count']} ({g['distinct_kernels']} distinct), "
            f"{g['total_ms']:.3f} ms; {_launch_overhead_text(g['launch_overhead'])}"
        )
        for k in g["kernels"][:5]:
            launch = _launch_text(k.get("launch") or {})
            lines.append(
                f"  kernel {k['name']}{' (' + k['hlo_op'] + ')' if k.get('hlo_op') else ''}: "
                f"{k['occurrences']} x {k['mean_us']:.2f} us = {k['total_ms']:.3f} ms, "
                f"{k['share_pct']:.1f}%" + (f"; {launch}" if launch else "")
            )
    return lines
