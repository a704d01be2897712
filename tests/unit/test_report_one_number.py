"""One number per fact (issue 29, item 6): a regression's title names its program, and
one "XProf step time" holds across the summary, the key numbers, the text and the JSON."""

from __future__ import annotations

import json
import random
import re

from exporter.analysis.compare.comparison import compare_sides
from exporter.analysis.facts.capture import CaptureFacts
from exporter.analysis.report import rules
from exporter.analysis.report.document import Report, baseline_summary
from exporter.analysis.report.render import comparison_text, report_html, report_text
from exporter.analysis.sides.load import Side
from exporter.profiles.flamegraph import FlameGraph

# The step's own program and a new one hold an op of the same name, as XLA names ops per
# module (a transformer's jit_block_step and a new jit_extra_work both had a ynn_fusion).
STEP = {("jit_step", "ynn_fusion"): 4e6, ("jit_step", "dot.1"): 5e6, ("jit_step", "copy"): 1e6}
ADDED = {("jit_extra_work", "while.5", "ynn_fusion"): 1.5e6}


def side(ops: dict[tuple[str, ...], float], seed: int, name: str) -> Side:
    rng = random.Random(seed)
    graphs = []
    for _ in range(20):
        graph = FlameGraph(sample_type="device_time", unit="nanoseconds")
        for stack, ns in ops.items():
            graph.add(list(stack), round(ns * (1 + rng.uniform(-0.03, 0.03))))
        graphs.append(graph)
    whole = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for g in graphs:
        whole.merge(g)
    return Side(name, "capture", "device", whole, graphs, [g.root.total for g in graphs],
                "device_steps")  # fmt: skip


def test_frame_label_names_the_program_or_the_thread() -> None:
    from exporter.analysis.compare.comparison import frame_label

    assert frame_label(["jit_extra_work", "while.5", "ynn_fusion"]) == "jit_extra_work > ynn_fusion"
    assert frame_label(["jit_step", "copy"]) == "jit_step > copy"
    assert frame_label(["jit_extra_work"]) == "jit_extra_work"
    # The step view's host part: the thread, not the "host" frame above every thread.
    assert frame_label(["host", "python", "train", "load_batch"]) == "python > load_batch"
    assert frame_label(["host", "python"]) == "python"


def test_a_new_ops_title_names_its_program_in_text_html_and_json() -> None:
    comparison = compare_sides(side(STEP, 1, "base"), side(STEP | ADDED, 2, "head"))
    top = comparison.top_regression
    assert top is not None and top.new and top.frame.name == "ynn_fusion"
    data = comparison.to_json()
    first = data["regressions"][0]
    assert first["frame"] == "jit_extra_work;while.5;ynn_fusion"
    assert first["label"] == "jit_extra_work > ynn_fusion"
    # The text table names it as the JSON does (it showed "…;while.5;ynn_fusion").
    table = comparison_text(comparison).split("Regressions")[1]
    assert "jit_extra_work > ynn_fusion" in table.splitlines()[3]

    baseline = baseline_summary({"device": comparison}, "base", "s-good", "given")
    found = rules.apply_rules(CaptureFacts(backend="cpu"), baseline)
    lead = found[0]
    assert lead.rule == "BaselineRegressionRule"
    # It said "ynn_fusion: new work, ..." though jit_step has a ynn_fusion too.
    assert ": jit_extra_work > ynn_fusion: new work, +" in lead.title
    assert "jit_extra_work > ynn_fusion" in lead.suggestion
    report = Report({"spec": "head"}, CaptureFacts(backend="cpu"), found, baseline,
                    {"device": comparison})  # fmt: skip
    page = report_html(report)
    assert "jit_extra_work &gt; ynn_fusion: new work" in page  # the finding
    assert "<td>jit_extra_work &gt; ynn_fusion</td>" in page  # the baseline's table
    assert "[P" in report_text(report) and lead.title in report_text(report)
    saved = json.loads(json.dumps(report.to_json()))
    assert saved["findings"][0]["title"] == lead.title
    assert saved["baseline"]["top_regression"]["label"] == "jit_extra_work > ynn_fusion"


def test_a_report_before_labels_keeps_its_name() -> None:
    baseline = baseline_summary(
        {"device": compare_sides(side(STEP, 1, "base"), side(STEP | ADDED, 2, "head"))},
        "base", "s-good", "given",
    )  # fmt: skip
    assert baseline["top_regression"] is not None
    del baseline["top_regression"]["label"]  # an analysis.json written before the key
    lead = rules.apply_rules(CaptureFacts(backend="cpu"), baseline)[0]
    assert ": ynn_fusion: new work" in lead.title


def _facts(xprof_average: float | None) -> CaptureFacts:
    facts = CaptureFacts(
        backend="cpu",
        files=["h.xplane.pb"],
        steps={"count": 24, "mean_ms": 270.0, "median_ms": 66.0, "p90_ms": 400.0,
               "min_ms": 50.0, "max_ms": 900.0, "stdev_ms": 200.0, "cv": 0.7,
               "outliers": 0, "cycle_mean_ms": 270.0, "source": "host_step_annotations",
               "xprof_mean_ms": 268.8},
    )  # fmt: skip
    if xprof_average is not None:
        facts.xprof = {
            "available": True,
            "tools": {
                "input_pipeline_analyzer": {
                    "summary": {
                        "hardware_type": "CPU_ONLY",
                        "steps": 22,
                        "step_time_ms": {"average": xprof_average},
                    }
                }
            },
        }
    return facts


def _xprof_figures(text: str) -> set[str]:
    """Every figure the text calls XProf's step time."""
    return set(re.findall(r"XProf(?:'s)? step time[^0-9]*([0-9.]+) ms", text))


def test_one_xprof_step_time_on_the_page_and_in_the_text() -> None:
    report = Report({"spec": "s"}, _facts(66.1), [])
    page = report_html(report)
    # Summary and Key numbers both quote XProf's converter (the summary said 268.8, our
    # own mean without the first and last step, and called it XProf's).
    assert _xprof_figures(page.replace("</th><td>", " ")) == {"66.1"}
    assert _xprof_figures(report.summary) == {"66.1"}
    assert "input_pipeline_analyzer" in report.summary
    assert _xprof_figures(report_text(report)) == {"66.1"}
    assert report.to_json()["summary"] == report.summary


def test_without_xprofs_converter_our_own_figure_is_labelled_ours() -> None:
    report = Report({"spec": "s"}, _facts(None), [])
    assert not _xprof_figures(report.summary) and not _xprof_figures(report_html(report))
    assert "mean without each capture's first and last step" in report.summary
    assert "268.8 ms" in report.summary
