"""Facts from XProf's own converters, run in a child process on a copy of the capture.

XProf's converters (``xprof.convert.raw_to_tool_data.xspace_to_tool_data``) write cache
files beside their input and log to stderr from C++, and they are native code that a
hostile file could crash: so they run in child processes (one per tool), on copies in a
temporary directory, with a deadline. Each tool's answer is reduced to the few numbers a
report quotes; a tool that fails or has nothing on this backend says so.

Only the converters whose facts the report will use run (:data:`FACT_TOOLS` maps each
fact to the one tool it needs; :func:`plan_tools` picks them for a capture), and none
runs on a capture over :data:`XPROF_MAX_CAPTURE_MB`: the fact is then
``{"available": false, "reason": ...}``, never a failed report.

    python -m exporter.analysis.facts.xprof_tools [--tools a,b] CAPTURE [CAPTURE ...]  # JSON
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from exporter.profiles.capture_files import CHUNKED_SUFFIX, XSPACE_SUFFIX, capture_stem

__all__ = [
    "FACT_TOOLS",
    "TOOLS",
    "XPROF_MAX_CAPTURE_MB",
    "XPROF_TIMEOUT_S",
    "XProfPlan",
    "capture_limit_mb",
    "plan_tools",
    "run_xprof_tools",
]

# Each fact the report takes from XProf, and the ONE converter it needs. XProf's
# framework_op_stats is not here: no fact or finding reads it.
FACT_TOOLS: Final[dict[str, str]] = {
    # facts.roofline: the program row (program_facts.roofline, MemoryBoundRule)
    "roofline": "roofline_model",
    # facts.roofline.mxu_utilization_pct: the TPU's MXU counters, only the overview has them
    "mxu_utilization": "overview_page",
    # facts.memory: peak bytes in use against capacity (OomRiskRule)
    "memory": "memory_profile",
    # facts.peak_allocations: the largest buffers per HLO module (OomRiskRule's buffers)
    "peak_allocations": "memory_viewer",
    # top_ops[i].source / category / framework_op where the capture's HLO protos lack the op
    "op_sources": "hlo_stats",
    # XProf's step time beside ours (summary.html's key numbers; the integration tests)
    "step_time_check": "input_pipeline_analyzer",
}
TOOLS: Final = tuple(dict.fromkeys(FACT_TOOLS.values()))
# XProf takes about 5 s and 700 MiB for a 2-million-event capture (issue 10's figures);
# a minute leaves room on a loaded machine, and a report never waits longer.
XPROF_TIMEOUT_S: Final = 60.0
# The converters' child's address-space bound (MiB), reserved from the memory budget
# (exporter.sandbox); None: the caller's own, which a sidecar's report job has from
# MLPROF_REPORT_MAX_MEMORY_MB (inside that job the budget is what its own bound leaves),
# else that setting's default.
XPROF_MAX_MEMORY_MB: int | None = None
# XProf's converters hold the whole XSpace and the op stats built from it. Measured
# (issue 20; write_tpu_capture(devices=4, ops_per_step=10_000, distinct_ops=400,
# while_every=50, while_body=8), 11 and 45 steps): one tool's peak RSS is 213 MiB for
# the 8.0 MB capture, 731 MiB for the 32.4 MB one: about 100 MiB plus 22x the capture's
# size. All five tools in one process reach 1206 MiB (39x: what each leaves behind
# adds up), so each tool runs in its own child. Under an address-space bound (RLIMIT_AS,
# as the sidecar's job has) hlo_stats needs 896 MiB for the 32.4 MB capture (768 MiB
# dies with std::bad_alloc) and 384 MiB for the 8.0 MB one (256 MiB dies): again 22x.
# 150 MB is then about 3.5 GB, under the sidecar's 4 GiB analysis bound
# (MLPROF_REPORT_MAX_MEMORY_MB); a 366 MB capture would need 8 GB. Setting:
# MLPROF_REPORT_XPROF_MAX_CAPTURE_MB (config.py).
XPROF_MAX_CAPTURE_MB: Final = 150
LIMIT_ENV: Final = "MLPROF_REPORT_XPROF_MAX_CAPTURE_MB"
_MB: Final = 1_000_000
TOP_ROWS: Final = 5
# Peak allocations: XProf's memory viewer runs once per HLO module, as its CLI's
# get_peak_allocations does. A capture of a long session can hold hundreds of small
# modules: read at most this many, for at most this long, so the converters' deadline
# above is never spent here (what was skipped is counted in the answer).
PEAK_MODULES: Final = 64
PEAK_BUDGET_S: Final = 20.0
PEAK_BUFFERS: Final = 10  # buffers kept per module, largest first
HLO_OPS: Final = 200  # hlo_stats rows kept with their category and source line
# The roofline program row's columns a report quotes (XProf's op_metrics_to_record.h).
ROOFLINE_PROGRAM_KEYS: Final = (
    "bound_by",
    "operational_intensity",
    "bottleneck_operational_intensity",
    "measured_flop_rate",
    "model_flop_rate",
    "measured_memory_bw",
    "hbm_bw",
    "hbm_bw_utilization",
    "compute_efficiency",
    "max_mem_bw_utilization",
    "roofline_efficiency",
    "total_time",
)


@dataclass(frozen=True)
class XProfPlan:
    """The converters a report runs on one input, and why each other fact runs none.

    >>> plan_tools(backend="cpu", has_steps=False, has_hlo_protos=False,
    ...            ops_without_hlo=0, capture_bytes=1).tools
    ()
    """

    tools: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)  # fact -> why its tool is not run
    capture_bytes: int = 0
    limit_mb: float = XPROF_MAX_CAPTURE_MB
    over_limit: str = ""  # the reason, when the capture is too large for any converter

    def to_json(self) -> dict[str, Any]:
        return {
            "asked": list(self.tools),
            "skipped": self.skipped,
            "capture_mb": round(self.capture_bytes / _MB, 1),
            "limit_mb": self.limit_mb,
        }


def plan_tools(
    *,
    backend: str,
    has_steps: bool,
    has_hlo_protos: bool,
    ops_without_hlo: int,
    capture_bytes: int,
    max_capture_mb: float = XPROF_MAX_CAPTURE_MB,
) -> XProfPlan:
    """The converters whose facts this capture can have (see :data:`FACT_TOOLS`)."""
    why_not: dict[str, str] = {}
    if backend == "cpu":
        why_not["roofline"] = (
            "XProf's roofline model has no rows for a CPU capture (it models TPU and GPU "
            "device ops)"
        )
        why_not["memory"] = (
            "XProf's memory_profile has no device allocator in a CPU capture (JAX reports "
            "none on CPU)"
        )
    if backend != "tpu" or "roofline" in why_not:
        why_not["mxu_utilization"] = "MXU utilisation is a TPU counter (and a roofline figure)"
    if not has_hlo_protos:
        why_not["peak_allocations"] = (
            "the capture has no HLO protos (XProf's memory viewer reads them)"
        )
    if not ops_without_hlo:
        why_not["op_sources"] = (
            "every top op's source is in the capture's HLO protos"
            if has_hlo_protos
            else "no top ops to find sources for"
        )
    if not has_steps:
        why_not["step_time_check"] = (
            "no step markers: XProf's input pipeline analysis reads the same ones"
        )
    wanted = {fact: tool for fact, tool in FACT_TOOLS.items() if fact not in why_not}
    over = ""
    if wanted and capture_bytes > max_capture_mb * _MB:
        over = (
            f"capture is {capture_bytes / _MB:.0f} MB, over the {max_capture_mb:g} MB limit "
            f"for XProf's converters ({LIMIT_ENV}): they take about 20x the capture's size "
            "in memory"
        )
        why_not |= dict.fromkeys(wanted, over)
        wanted = {}
    tools = tuple(t for t in TOOLS if t in wanted.values())
    return XProfPlan(tools, why_not, capture_bytes, max_capture_mb, over)


def capture_limit_mb() -> float:
    """The limit in effect: the setting (``MLPROF_REPORT_XPROF_MAX_CAPTURE_MB``)."""
    from exporter.config import load_settings

    return float(load_settings(None).report_xprof_max_capture_mb)


def _table_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    ids = [c.get("id") for c in table.get("cols", [])]
    return [
        {k: cell.get("v") for k, cell in zip(ids, row.get("c", []), strict=False)}
        for row in table.get("rows", [])
    ]


def _number(text: Any) -> float | None:
    if isinstance(text, int | float):
        return float(text)
    try:
        return float(str(text).rstrip("%"))
    except ValueError:
        return None


def _summarise(tool: str, data: Any) -> dict[str, Any]:
    if tool == "input_pipeline_analyzer":
        table = data[1] if isinstance(data, list) and len(data) > 1 else {}
        p = table.get("p", {})
        rows = _table_rows(table)
        return {
            "hardware_type": p.get("hardware_type"),
            "steps": len(rows),
            "step_time_ms": {
                k: _number(p.get(f"steptime_ms_{k}"))
                for k in ("average", "minimum", "maximum", "standard_deviation")
            },
            "step_times_ms": {str(r.get("stepnum")): r.get("stepTimeMs") for r in rows},
            "infeed_ms_avg": _number(p.get("infeed_time_ms_avg")),
            "host_compute_ms_avg": _number(p.get("host_compute_time_ms_avg")),
            "device_compute_ms_avg": _number(p.get("device_compute_time_ms_avg")),
            "compile_ms_avg": _number(p.get("compile_time_ms_avg")),
            "other_ms_avg": _number(p.get("other_time_ms_avg")),
            "input_conclusion": p.get("input_conclusion"),
        }
    if tool == "overview_page":
        tables = data if isinstance(data, list) else []
        first = tables[0].get("p", {}) if tables else {}
        params: list[dict[str, Any]] = [t.get("p", {}) for t in tables if isinstance(t, dict)]
        env = next((p for p in params if "device_type" in p), {})
        advice = next((p for p in params if "bottleneck" in p), {})
        return {
            "device_type": env.get("device_type"),
            "device_duty_cycle_pct": _number(first.get("device_duty_cycle_percent")),
            "device_idle_time_pct": _number(first.get("device_idle_time_percent")),
            "mxu_utilization_pct": _number(first.get("mxu_utilization_percent")),
            "bottleneck": advice.get("bottleneck"),
            "statement": advice.get("statement"),
        }
    if tool in ("hlo_stats", "framework_op_stats", "roofline_model"):
        tables = data if isinstance(data, list) else [data]
        rows = [r for t in tables if isinstance(t, dict) for r in _table_rows(t)]
        rows = [r for r in rows if r.get("operation") != "IDLE" and r.get("type") != "IDLE"]
        keys = (
            "hlo_op_name",
            "operation",
            "category",
            "type",
            "total_self_time",
            "total_self_time_percent",
            "host_or_device",
            "bound_by",
        )
        top = [{k: r[k] for k in keys if k in r} for r in rows[:TOP_ROWS]]
        out: dict[str, Any] = {"rows": len(rows), "top": top}
        if tool == "roofline_model" and tables and isinstance(tables[0], dict):
            p = tables[0].get("p", {})
            out["device_type"] = p.get("device_type")
            out["peak_flop_rate"] = _number(p.get("peak_flop_rate"))
            out["peak_hbm_bw"] = _number(p.get("peak_hbm_bw"))
            out |= _roofline_program(tables[0])
        if tool == "hlo_stats":
            out["ops"] = _hlo_ops(rows)
        return out
    if tool == "memory_profile":
        allocators = (data or {}).get("memoryProfilePerAllocator") or {}
        found = {}
        for name, profile in allocators.items():
            summary = profile.get("profileSummary", {})
            peak = summary.get("peakStats", {})
            found[name] = {
                "peak_bytes_in_use": _number(summary.get("peakBytesUsageLifetime"))
                or _number(peak.get("peakBytesInUse")),
                "capacity_bytes": _number(summary.get("memoryCapacity")),
            }
        return {"allocators": found}
    return {}


def _roofline_program(table: dict[str, Any]) -> dict[str, Any]:
    """The roofline's program row, device ridge points and custom calls' time share.

    The first row is the whole program (XProf's CLI reads it so too); the custom-call
    share sums the op rows' self-time shares as ``get_roofline_model`` does (each
    (rank, operation) once, rows that are custom calls by name or category).
    """
    rows = _table_rows(table)
    if not rows:
        return {"program": None}
    program = {k: rows[0].get(k) for k in ROOFLINE_PROGRAM_KEYS}
    p = table.get("p", {})
    ridges = {k: _number(v) for k, v in p.items() if k.endswith("ridge_point")}
    scale = 100.0 if (_number(rows[0].get("total_self_time_percent")) or 0.0) <= 1.0 + 1e-6 else 1.0
    seen: set[tuple[Any, str]] = set()
    share = 0.0
    custom_ops = 0
    for row in rows[1:]:
        name = str(row.get("operation") or "")
        key = (row.get("rank"), name)
        category = str(row.get("category") or "").lower()
        if key in seen or not (
            name.startswith("custom-call") or category in ("custom-call", "custom_call")
        ):
            continue
        seen.add(key)
        custom_ops += 1
        share += (_number(row.get("total_self_time_percent")) or 0.0) * scale
    return {
        "program": program,
        "ridge_points": ridges,
        "custom_call_share_pct": min(round(share, 2), 100.0),
        "custom_call_ops": custom_ops,
    }


def _source_text(value: Any) -> str:
    """hlo_stats' source_info without its HTML (the title holds the stack)."""
    import re

    text = str(value or "")
    found = re.search(r"title=['\"]([^'\"]+)['\"]", text)
    if found:
        return found.group(1).split("\n")[0].strip()
    return re.sub(r"<[^>]+>", "", text).strip()


def _hlo_ops(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per HLO op (the largest by self time): its category and source line."""
    ops: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: -(_number(r.get("total_self_time")) or 0.0)):
        name = str(row.get("hlo_op_name") or "")
        if not name or name in ops:
            continue
        ops[name] = {
            "category": row.get("category"),
            "source": _source_text(row.get("source_info")) or None,
            "framework_op": row.get("tf_op_name") or None,
        }
        if len(ops) >= HLO_OPS:
            break
    return ops


def _buffers(data: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A module's buffers, largest first, as XProf's get_peak_allocations reads them:
    the buffer assignment's logical buffers where the viewer gives them, else the
    buffers live at the heap's peak (``maxHeap``)."""
    logical = (data.get("bufferAssignment") or {}).get("logicalBuffers") or []
    found: list[dict[str, Any]] = []
    if logical:
        for buf in logical:
            found.append(
                {
                    "instruction": (buf.get("definedAt") or {}).get("instructionName", "unknown"),
                    "bytes": int(_number(buf.get("size")) or 0),
                }
            )
        basis = "buffer assignment"
    else:
        for buf in data.get("maxHeap") or []:
            source = buf.get("sourceInfo") or {}
            found.append(
                {
                    "instruction": buf.get("instructionName", "unknown"),
                    "bytes": round((_number(buf.get("logicalBufferSizeMib")) or 0.0) * 2**20),
                    "shape": buf.get("shapeString") or None,
                    "op_code": buf.get("opCode") or None,
                    "kind": buf.get("groupName") or None,
                    "framework_op": buf.get("tfOpName") or None,
                    "source": f"{source['fileName']}:{source.get('lineNumber', 0)}"
                    if source.get("fileName")
                    else None,
                }
            )
        basis = "live at the heap peak"
    found.sort(key=lambda b: -b["bytes"])
    return basis, found


def _peak_allocations(paths: list[str]) -> dict[str, Any]:
    """XProf's memory viewer per HLO module of the first capture (get_peak_allocations)."""
    from xprof.convert import raw_to_tool_data

    started = time.perf_counter()
    try:
        # Writes <module>.hlo_proto.pb beside the copy, as XProf's CLI has it do.
        raw_to_tool_data.xspace_to_tool_names(paths)
        folder = Path(paths[0]).parent
        names = sorted(
            f.name.removesuffix(".hlo_proto.pb")
            for f in folder.glob("*.hlo_proto.pb")
            if f.name != "NO_MODULE.hlo_proto.pb"
        )
        if not names:
            return {"error": "no HLO modules in this capture (the memory viewer reads them)"}
        modules = []
        skipped = 0
        for name in names[:PEAK_MODULES]:
            if time.perf_counter() - started > PEAK_BUDGET_S:
                skipped += 1
                continue
            raw, _ = raw_to_tool_data.xspace_to_tool_data(
                paths, "memory_viewer", {"module_name": name}
            )
            if not raw:
                continue
            data = json.loads(raw)
            basis, buffers = _buffers(data)
            modules.append(
                {
                    "module": name,
                    "total_allocation_mib": _number(data.get("totalBufferAllocationMib")) or 0.0,
                    "peak_heap_mib": _number(data.get("peakHeapMib")),
                    "parameters_mib": _number(data.get("entryComputationParametersMib")),
                    "buffers_basis": basis,
                    "buffer_count": len(buffers),
                    "buffers": buffers[:PEAK_BUFFERS],
                }
            )
        return {
            "seconds": round(time.perf_counter() - started, 3),
            "summary": {
                "modules": modules,
                "modules_total": len(names),
                "modules_skipped": skipped + max(0, len(names) - PEAK_MODULES),
            },
        }
    except Exception as exc:  # the other tools' answers still count
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _child(paths: list[str], tools: Sequence[str] = TOOLS) -> dict[str, Any]:
    """In the child: run ``tools``, answer {tool: {seconds, summary} | {error}}."""
    from xprof.convert import raw_to_tool_data

    answers: dict[str, Any] = {}
    for tool in tools:
        if tool == "memory_viewer":
            answers[tool] = _peak_allocations(paths[:1])  # one host, as memory_profile
            continue
        started = time.perf_counter()
        try:
            inputs = paths[:1] if tool == "memory_profile" else paths  # one host at a time
            raw, _ = raw_to_tool_data.xspace_to_tool_data(inputs, tool, {"use_saved_result": False})
            if raw is None:
                answers[tool] = {"error": "XProf produced no data for this capture"}
                continue
            data = json.loads(raw)
            answers[tool] = {
                "seconds": round(time.perf_counter() - started, 3),
                "summary": _summarise(tool, data),
            }
        except Exception as exc:  # one tool's failure is reported, the others still run
            answers[tool] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return answers


def run_xprof_tools(
    paths: Sequence[Path],
    tools: Sequence[str] = TOOLS,
    timeout_s: float | None = None,
    memory_mb: int | None = None,
) -> dict[str, Any]:
    """XProf's summaries of ``paths`` (one host's or a session's captures) by ``tools``.

    Each tool runs in its own child, all within ``timeout_s`` (default
    :data:`XPROF_TIMEOUT_S`); a child that times out, crashes or runs out of memory
    (``memory_mb``: each child's address-space bound, default :data:`XPROF_MAX_MEMORY_MB`)
    makes its tool ``{"error": ...}`` and the others still count. Answers
    ``{"available": False, "reason": ...}`` when XProf is not installed or no tool
    answered; the report then says which facts it could not check with XProf.
    """
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise ValueError(f"XProf tools {unknown}: expected some of {', '.join(TOOLS)}")
    timeout_s = XPROF_TIMEOUT_S if timeout_s is None else timeout_s
    memory_mb = XPROF_MAX_MEMORY_MB if memory_mb is None else memory_mb
    if not tools:
        return {"available": False, "reason": "no fact of this capture needs XProf's converters"}
    try:
        import importlib.util

        if importlib.util.find_spec("xprof") is None:
            return {
                "available": False,
                "reason": "XProf is not installed (mlprof-exporter[capture])",
            }
    except (ImportError, ValueError):
        return {"available": False, "reason": "XProf cannot be imported"}
    with tempfile.TemporaryDirectory(prefix="mlprof-xprof-") as tmp:
        copies = []
        for i, path in enumerate(paths):
            copy = Path(tmp) / f"{i}_{capture_stem(path.name)}{XSPACE_SUFFIX}"
            if path.name.endswith(CHUNKED_SUFFIX):
                from exporter.profiles.riegeli import write_xspace

                # Merged as XProf's repository merges it: the converters get one XSpace.
                with copy.open("wb") as out:
                    write_xspace(path, out)
            else:
                shutil.copyfile(path, copy)
            copies.append(str(copy))
        answers: dict[str, Any] = {}
        failures: list[str] = []
        deadline = time.monotonic() + timeout_s
        for tool in tools:  # one child each: see XPROF_MAX_CAPTURE_MB
            left = deadline - time.monotonic()
            if left <= 0:
                failures.append(f"XProf's converters took over {timeout_s:g}s")
                answers[tool] = {"error": f"not run: {failures[-1]}"}
                continue
            answer, failure = _run_child(tool, copies, (left, timeout_s), tmp, memory_mb)
            answers[tool] = answer
            if failure:
                failures.append(failure)
    if len(failures) == len(tools):  # no tool answered: XProf as a whole did not
        return {"available": False, "reason": failures[0], "tools": answers}
    return {"available": True, "tools": answers}


def _run_child(
    tool: str,
    copies: list[str],
    timeouts: tuple[float, float],
    cwd: str,
    memory_mb: int | None,
) -> tuple[dict[str, Any], str]:
    """One tool in its own sandboxed child: its answer, and why it failed ('' if not).

    ``timeouts``: the seconds left of the converters' deadline, and that deadline.
    """
    from exporter.sandbox import run_python

    done = run_python(
        ["-m", "exporter.analysis.facts.xprof_tools", "--tools", tool, *copies],
        memory_mb=_child_memory_mb(memory_mb),
        timeout_s=timeouts[0],
        what=f"XProf {tool}",
        env={"TF_CPP_MIN_LOG_LEVEL": "3", "GLOG_minloglevel": "3"},
        cwd=cwd,
    )
    if done.timed_out:
        failure = f"XProf's converters took over {timeouts[1]:g}s (at {tool})"
        return {"error": failure}, failure
    if done.no_budget:
        failure = f"XProf's converters not started ({tool}): {done.error}"
        return {"error": failure}, failure
    if not done.ok:
        killed = " (killed: out of memory or a signal)" if done.killed else ""
        reason = done.error or "no output"
        failure = f"XProf's converters failed (exit {done.returncode}{killed}: {reason[:200]})"
        return {"error": failure}, failure
    try:
        answer = json.loads(done.stdout)[tool]
    except (ValueError, KeyError, TypeError):
        failure = "XProf's converters answered no JSON"
        return {"error": failure}, failure
    return answer, ""


def _child_memory_mb(memory_mb: int | None) -> int:
    """The converters' child's bound: ``memory_mb``, else this process's own address-space
    limit (a report job's), else the sidecar's analysis bound by default."""
    if memory_mb is not None:
        return memory_mb
    own = resource.getrlimit(resource.RLIMIT_AS)[0]
    if own != resource.RLIM_INFINITY:
        return int(own >> 20)
    from exporter.config import Settings

    default: int = Settings.model_fields["report_max_memory_mb"].default
    return default


def _main(argv: list[str]) -> None:
    if argv[:1] == ["--memory-mb"]:  # run by hand; the sandbox sets its children's limit
        from exporter.sandbox import limit_memory

        limit_memory(int(argv[1]))
        argv = argv[2:]
    from exporter.heap import keep_freed_memory

    keep_freed_memory()  # a child that converts one capture and exits (exporter.heap)
    tools: Sequence[str] = TOOLS
    if argv[:1] == ["--tools"]:
        tools, argv = [t for t in argv[1].split(",") if t], argv[2:]
    json.dump(_child(argv, tools), sys.stdout)


if __name__ == "__main__":
    _main(sys.argv[1:])
