"""Roofline, peak allocations, op categories and op sources, checked against XProf's own
CLI (``xprof get_roofline_model``, ``get_peak_allocations``, ``get_hlo_stats``) run on
copies of the same files (XProf writes caches beside its input): a real JAX CPU capture
and a TPU-shaped synthetic one."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.analysis.facts.capture import CaptureFacts, gather_facts
from exporter.analysis.facts.programs import op_category
from exporter.analysis.report.document import Report
from exporter.analysis.report.render import report_html, report_text
from exporter.analysis.report.rules import apply_rules
from exporter.testing.synthetic import write_tpu_capture
from tests.analysis_captures import AnalysisCaptures
from tests.xprof_cli import xprof_cli

pytestmark = pytest.mark.integration

WORKLOAD = "tests/integration/analysis_workload.py"


@pytest.fixture(scope="module")
def tpu(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CaptureFacts]:
    path = tmp_path_factory.mktemp("tpu") / "tpu-vm-0.xplane.pb"
    write_tpu_capture(path, devices=2, steps=6, ops_per_step=300, distinct_ops=120)
    return path, gather_facts([path])


@pytest.fixture(scope="module")
def cpu(analysis_captures: AnalysisCaptures) -> tuple[Path, CaptureFacts]:
    return analysis_captures.heavy, gather_facts([analysis_captures.heavy])


def _pct(text: str) -> float:
    return float(text.rstrip("%"))


def test_roofline_agrees_with_xprof_on_a_tpu_shaped_capture(
    tpu: tuple[Path, CaptureFacts], tmp_path: Path
) -> None:
    path, facts = tpu
    ours = facts.roofline
    assert ours is not None and ours["available"], ours
    theirs = xprof_cli("get_roofline_model", path, tmp_path)
    program, device = theirs["program"], theirs["device_info"]
    assert ours["bound_by"] == program["bound_by"] == "HBM"
    assert ours["operational_intensity_flop_per_byte"] == pytest.approx(
        program["operational_intensity_flop_per_byte"], abs=1e-3
    )
    assert ours["bottleneck_operational_intensity_flop_per_byte"] == pytest.approx(
        program["bottleneck_operational_intensity_flop_per_byte"], abs=1e-3
    )
    assert ours["ridge_point_flop_per_byte"] == pytest.approx(
        program["bound_by_ridge_point_flop_per_byte"], abs=1e-3
    )
    assert ours["achieved_flop_rate_gflops"] == pytest.approx(
        program["measured_flop_rate_gflops"], abs=0.01
    )
    assert ours["hbm_bw_gibs"] == pytest.approx(program["hbm_bw_gibs"], abs=0.01)
    assert ours["peak_flop_rate_gflops"] == pytest.approx(device["peak_flop_rate"], abs=0.01)
    assert ours["peak_hbm_bw_gibs"] == pytest.approx(device["peak_hbm_bw_gibs"], abs=0.01)
    assert ours["compute_efficiency_pct"] == pytest.approx(
        _pct(program["compute_efficiency_percent"]), abs=0.01
    )
    assert ours["hbm_bw_utilization_pct"] == pytest.approx(
        _pct(program["hbm_bw_utilization_percent"]), abs=0.01
    )
    assert ours["total_time_ms"] == pytest.approx(program["total_time_ms"], abs=1e-3)
    # Custom calls: XLA counts them as 0 FLOPs; their share is stated beside the roofline.
    assert ours["custom_call_share_pct"] == pytest.approx(theirs["custom_call_share_pct"], abs=0.01)
    assert ours["custom_call_share_pct"] > 5 and "0 FLOPs" in ours["custom_call_note"]
    finding = next(f for f in apply_rules(facts) if f.rule == "MemoryBoundRule")
    assert finding.priority == "P1"  # 15.6 FLOP/B is under a quarter of the 240.5 ridge
    assert finding.evidence["ridge_point_flop_per_byte"] == ours["ridge_point_flop_per_byte"]
    assert "0 FLOPs" in finding.detail


def test_op_categories_agree_with_xprof_hlo_stats(
    tpu: tuple[Path, CaptureFacts], tmp_path: Path
) -> None:
    path, facts = tpu
    theirs = xprof_cli("get_hlo_stats", path, tmp_path, "--limit=100000")
    totals: dict[str, float] = {}
    for record in theirs["records"]:
        row = op_category(
            record["op_name"], record["category"], framework_op=record["tf_op_name"] or ""
        )
        totals[row] = totals.get(row, 0.0) + record["total_self_time_us"]
    whole = sum(totals.values())
    assert facts.op_categories is not None
    ours = {r["category"]: r for r in facts.op_categories["rows"]}
    assert facts.op_categories["total_ms"] == pytest.approx(
        theirs["total_self_time_ms_all_records"], abs=0.01
    )
    for category, row in ours.items():
        assert row["share_pct"] == pytest.approx(
            100 * totals.get(category, 0.0) / whole, abs=0.05
        ), category
    # The synthetic mix: convolution fusions, all-reduces, copies and flash attention.
    for category in ("matmul/convolution", "collectives", "data formatting", "attention"):
        assert ours[category]["share_pct"] > 5, ours
    top = {o["name"]: o for o in facts.top_ops}
    attention = next(o for o in top.values() if o["name"].startswith("custom-call"))
    assert attention["category"] == "attention"
    assert attention["framework_op"].endswith("flash_attention")
    # No HLO protos in the synthetic capture, so no peak allocations, as XProf's CLI says.
    assert facts.peak_allocations == {
        "available": False,
        "reason": facts.unavailable["peak_allocations"],
    }
    cli = xprof_cli("get_peak_allocations", path, tmp_path)
    assert "error" in cli and "No memory viewer data" in cli["error"]


def test_peak_allocations_agree_with_xprof_on_a_cpu_capture(
    cpu: tuple[Path, CaptureFacts], tmp_path: Path
) -> None:
    path, facts = cpu
    ours = facts.peak_allocations
    assert ours is not None and ours["available"], ours
    theirs = xprof_cli(
        "get_peak_allocations",
        path,
        tmp_path,
        "--limit=0",
        "--min_size_mib=0",
        "--aggregate_instructions=False",
    )
    assert ours["modules_total"] == theirs["summary"]["total_modules"]
    mib = 2**20
    cli_totals = [round(m["total_hbm_mib"] * mib) for m in theirs["modules"]]
    assert [m["total_allocation_bytes"] for m in ours["modules"]] == cli_totals[
        : len(ours["modules"])
    ]
    assert ours["modules"][0]["module"] == theirs["modules"][0]["module_name"]
    top = {
        b["instruction"]: round(b["size_mib"] * mib) for b in theirs["modules"][0]["top_buffers"]
    }
    assert ours["largest"], ours
    for buffer in ours["largest"]:
        assert top[buffer["instruction"]] == buffer["bytes"], (buffer, top)
    # The update step's matmul output: an f32[512,512] buffer, made at its Python line.
    first = ours["largest"][0]
    assert first["module"].startswith("jit_update") and first["bytes"] == 512 * 512 * 4
    assert first["dtype"] == "f32" and first["dims"] == [512, 512]
    # CPU: no roofline, and XProf's CLI says so too.
    roofline = xprof_cli("get_roofline_model", path, tmp_path)
    assert roofline["status"] == "NO_DATA"
    assert facts.roofline is not None and not facts.roofline["available"]
    assert "CPU" in facts.roofline["reason"] and "roofline" in facts.unavailable


def test_top_ops_carry_their_python_line_and_category(cpu: tuple[Path, CaptureFacts]) -> None:
    _, facts = cpu
    lines = Path(WORKLOAD).read_text().splitlines()
    top = facts.top_ops[0]
    assert top["category"] == "matmul/convolution", top
    file, line = top["source"].rsplit(":", 1)
    assert file.endswith(WORKLOAD) and "@" in lines[int(line) - 1], (top, lines[int(line) - 1])
    # Matmuls (the workload's @) lead the table; tanh/sin are elementwise.
    assert facts.op_categories is not None
    rows = {r["category"]: r for r in facts.op_categories["rows"]}
    assert rows["matmul/convolution"]["share_pct"] > rows["elementwise"]["share_pct"] > 0
    assert sum(r["share_pct"] for r in rows.values()) == pytest.approx(100, abs=0.1)


def test_the_report_renders_the_new_facts(
    tpu: tuple[Path, CaptureFacts], cpu: tuple[Path, CaptureFacts]
) -> None:
    for path, facts in (tpu, cpu):
        report = Report({"spec": str(path), "kind": "capture"}, facts, apply_rules(facts))
        page = report_html(report)
        assert 'id="op-categories"' in page and "matmul/convolution" in page
        text = report_text(report)
        assert "op categories:" in text
    tpu_text = report_text(Report({"spec": "t"}, tpu[1], apply_rules(tpu[1])))
    assert "roofline: HBM-bound" in tpu_text and "custom calls" in tpu_text
    cpu_page = report_html(Report({"spec": "c"}, cpu[1], apply_rules(cpu[1])))
    assert 'id="peak-allocations"' in cpu_page and "f32[512,512]" in cpu_page


def _row_cells(page: str, table: str, first: str) -> list[str]:
    """The text of each cell of the row of table ``table`` whose first cell is ``first``."""
    from html.parser import HTMLParser

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.inside, self.rows, self.cell = False, [], None  # type: ignore[var-annotated]

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table":
                self.inside = ("id", table) in attrs
            elif self.inside and tag == "tr":
                self.rows.append([])
            elif self.inside and tag == "td":
                self.cell = ""

        def handle_endtag(self, tag: str) -> None:
            if tag == "table":
                self.inside = False
            elif self.inside and tag == "td" and self.cell is not None:
                self.rows[-1].append(" ".join(self.cell.split()))
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell += data + " "

    parser = Rows()
    parser.feed(page)
    return next(r for r in parser.rows if r and r[0] == first)


def test_the_report_shows_each_top_ops_hlo_neighbourhood(
    cpu: tuple[Path, CaptureFacts],
) -> None:
    """The JSON's neighbourhood (producers, consumers) is in the HTML's top-ops table and
    in the text report, escaped."""
    import copy

    _, facts = cpu
    top = facts.top_ops[0]
    hood = top["neighbourhood"]
    assert hood is not None and hood["producers"] and hood["consumers"], top
    report = Report({"spec": "c"}, facts, apply_rules(facts))
    cells = _row_cells(report_html(report), "top-ops", top["name"])
    text = report_text(report)
    for side in ("producers", "consumers"):
        first = hood[side][0]
        named = f"{first['name']} ({first['opcode']}, {first['shape']}"
        assert f"{side}: {named}" in cells[-1], (side, cells)
        assert f"{top['name']} {side}: {named}" in text, text
    # A name is data, never markup: a hostile one comes out escaped.
    hostile = copy.deepcopy(facts)
    hostile.top_ops[0]["neighbourhood"]["producers"][0]["name"] = "<img src=x onerror=alert(1)>"
    page = report_html(Report({"spec": "c"}, hostile, apply_rules(hostile)))
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
