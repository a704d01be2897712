"""XProf's converters only where they add a fact, and never as a way for a report to fail.

Which converters a report asks its child for (counted from the child's command lines),
the size limit (the reason in the report's JSON and its notes, no child started), and
real children that fail: out of memory, past the deadline, on a corrupt copy.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts import xprof_tools
from exporter.analysis.facts.xprof_tools import FACT_TOOLS, TOOLS, plan_tools
from exporter.analysis.report.document import analyze
from exporter.analysis.report.render import report_text
from exporter.testing.synthetic import write_tpu_capture


@pytest.fixture(scope="module")
def tpu_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gating") / "tpu-vm-0.xplane.pb"
    write_tpu_capture(path, devices=2, steps=4, ops_per_step=200, while_every=50, while_body=8)
    return path


class Children:
    """Stands in for subprocess.run in the sandbox: records each XProf child's tools."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        tools = command[command.index("--tools") + 1].split(",")
        self.asked.append(tools)
        answer = {t: {"error": "fake XProf: no data"} for t in tools}
        return subprocess.CompletedProcess(command, 0, json.dumps(answer).encode(), b"")


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> Children:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "xprof" else found(name, *a),
    )
    fake = Children()
    monkeypatch.setattr("exporter.sandbox.subprocess.run", fake)  # every child starts there
    return fake


def test_every_fact_needs_one_tool_and_nothing_runs_what_no_fact_reads() -> None:
    assert set(TOOLS) == set(FACT_TOOLS.values())
    assert len(TOOLS) == len(FACT_TOOLS)  # one tool per fact, none shared
    assert "framework_op_stats" not in TOOLS  # no fact or finding reads it


def test_a_tpu_capture_without_hlo_protos_asks_five_tools_one_child_each(
    tpu_capture: Path, children: Children
) -> None:
    report = analyze(str(tpu_capture), xprof_max_mb=150).to_json()
    expected = [
        "roofline_model",
        "overview_page",
        "memory_profile",
        "hlo_stats",
        "input_pipeline_analyzer",
    ]
    assert children.asked == [[t] for t in expected]
    facts = report["facts"]
    assert facts["xprof"]["asked"] == expected
    # The memory viewer reads HLO protos; this capture has none, so it is not run.
    assert facts["peak_allocations"] == {
        "available": False,
        "reason": "the capture has no HLO protos (XProf's memory viewer reads them)",
    }
    assert facts["roofline"] == {
        "available": False,
        "reason": "XProf's roofline_model: fake XProf: no data",
    }


@pytest.mark.parametrize(
    ("change", "gone"),
    [
        ({"backend": "cpu"}, {"roofline_model", "overview_page", "memory_profile"}),
        ({"backend": "gpu"}, {"overview_page"}),
        ({"has_hlo_protos": False}, {"memory_viewer"}),
        ({"ops_without_hlo": 0}, {"hlo_stats"}),
        ({"has_steps": False}, {"input_pipeline_analyzer"}),
    ],
)
def test_a_tool_runs_only_where_its_fact_can_be_had(change: dict[str, Any], gone: set[str]) -> None:
    facts: dict[str, Any] = {
        "backend": "tpu",
        "has_steps": True,
        "has_hlo_protos": True,
        "ops_without_hlo": 3,
        "capture_bytes": 10**6,
    }
    assert plan_tools(**facts).tools == TOOLS
    plan = plan_tools(**(facts | change))
    assert set(TOOLS) - set(plan.tools) == gone
    assert {FACT_TOOLS[f] for f in plan.skipped} == gone  # each left-out fact says why
    assert all(plan.skipped.values())


def test_over_the_size_limit_no_child_starts_and_the_report_says_why(
    tpu_capture: Path, children: Children
) -> None:
    report = analyze(str(tpu_capture), xprof_max_mb=0.05)
    assert children.asked == []
    size = f"{tpu_capture.stat().st_size / 1e6:.0f}"
    reason = (
        f"capture is {size} MB, over the 0.05 MB limit for XProf's converters "
        "(MLPROF_REPORT_XPROF_MAX_CAPTURE_MB)"
    )
    facts = report.to_json()["facts"]
    assert facts["roofline"]["available"] is False
    assert facts["roofline"]["reason"].startswith(reason)
    assert facts["xprof"]["skipped"]["memory"].startswith(reason)
    assert "XProf's memory_profile did not run (" + reason in facts["unavailable"]["memory"]
    # The notes: unavailable.xprof lists every fact the limit left unchecked.
    note = facts["unavailable"]["xprof"]
    assert note.startswith(reason)
    for fact in ("memory", "mxu_utilization", "op_sources", "roofline", "step_time_check"):
        assert fact in note
    assert f"not available (xprof): {reason}" in report_text(report)
    assert report.facts.steps is not None  # mlprof's own facts are all there


def test_the_limit_is_the_setting(
    tpu_capture: Path, children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLPROF_REPORT_XPROF_MAX_CAPTURE_MB", "0.05")
    facts = analyze(str(tpu_capture)).to_json()["facts"]
    assert children.asked == []
    assert "over the 0.05 MB limit" in facts["roofline"]["reason"]
    monkeypatch.setenv("MLPROF_REPORT_XPROF_MAX_CAPTURE_MB", "1000")
    analyze(str(tpu_capture))
    assert len(children.asked) == 5


def test_a_chunked_capture_is_gated_on_its_decoded_size(
    tpu_capture: Path, children: Children, tmp_path: Path
) -> None:
    # XProf's converters get the merged XSpace, so its size is what the limit bounds: a
    # brotli-compressed .xplane.riegeli is several times smaller as a file.
    from exporter.profiles.capture_files import capture_bytes
    from exporter.proto import xplane_pb2
    from tests import riegeli_writer as rw

    space = xplane_pb2.XSpace.FromString(tpu_capture.read_bytes())
    records = rw.chunk_xspace(space, 20_000)
    chunked = tmp_path / "tpu-vm-0.xplane.riegeli"
    rw.write_file(chunked, records, per_chunk=4)
    decoded = sum(len(r) for r in records)
    assert capture_bytes(chunked) == decoded
    assert chunked.stat().st_size * 3 < decoded  # what the file size alone would miss
    limit_mb = (chunked.stat().st_size + decoded) / 2 / 1e6  # the file under, XSpace over
    facts = analyze(str(chunked), xprof_max_mb=limit_mb).to_json()["facts"]
    assert children.asked == []
    assert facts["roofline"]["reason"].startswith(f"capture is {decoded / 1e6:.0f} MB, over")


needs_xprof = pytest.mark.skipif(
    importlib.util.find_spec("xprof") is None, reason="XProf ships with the dev install"
)


@needs_xprof
def test_a_child_out_of_memory_is_a_reason_not_a_failed_report(
    tpu_capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xprof_tools, "XPROF_MAX_MEMORY_MB", 48)  # XProf cannot load in it
    report = analyze(str(tpu_capture), xprof_max_mb=150)
    facts = report.to_json()["facts"]
    assert facts["xprof"]["available"] is False
    assert facts["roofline"]["available"] is False
    assert "XProf's converters failed (exit" in facts["roofline"]["reason"]
    assert "XProf's converters failed" in facts["unavailable"]["xprof"]
    assert report.status in ("OPTIMAL", "NEEDS_ATTENTION")


@needs_xprof
def test_a_child_past_the_deadline_is_killed_and_the_report_goes_on(
    tpu_capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xprof_tools, "XPROF_TIMEOUT_S", 0.05)
    facts = analyze(str(tpu_capture), xprof_max_mb=150).to_json()["facts"]
    assert facts["xprof"]["available"] is False
    assert facts["roofline"]["reason"].startswith("XProf's converters took over 0.05s")
    assert facts["steps"] is not None


@needs_xprof
def test_a_corrupt_copy_makes_every_xprof_fact_unavailable(
    tpu_capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def corrupt(source: Path, target: Path) -> None:
        Path(target).write_bytes(b"\x0a\xff\xff\xff\x0f" + Path(source).read_bytes()[:4096])

    monkeypatch.setattr("exporter.analysis.facts.xprof_tools.shutil.copyfile", corrupt)
    facts = analyze(str(tpu_capture), xprof_max_mb=150).to_json()["facts"]
    assert facts["roofline"]["available"] is False
    assert facts["roofline"]["reason"].startswith("XProf's roofline_model: ")
    assert facts["memory"] is None and "memory" in facts["unavailable"]
    assert facts["steps"] is not None
