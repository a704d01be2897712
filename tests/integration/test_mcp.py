"""``mlprof mcp`` answers the MCP SDK's own client over stdio.

The server runs as the client's subprocess (``python -m exporter.cli mcp --store DIR``)
on a store of TPU-shaped synthetic sessions: its tools answer the CLI's JSON, XProf's
CLI runs on a copy of a session, and bad names come back as one-line tool errors.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mcp import Client, StdioServerParameters  # the dev extra installs it: never skipped

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.cli import main
from exporter.mcp_server import XPROF_CLI_MAIN
from exporter.testing.synthetic import write_tpu_capture
from tests.harness import ROOT

pytestmark = pytest.mark.integration

SHAPE = {"devices": 2, "steps": 8, "ops_per_step": 300, "distinct_ops": 60}
READ_TOOLS = {
    "list_sessions", "list_runs", "analyze", "compare", "top_ops", "gpu_kernels",
    "flamegraph_subtree", "hosts", "memory_peak", "xprof",
}  # fmt: skip


def _session(store: SessionStore, session_id: str, hosts: dict[str, float]) -> Path:
    """A done session with one TPU-shaped capture per host (``slowdown`` per host)."""
    directory = store.local_dir(session_id)
    assert directory is not None
    for host, slowdown in hosts.items():
        write_tpu_capture(directory / f"{host}.xplane.pb", slowdown=slowdown, **SHAPE)
    store.write_record(
        SessionRecord(
            id=session_id,
            status="done",
            run_id="run-1",
            workload="train",
            targets=[
                TargetResult(
                    address=f"{h}:9999",
                    host=h,
                    run_id="run-1",
                    status="ok",
                    files=[f"{h}.xplane.pb"],
                )
                for h in hosts
            ],
        )
    )
    return directory


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    root = tmp_path / "store"
    sessions = SessionStore(str(root))
    dirs = {
        "base": _session(sessions, "base", {"tpu-vm-0": 1.0}),
        "slow": _session(sessions, "slow", {"tpu-vm-0": 1.5}),
        "pair": _session(sessions, "pair", {"tpu-vm-0": 1.0, "tpu-vm-1": 1.0}),
    }
    return root, dirs


def _cli_json(*args: str) -> Any:
    done = CliRunner().invoke(main, list(args))
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in ("timings", "generated", "input")}


async def _session_calls(root: Path, *extra: str) -> dict[str, Any]:

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "exporter.cli", "mcp", "--store", str(root), *extra],
        cwd=str(ROOT),
    )
    out: dict[str, Any] = {}
    async with Client(params, read_timeout_seconds=120) as client:
        out["tools"] = {t.name: t for t in (await client.list_tools()).tools}

        async def call(name: str, arguments: dict[str, Any]) -> Any:
            return await client.call_tool(name, arguments)

        if extra:
            out["capture"] = await call("capture", {"duration_ms": 100})
            return out
        out["sessions"] = await call("list_sessions", {})
        out["runs"] = await call("list_runs", {})
        out["analyze"] = await call("analyze", {"session": "slow", "xprof": False})
        out["compare"] = await call("compare", {"base": "base", "head": "slow"})
        out["top_ops"] = await call("top_ops", {"session": "slow", "limit": 3})
        out["gpu"] = await call("gpu_kernels", {"session": "slow"})
        out["root"] = await call("flamegraph_subtree", {"session": "base", "limit": 5})
        out["hosts"] = await call("hosts", {"session": "pair"})
        out["memory"] = await call("memory_peak", {"session": "base"})
        out["step_trace"] = await call("xprof", {"session": "pair", "tool": "get_step_trace",
                                                 "arguments": {"limit": 3}})  # fmt: skip
        out["not_allowed"] = await call("xprof", {"session": "base", "tool": "upload_trace"})
        out["bad_flag"] = await call(
            "xprof", {"session": "base", "tool": "get_step_trace", "arguments": {"logdir": "/"}}
        )
        out["escape"] = await call("analyze", {"session": "../../etc", "xprof": False})
        out["missing"] = await call("top_ops", {"session": "no-such-session"})
        out["bad_limit"] = await call("top_ops", {"session": "base", "limit": 0})
        out["bad_frame"] = await call(
            "flamegraph_subtree", {"session": "base", "frames": ["no-such-frame"]}
        )
        first = out["root"].structured_content["children"][0]["name"]
        out["child"] = await call("flamegraph_subtree", {"session": "base", "frames": [first]})
    return out


def _xprof_cli(session: Path, tmp_path: Path, *args: str) -> Any:
    """``xprof TOOL`` run directly on a copy of ``session``'s captures: its summary."""
    copy = tmp_path / "direct" / session.name
    copy.mkdir(parents=True)
    for path in session.glob("*.xplane.pb"):
        shutil.copyfile(path, copy / path.name)
    done = subprocess.run(
        [sys.executable, "-c", XPROF_CLI_MAIN, args[0], str(copy), *args[1:]],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)["summary"]


def _error_line(result: Any) -> str:
    assert result.is_error, result
    text = result.content[0].text
    assert "\n" not in text and "Traceback" not in text, text
    return str(text)


def test_the_mcp_server_answers_the_sdk_client_with_the_cli_json(
    store: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    root, dirs = store
    out = asyncio.run(_session_calls(root))

    assert set(out["tools"]) == READ_TOOLS  # read-only: no capture tool without the flag
    assert all(t.annotations.read_only_hint for t in out["tools"].values())
    listed = out["sessions"].structured_content
    assert [s["id"] for s in listed["sessions"]] == ["pair", "slow", "base"], listed
    runs = out["runs"].structured_content["runs"]
    assert runs[0]["run_id"] == "run-1" and sorted(runs[0]["sessions"]) == ["base", "pair", "slow"]

    # analyze and compare: the CLI's JSON, from the same functions.
    report = out["analyze"].structured_content
    cli_report = _cli_json("analyze", str(dirs["slow"]), "--no-xprof", "--format", "json")
    assert _comparable(report) == _comparable(cli_report)
    assert report["input"]["spec"] == "slow"
    assert json.loads(out["analyze"].content[0].text) == report
    comparison = out["compare"].structured_content
    cli_comparison = _cli_json("compare", str(dirs["base"]), str(dirs["slow"]), "--format", "json")
    assert comparison["step_verdict"] == cli_comparison["step_verdict"]
    assert comparison["step_verdict"]["verdict"] == "slower", comparison["step_verdict"]
    assert comparison["regressions"] == cli_comparison["regressions"]

    ops = out["top_ops"].structured_content["top_ops"]
    assert ops == report["facts"]["top_ops"][:3] and len(ops) == 3
    # A TPU session: no kernels, and the report's reason rather than an empty table.
    gpu = out["gpu"].structured_content["gpu_kernels"]
    assert gpu == report["facts"]["gpu_kernels"] and gpu["available"] is False, gpu

    root_frame = out["root"].structured_content
    assert root_frame["path"] == [] and root_frame["total"] == root_frame["graph_total"] > 0
    kids = root_frame["children"]
    assert kids and kids == sorted(kids, key=lambda c: -c["total"])
    child = out["child"].structured_content
    assert child["path"] == [kids[0]["name"]] and child["total"] == kids[0]["total"]
    assert child["self"] + sum(c["total"] for c in child["children"]) <= child["total"]

    hosts = out["hosts"].structured_content["hosts"]
    assert sorted(h["name"] for h in hosts) == ["tpu-vm-0", "tpu-vm-1"], hosts
    assert all(h["steps"] >= 6 and h["step_median_ms"] > 0 for h in hosts), hosts

    # A synthetic capture has no memory profile: the report says so rather than zero.
    memory = out["memory"].structured_content
    assert memory["memory"] is None and "no device memory peak" in memory["unavailable"], memory
    assert "peak_allocations" in memory or "xprof_peak_allocations" in memory, memory

    # XProf's own CLI on a copy of the two-host session: both hosts, the step trace that
    # `xprof get_step_trace` gives on another copy of the same files.
    trace = out["step_trace"].structured_content
    assert not out["step_trace"].is_error, out["step_trace"].content
    assert sorted(trace["capture"]["files_available"]) == ["tpu-vm-0", "tpu-vm-1"]
    assert trace["summary"]["total_steps"] >= 1 and trace["summary"]["communication_percent"] > 0
    assert trace["summary"] == _xprof_cli(dirs["pair"], tmp_path, "get_step_trace", "--limit=3")
    assert sorted(p.name for p in dirs["pair"].iterdir()) == [
        "session.json",
        "tpu-vm-0.xplane.pb",
        "tpu-vm-1.xplane.pb",
    ]  # XProf's caches went to the copy, not the store

    assert "upload_trace" in _error_line(out["not_allowed"])
    assert "'logdir' not allowed" in _error_line(out["bad_flag"])
    assert "expected 1-128 characters" in _error_line(out["escape"])
    assert "no session 'no-such-session'" in _error_line(out["missing"])
    assert "limit: Input should be greater than or equal to 1" in _error_line(out["bad_limit"])
    assert "no frame 'no-such-frame'" in _error_line(out["bad_frame"])


def test_gpu_kernels_of_a_gpu_session_are_the_reports(tmp_path: Path) -> None:
    from exporter.mcp_server import ProfileTools
    from exporter.testing.synthetic_gpu import write_gpu_capture

    root = tmp_path / "store"
    sessions = SessionStore(str(root))
    directory = sessions.local_dir("gpu")
    assert directory is not None
    directory.mkdir(parents=True)
    write_gpu_capture(directory / "gpu-vm-0.xplane.pb", steps=3, gemm_every=0)
    sessions.write_record(SessionRecord(id="gpu", status="done", run_id="run-g", targets=[
        TargetResult(address="gpu-vm-0:9999", host="gpu-vm-0", run_id="run-g", status="ok",
                     files=["gpu-vm-0.xplane.pb"])]))  # fmt: skip
    tools = ProfileTools(str(root))
    found = tools.gpu_kernels("gpu", limit=2)["gpu_kernels"]
    report = _cli_json("analyze", str(directory), "--no-xprof", "--format", "json")
    whole = report["facts"]["gpu_kernels"]
    assert found["available"] is True and len(found["kernels"]) == 2
    assert found["kernels"] == whole["kernels"][:2]
    assert found["launch_overhead"] == whole["launch_overhead"]
    assert found["launch_overhead"]["launch_overhead_ms"] > 0


def test_the_capture_tool_is_there_only_with_allow_capture(
    store: tuple[Path, dict[str, Path]],
) -> None:
    root, _ = store
    out = asyncio.run(_session_calls(root, "--allow-capture", "--url", "http://127.0.0.1:9"))
    assert set(out["tools"]) == READ_TOOLS | {"capture"}
    assert not out["tools"]["capture"].annotations.read_only_hint
    assert "cannot reach the sidecar at http://127.0.0.1:9" in _error_line(out["capture"])
