"""The MCP server's ``xprof`` tool runs XProf's CLI in the sandbox: bounded, budgeted.

It ran unbounded inside the MCP process's tree before (issue 30: ``top_ops`` on a 64 KiB
``.xplane.riegeli`` reached 3.1 GB). Real XProf on a synthetic session.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from exporter import sandbox
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.errors import InputError
from exporter.mcp_server import ProfileTools
from exporter.sandbox import MemoryBudget
from exporter.testing.synthetic import write_tpu_capture
from tests.integration.test_mcp import _session

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("xprof") is None, reason="XProf not installed"),
]


@pytest.fixture
def tools(tmp_path: Path) -> ProfileTools:
    root = tmp_path / "store"
    _session(SessionStore(str(root)), "base", {"tpu-vm-0": 1.0})
    return ProfileTools(str(root))


def test_the_xprof_tool_reserves_the_analysis_bound_from_the_budget(
    tools: ProfileTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = MemoryBudget(6000)
    monkeypatch.setattr(sandbox, "_default", budget)
    monkeypatch.setenv("MLPROF_REPORT_MAX_MEMORY_MB", "3000")
    answer = tools.xprof_tool("base", "get_step_trace", {"limit": 3})
    assert "summary" in answer
    assert [(e.kind, e.what, e.mb) for e in budget.record] == [
        ("start", "xprof get_step_trace", 3000),
        ("end", "xprof get_step_trace", 3000),
    ]


def test_the_xprof_tool_dies_within_its_bound_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(str(tmp_path / "store"))
    directory = store.local_dir("base")
    assert directory is not None
    # 6.9 MB: XProf's step trace of it needs well over 256 MiB of address space.
    write_tpu_capture(
        directory / "tpu-vm-0.xplane.pb", devices=4, steps=10, ops_per_step=10_000, distinct_ops=100
    )
    store.write_record(
        SessionRecord(
            id="base",
            status="done",
            run_id="r",
            workload="w",
            targets=[
                TargetResult(
                    address="h:1",
                    host="tpu-vm-0",
                    run_id="r",
                    status="ok",
                    files=["tpu-vm-0.xplane.pb"],
                )
            ],
        )
    )
    monkeypatch.setattr(sandbox, "_default", MemoryBudget(6000))
    monkeypatch.setenv("MLPROF_REPORT_MAX_MEMORY_MB", "256")  # the smallest the setting takes
    with pytest.raises(InputError) as caught:
        ProfileTools(str(tmp_path / "store")).xprof_tool("base", "get_step_trace", {"limit": 3})
    text = str(caught.value)
    assert text.startswith("xprof get_step_trace: exit "), text
    assert "\n" not in text and "Traceback" not in text


def test_the_analysis_tools_run_bounded_and_budgeted_never_in_the_server(
    tools: ProfileTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    # top_ops, compare and flamegraph_subtree analysed in the MCP process itself (issue
    # 30: 200 s at 3.1 GB there on a hostile file). Each is now a job child under
    # MLPROF_REPORT_MAX_MEMORY_MB, reserved from the budget; a report is made once.
    budget = MemoryBudget(6000)
    monkeypatch.setattr(sandbox, "_default", budget)
    tools.settings = tools.settings.model_copy(update={"report_max_memory_mb": 2500})
    assert tools.top_ops("base", limit=2)["top_ops"]
    assert tools.gpu_kernels("base")["gpu_kernels"]  # the same report, cached
    assert tools.compare("base", "base")["step_verdict"]["verdict"] == "unchanged"
    assert tools.flamegraph_subtree("base", limit=2)["children"]
    started = [(e.what, e.mb) for e in budget.record if e.kind == "start"]
    assert started == [
        ("analysis job (analyze)", 2500),
        ("analysis job (compare)", 2500),
        ("analysis job (subtree)", 2500),
    ]
