"""Facts about the compiled programs: roofline, peak allocations, op categories, sources.

* ``roofline``: the program row of XProf's ``roofline_model`` (what ``xprof
  get_roofline_model`` reports as ``program``): what bounds it, its operational
  intensity, achieved against peak FLOP/s and HBM bandwidth, beside the share of device
  self time in custom calls, which XLA's cost model counts as 0 FLOPs;
* ``peak_allocations``: XProf's memory viewer per HLO module (what ``xprof
  get_peak_allocations`` reads): the modules with the most memory and the largest
  buffers of the first, with their shape and dtype;
* ``op_categories``: the device flame graph's self time by op category (the table of
  :data:`CATEGORIES`), each op classified from its XLA category (device planes) or its
  HLO instruction (opcode, fused computation, framework op) in the capture's HLO protos;
* each top op's ``source`` (``file:line`` of the Python that made it) from the op
  metadata of those HLO protos, else XProf's ``hlo_stats``.

A fact XProf cannot give on this capture is ``{"available": false, "reason": ...}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from exporter.analysis.facts.types import (
    Buffer,
    OpCategories,
    OpCategoryRow,
    PeakAllocations,
    Roofline,
)

if TYPE_CHECKING:
    from exporter.analysis.facts.capture import CaptureFacts
    from exporter.profiles.flamegraph import FlameGraph
    from exporter.profiles.xplane import Capture

__all__ = [
    "CATEGORIES",
    "HloOp",
    "add_program_facts",
    "capture_hlo_ops",
    "hlo_ops",
    "op_category",
    "peak_allocations",
    "read_programs",
    "roofline",
    "unreadable_hlo",
]

# XLA ops that only move or reformat data (XProf's "data formatting" category, and the
# copy / transpose / convert ops a layout mismatch makes).
DATA_FORMATTING_RE: Final = re.compile(r"^(copy|transpose|convert|bitcast|reshape)", re.I)
DATA_FORMATTING_CATEGORY: Final = "data formatting"
# The "(N)" XLA appends to a program's name on the device planes.
_PROGRAM_ID: Final = re.compile(r"\(\d+\)$")

# The op-category table, in the order a reader scans it; every op is in exactly one,
# tested in this order (an attention custom call is attention, a collective fusion a
# collective).
CATEGORIES: Final = (
    "matmul/convolution",
    "attention",
    "collectives",
    "data formatting",
    "elementwise",
    "custom calls",
    "other",
    "runtime wait",
)
COLLECTIVE_RE: Final = re.compile(
    r"^(all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute"
    r"|collective-broadcast|send|recv)(-start|-done)?\b"
)
# Framework op or custom-call names of attention kernels (flash / splash attention,
# cuDNN's fused MHA, scaled dot-product attention).
ATTENTION_RE: Final = re.compile(r"attention|flash|splash|\bmha\b|sdpa|fmha", re.I)
MATMUL_OPCODES: Final = frozenset({"dot", "convolution", "ragged-dot"})
# XProf's TPU categories of fusions rooted in a matmul or convolution: an "output
# fusion" is XLA's kOutput fusion, a dot/convolution with its elementwise consumers.
MATMUL_CATEGORIES: Final = frozenset({"convolution", "convolution fusion", "output fusion"})
FORMATTING_OPCODES: Final = frozenset(
    {"copy", "copy-start", "copy-done", "transpose", "convert", "bitcast", "bitcast-convert",
     "reshape", "pad", "slice", "concatenate", "dynamic-slice", "dynamic-update-slice"}
)  # fmt: skip
ELEMENTWISE_CATEGORIES: Final = frozenset({"loop fusion", "non-fusion elementwise"})
ELEMENTWISE_OPCODES: Final = frozenset(
    {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "exp",
     "exponential", "log", "tanh", "logistic", "sqrt", "rsqrt", "power", "sine", "cosine",
     "select", "compare", "and", "or", "not", "xor", "clamp", "floor", "ceil", "sign",
     "round-nearest-even", "round-nearest-afz", "erf", "atan2", "remainder", "broadcast",
     "iota", "constant", "parameter", "tuple", "get-tuple-element", "cbrt", "expm1",
     "log-plus-one", "is-finite", "sub", "max", "min"}
)  # fmt: skip
_NAME_STEM: Final = re.compile(r"^(wrapped_)?([a-z_\-]+?)(_fusion)?(\.\d+)?$")
TOP_MODULES: Final = 5  # modules listed in peak_allocations, most memory first
TOP_BUFFERS: Final = 5  # buffers listed at the peak
_SHAPE_RE: Final = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")


@dataclass
class HloOp:
    """One HLO instruction's facts from the capture's HLO protos."""

    opcode: str
    called_opcodes: set[str] = field(default_factory=set)
    framework_op: str = ""
    source: str | None = None
    custom_call_target: str = ""
    name: str = ""
    shape: str = ""  # as XLA prints it: ``f32[512,512]{1,0}``
    module: str = ""  # the module as the capture names it: ``jit_update(18)``
    # Its operands and users in its computation (the HLO graph, for neighbourhood.py).
    operands: list[HloOp] = field(default_factory=list, repr=False, compare=False)
    users: list[HloOp] = field(default_factory=list, repr=False, compare=False)


# --- the HLO protos in the capture (/host:metadata), read with the wire format only --


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos
        if shift > 70:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message; varints as ints, the rest as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            yield number, data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"wire type {wire}")


def _packed(value: int | bytes) -> list[int]:
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        item, pos = _varint(value, pos)
        out.append(item)
    return out


def _text(value: int | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


# Field numbers of xla/service/hlo.proto and xla/xla_data.proto (OpMetadata).
_MODULE, _COMPUTATIONS, _STACK_INDEX = 1, 3, 17
_COMP_INSTRUCTIONS, _COMP_ID = 2, 5
_INST_NAME, _INST_OPCODE, _INST_METADATA, _INST_CALLED = 1, 2, 7, 38
_INST_CUSTOM_TARGET = 28
_INST_SHAPE, _INST_ID, _INST_OPERANDS = 3, 35, 36
_SHAPE_TYPE, _SHAPE_DIMS, _SHAPE_TUPLE, _SHAPE_LAYOUT = 2, 3, 4, 5
_MAX_SHAPE_CHARS: Final = 200
# xla_data.proto's PrimitiveType, spelt as XLA prints shapes.
_TYPES: Final = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32",
    9: "u64", 10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64",
    16: "bf16", 17: "token", 18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2",
    28: "f8e4m3", 29: "f8e3m4", 32: "f4e2m1fn", 33: "f8e8m0fnu",
}  # fmt: skip


def _shape_text(shape: bytes, depth: int = 0) -> str:
    """A ShapeProto as XLA prints it (``f32[512,512]{1,0}``, tuples in parentheses)."""
    element, dims, parts, minor_to_major = 0, [], [], None
    for number, value in _fields(shape):
        if number == _SHAPE_TYPE and isinstance(value, int):
            element = value
        elif number == _SHAPE_DIMS:
            dims.extend(_packed(value))
        elif number == _SHAPE_TUPLE and isinstance(value, bytes) and depth < 4:
            parts.append(_shape_text(value, depth + 1))
        elif number == _SHAPE_LAYOUT and isinstance(value, bytes):
            minor_to_major = [i for n, v in _fields(value) if n == 1 for i in _packed(v)]
    kind = _TYPES.get(element, f"type{element}")
    if kind == "tuple":
        return f"({', '.join(parts)})"[:_MAX_SHAPE_CHARS]
    text = f"{kind}[{','.join(str(d) for d in dims)}]"
    if dims and minor_to_major:
        text += "{" + ",".join(str(i) for i in minor_to_major) + "}"
    return text


_META_OP_NAME, _META_FILE, _META_LINE, _META_FRAME = 2, 3, 4, 15


def _stack_sources(index: bytes) -> dict[int, str]:
    """Stack frame id -> ``file:line`` of that (innermost) frame."""
    files: list[str] = []
    locations: list[tuple[int, int]] = []
    frames: list[int] = []
    for number, value in _fields(index):
        if number == 1:
            files.append(_text(value))
        elif number == 3 and isinstance(value, bytes):
            loc = dict(_fields(value))
            file_id, line = loc.get(1, 0), loc.get(3, 0)
            locations.append(
                (file_id if isinstance(file_id, int) else 0, line if isinstance(line, int) else 0)
            )
        elif number == 4 and isinstance(value, bytes):
            location = dict(_fields(value)).get(1, 0)
            frames.append(location if isinstance(location, int) else 0)
    out = {}
    for frame_id, location_id in enumerate(frames, start=1):  # ids are 1-based
        if 0 < location_id <= len(locations):
            file_id, line = locations[location_id - 1]
            if 0 < file_id <= len(files):
                out[frame_id] = f"{files[file_id - 1]}:{line}"
    return out


def _module_ops(hlo_proto: bytes) -> dict[str, HloOp]:
    module = next((v for n, v in _fields(hlo_proto) if n == _MODULE), b"")
    if not isinstance(module, bytes):
        return {}
    computations: dict[int, list[bytes]] = {}
    sources: dict[int, str] = {}
    for number, value in _fields(module):
        if number == _COMPUTATIONS and isinstance(value, bytes):
            instructions, comp_id = [], -1
            for n, v in _fields(value):
                if n == _COMP_INSTRUCTIONS and isinstance(v, bytes):
                    instructions.append(v)
                elif n == _COMP_ID and isinstance(v, int):
                    comp_id = v
            computations[comp_id] = instructions
        elif number == _STACK_INDEX and isinstance(value, bytes):
            sources = _stack_sources(value)
    opcodes: dict[int, set[str]] = {}
    ops: dict[str, HloOp] = {}
    calls: dict[str, list[int]] = {}
    for comp_id, instructions in computations.items():
        found = opcodes.setdefault(comp_id, set())
        by_id: dict[int, HloOp] = {}
        operand_ids: list[tuple[HloOp, list[int]]] = []
        for raw in instructions:
            name = opcode = framework = target = shape = ""
            source: str | None = None
            called: list[int] = []
            inst_id, operands = -1, []
            for n, v in _fields(raw):
                if n == _INST_NAME:
                    name = _text(v)
                elif n == _INST_OPCODE:
                    opcode = _text(v)
                elif n == _INST_SHAPE and isinstance(v, bytes):
                    shape = _shape_text(v)
                elif n == _INST_ID and isinstance(v, int):
                    inst_id = v
                elif n == _INST_OPERANDS:
                    operands.extend(_packed(v))
                elif n == _INST_CUSTOM_TARGET:
                    target = _text(v)
                elif n == _INST_CALLED:
                    called.extend(_packed(v))
                elif n == _INST_METADATA and isinstance(v, bytes):
                    meta = dict(_fields(v))
                    framework = _text(meta.get(_META_OP_NAME, b""))
                    file, line = _text(meta.get(_META_FILE, b"")), meta.get(_META_LINE, 0)
                    frame = meta.get(_META_FRAME, 0)
                    if file:
                        source = f"{file}:{line if isinstance(line, int) else 0}"
                    elif isinstance(frame, int) and frame in sources:
                        source = sources[frame]
            found.add(opcode)
            ops[name] = op = HloOp(opcode, set(), framework, source, target, name, shape)
            calls[name] = called
            by_id[inst_id] = op
            operand_ids.append((op, operands))
        for op, operands in operand_ids:  # operand ids are ids in the same computation
            for operand in dict.fromkeys(i for i in operands if i in by_id):
                op.operands.append(by_id[operand])
                by_id[operand].users.append(op)
    for name, called in calls.items():
        for comp_id in called:
            ops[name].called_opcodes |= opcodes.get(comp_id, set())
    return ops


def hlo_ops(
    paths: Sequence[Path], damaged: dict[str, str] | None = None
) -> dict[str, dict[str, HloOp]]:
    """Per program (its name without the id), its HLO instructions, from the HLO protos
    that JAX writes into each capture's ``/host:metadata`` plane; the modules whose proto
    did not parse go into ``damaged`` (module -> why)."""
    from exporter.profiles.xplane import load_capture

    programs: dict[str, dict[str, HloOp]] = {}
    for path in paths:
        with load_capture(path) as capture:
            for program, found in capture_hlo_ops(capture, damaged).items():
                programs.setdefault(program, {}).update(found)
    return programs


def capture_hlo_ops(
    capture: Capture, damaged: dict[str, str] | None = None
) -> dict[str, dict[str, HloOp]]:
    """``hlo_ops`` of one open capture."""
    programs: dict[str, dict[str, HloOp]] = {}
    for ref in capture.planes:
        if ref.name != "/host:metadata":
            continue
        plane = capture.plane(ref)
        names = {k: m.name for k, m in plane.stat_metadata.items()}
        for meta in plane.event_metadata.values():
            program = re.sub(r"\(\d+\)$", "", meta.name)
            for stat in meta.stats:
                if names.get(stat.metadata_id) == "Hlo Proto" and stat.bytes_value:
                    try:
                        found = _module_ops(stat.bytes_value)
                    except ValueError as exc:
                        if damaged is not None:
                            damaged[meta.name] = str(exc)
                        continue  # a damaged proto: no sources for it
                    for op in found.values():
                        op.module = meta.name
                    programs.setdefault(program, {}).update(found)
    return programs


# --- op categories ----------------------------------------------------------------


def op_category(
    name: str,
    xla_category: str | None = None,
    hlo: HloOp | None = None,
    framework_op: str = "",
) -> str:
    """The op-category table's row for an op (see CATEGORIES for the order of tests).

    Attention is an op whose own kind names it (the last part of its framework op, its
    custom-call target, its name), not every op under an ``attention`` name scope: the
    projections of an attention block stay matmuls.
    """
    from exporter.analysis.sides.xla_host import RUNTIME_WAIT_RE

    if RUNTIME_WAIT_RE.match(name):
        return "runtime wait"
    category = (xla_category or "").lower()
    opcode = hlo.opcode if hlo else ""
    called = hlo.called_opcodes if hlo else set()
    if COLLECTIVE_RE.match(opcode) or COLLECTIVE_RE.match(category) or COLLECTIVE_RE.match(name):
        return "collectives"
    framework_op = framework_op or (hlo.framework_op if hlo else "")
    kind = framework_op.rsplit("/", 1)[-1]
    words = f"{name} {kind} {hlo.custom_call_target if hlo else ''}"
    if ATTENTION_RE.search(words):
        return "attention"
    if (
        opcode in MATMUL_OPCODES
        or called & MATMUL_OPCODES
        or category in MATMUL_CATEGORIES
        or re.match(r"^(dot|convolution|conv|gemm|cublas|matmul)", name)
    ):
        return "matmul/convolution"
    if (
        opcode == "custom-call"
        or category in ("custom-call", "custom_call")
        or name.startswith("custom-call")
    ):
        return "custom calls"
    if (
        opcode in FORMATTING_OPCODES
        or (called and called <= FORMATTING_OPCODES | {"parameter"})
        or category == DATA_FORMATTING_CATEGORY
        or DATA_FORMATTING_RE.match(name)
    ):
        return "data formatting"
    if (
        category in ELEMENTWISE_CATEGORIES
        or opcode in ELEMENTWISE_OPCODES
        or (called and called <= ELEMENTWISE_OPCODES)
    ):
        return "elementwise"
    if not hlo and not category:  # a CPU op without HLO: its name's stem
        stem = _NAME_STEM.match(name)
        if stem and stem.group(2).replace("_", "-") in ELEMENTWISE_OPCODES:
            return "elementwise"
    return "other"


def _op_self_times(facts: CaptureFacts) -> tuple[dict[tuple[str, str], int], int]:
    """(program, op) -> device self ns, and the device graph's total (top ops' basis);
    a program's ``(N)`` suffix is not part of its name."""
    graph = facts.graphs.get("device")
    if graph is None or graph.root.total <= 0:
        return {}, 0
    times: dict[tuple[str, str], int] = {}
    for program, op, _, _, value in _leaves(graph, facts.backend):
        key = (_PROGRAM_ID.sub("", program), op)
        times[key] = times.get(key, 0) + value
    return times, graph.root.total


def _leaves(graph: FlameGraph, backend: str) -> Iterator[tuple[str, str, str | None, str, int]]:
    """(program, op, XLA category, framework op, self ns) of each device-graph frame
    with self time."""
    for ancestors, node in graph.paths():
        if not node.self_value:
            continue
        names = [a.name for a in ancestors if a.name != graph.root.name]
        program = names[0] if names else ""
        # On a device plane an op's frames are program, name scope, XLA category, op
        # (xplane._op_labels); on CPU ops sit straight under their program.
        device = backend != "cpu" and len(names) > 1
        category = names[-1] if device else None
        scope = "/".join(names[1:-1]) if device else ""
        yield program, node.name, category, scope, node.self_value


def _find(programs: dict[str, dict[str, HloOp]], program: str, op: str) -> HloOp | None:
    found = programs.get(program, {}).get(op)
    if found is None:
        found = next((ops[op] for ops in programs.values() if op in ops), None)
    return found


def op_categories(
    graph: FlameGraph | None, backend: str, programs: dict[str, dict[str, HloOp]]
) -> OpCategories | None:
    """The op-category table: device self time per category, its share and top ops."""
    if graph is None or graph.root.total <= 0:
        return None
    total = graph.root.total
    times = dict.fromkeys(CATEGORIES, 0)
    ops: dict[str, dict[str, int]] = {c: {} for c in CATEGORIES}
    for program, op, category, scope, value in _leaves(graph, backend):
        row = op_category(op, category, _find(programs, program, op), scope)
        times[row] += value
        ops[row][op] = ops[row].get(op, 0) + value
    rows: list[OpCategoryRow] = [
        {
            "category": c,
            "self_ms": round(times[c] / 1e6, 3),
            "share_pct": round(100 * times[c] / total, 2),
            "ops": len(ops[c]),
            "top_op": max(ops[c], key=lambda k: ops[c][k]) if ops[c] else None,
        }
        for c in CATEGORIES
    ]
    return {
        "denominator": "device self time (the device flame graph's total)",
        "total_ms": round(total / 1e6, 3),
        "basis": "HLO protos in the capture"
        if programs
        else ("XLA op categories on the device planes" if backend != "cpu" else "op names"),
        "rows": rows,
    }


def _add_sources(
    facts: CaptureFacts, programs: dict[str, dict[str, HloOp]], xprof_ops: dict[str, Any]
) -> None:
    graph = facts.graphs.get("device")
    where: dict[str, tuple[str, str | None, str]] = {}
    if graph is not None:
        for program, op, category, scope, _ in _leaves(graph, facts.backend):
            where.setdefault(op, (program, category, scope))
    for top in facts.top_ops:
        program, category, scope = where.get(top["name"], ("", None, ""))
        hlo = _find(programs, program, top["name"])
        xprof_op = xprof_ops.get(top["name"]) or {}
        framework_op = (
            (hlo.framework_op if hlo else "") or xprof_op.get("framework_op") or scope or None
        )
        top["category"] = op_category(
            top["name"], category or xprof_op.get("category"), hlo, framework_op or ""
        )
        top["source"] = (hlo.source if hlo else None) or xprof_op.get("source")
        top["framework_op"] = framework_op


# --- XProf's roofline and peak allocations --------------------------------------------


def _tool(facts: CaptureFacts, fact: str) -> tuple[dict[str, Any] | None, str]:
    """XProf's answer for ``fact`` (from its one tool, xprof_tools.FACT_TOOLS), or why
    there is none."""
    from exporter.analysis.facts.xprof_tools import FACT_TOOLS

    skipped = (facts.xprof.get("skipped") or {}).get(fact)
    if skipped:
        return None, str(skipped)
    if not facts.xprof.get("available"):
        return None, str(facts.xprof.get("reason") or "XProf's converters did not run")
    name = FACT_TOOLS[fact]
    answer = (facts.xprof.get("tools") or {}).get(name) or {}
    if "error" in answer:
        return None, f"XProf's {name}: {answer['error']}"
    return answer.get("summary") or {}, ""


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def roofline(facts: CaptureFacts) -> Roofline:
    """The program's roofline from XProf's ``roofline_model`` (as ``get_roofline_model``)."""
    summary, reason = _tool(facts, "roofline")
    if summary is None:
        return {"available": False, "reason": reason}
    program = summary.get("program")
    if not program:
        return {
            "available": False,
            "reason": "XProf's roofline model has no rows for this capture (it models TPU "
            "and GPU device ops; a CPU capture has none)",
        }
    peak_flops = _float(summary.get("peak_flop_rate"))
    peak_hbm = _float(summary.get("peak_hbm_bw"))
    # As get_roofline_model: the measured FLOP rate, else the model's.
    flops = _float(program.get("measured_flop_rate")) or _float(program.get("model_flop_rate"))
    hbm = _float(program.get("hbm_bw"))
    utilisation = _float(program.get("hbm_bw_utilization"))
    hbm_pct = 100 * utilisation if utilisation > 0 else (100 * hbm / peak_hbm if peak_hbm else None)
    ridges = summary.get("ridge_points") or {}
    bound_by = str(program.get("bound_by") or "Unknown")
    ridge_key = {
        "HBM": "hbm_ridge_point",
        "CMEM Read": "cmem_read_ridge_point",
        "CMEM Write": "cmem_write_ridge_point",
        "VMEM Read": "vmem_read_ridge_point",
        "VMEM Write": "vmem_write_ridge_point",
    }.get(bound_by)
    custom = float(summary.get("custom_call_share_pct") or 0.0)
    overview, _ = _tool(facts, "mxu_utilization")
    mxu = (overview or {}).get("mxu_utilization_pct")
    out: Roofline = {
        "available": True,
        "source": "XProf roofline_model, program row (FLOPs from XLA's cost model)",
        "device_type": summary.get("device_type") or None,
        "bound_by": bound_by,
        "operational_intensity_flop_per_byte": round(
            _float(program.get("operational_intensity")), 4
        ),
        "bottleneck_operational_intensity_flop_per_byte": round(
            _float(program.get("bottleneck_operational_intensity")), 4
        ),
        "ridge_point_flop_per_byte": round(_float(ridges.get(ridge_key)), 4) if ridge_key else None,
        "hbm_ridge_point_flop_per_byte": round(_float(ridges.get("hbm_ridge_point")), 4),
        "achieved_flop_rate_gflops": round(flops, 2),
        "peak_flop_rate_gflops": round(peak_flops, 2),
        "compute_efficiency_pct": round(100 * _float(program.get("compute_efficiency")), 2),
        "hbm_bw_gibs": round(hbm, 2),
        "peak_hbm_bw_gibs": round(peak_hbm, 2),
        "hbm_bw_utilization_pct": round(hbm_pct, 2) if hbm_pct is not None else None,
        "max_mem_bw_utilization_pct": round(100 * _float(program.get("max_mem_bw_utilization")), 2),
        "roofline_efficiency_pct": round(100 * _float(program.get("roofline_efficiency")), 2),
        "total_time_ms": round(_float(program.get("total_time")) / 1000.0, 3),
        "custom_call_share_pct": round(custom, 2),
        "custom_call_ops": int(summary.get("custom_call_ops") or 0),
        # XProf's overview reports MXU utilisation from the TPU's counters; 0 where the
        # capture has none (a synthetic or a GPU capture), so 0 reads as "not reported".
        "mxu_utilization_pct": mxu if mxu else None,
    }
    out["custom_call_note"] = (
        f"Custom calls took {custom:.1f}% of device self time and count 0 FLOPs in XLA's "
        "cost model: the FLOP rate and operational intensity leave their work out."
        if custom > 0
        else "No custom calls: XLA's cost model counts every op's FLOPs."
    )
    return out


def _shape(shape: str | None) -> tuple[str | None, list[int] | None]:
    found = _SHAPE_RE.match(shape or "")
    if not found:
        return None, None
    return found.group(1), [int(d) for d in found.group(2).split(",") if d]


def peak_allocations(facts: CaptureFacts) -> PeakAllocations:
    """The largest buffers at the memory peak (XProf's memory viewer per module)."""
    summary, reason = _tool(facts, "peak_allocations")  # XProf's memory_viewer
    if summary is None:
        return {"available": False, "reason": reason}
    modules = sorted(
        summary.get("modules") or [], key=lambda m: -_float(m.get("total_allocation_mib"))
    )
    if not modules:
        return {"available": False, "reason": "XProf's memory viewer found no HLO module"}
    mib = 2**20
    top = modules[0]
    largest: list[Buffer] = []
    for buf in top.get("buffers", [])[:TOP_BUFFERS]:
        dtype, dims = _shape(buf.get("shape"))
        # XProf's row as XProf gives it (instruction, bytes, shape, ...: Buffer's keys).
        largest.append(cast(Buffer, {"module": top["module"], **buf, "dtype": dtype, "dims": dims}))
    return {
        "available": True,
        "source": "XProf memory_viewer per HLO module, as xprof get_peak_allocations",
        "file": Path(facts.files[0]).name if facts.files else None,
        "modules_total": summary.get("modules_total", len(modules)),
        "modules_skipped": summary.get("modules_skipped", 0),
        "modules": [
            {
                "module": m["module"],
                "total_allocation_bytes": round(_float(m.get("total_allocation_mib")) * mib),
                "peak_heap_bytes": round(_float(m.get("peak_heap_mib")) * mib),
                "parameters_bytes": round(_float(m.get("parameters_mib")) * mib),
                "buffer_count": m.get("buffer_count", 0),
                "buffers_basis": m.get("buffers_basis"),
            }
            for m in modules[:TOP_MODULES]
        ],
        "largest": largest,
    }


def read_programs(
    facts: CaptureFacts, paths: Sequence[Path]
) -> tuple[dict[str, dict[str, HloOp]], dict[str, str]]:
    """The captures' HLO instructions per program, and the damaged modules (why each).

    An unreadable capture's HLO is context, never a report's failure: ``unavailable.hlo``.
    """
    damaged: dict[str, str] = {}
    try:
        return hlo_ops(paths, damaged), damaged
    except Exception as exc:  # a capture's HLO is context: never a report's failure
        facts.unavailable["hlo"] = unreadable_hlo(exc)
        return {}, damaged


def unreadable_hlo(exc: Exception) -> str:
    """``unavailable.hlo`` for a capture whose HLO protos could not be read."""
    return f"the capture's HLO protos could not be read ({exc})"


def add_program_facts(
    facts: CaptureFacts,
    paths: Sequence[Path],
    programs: tuple[dict[str, dict[str, HloOp]], dict[str, str]] | None = None,
) -> None:
    """Fill ``roofline``, ``peak_allocations``, ``op_categories`` and top ops' sources.

    ``programs``: what :func:`read_programs` gave for ``paths`` (read here if not given).
    Nothing here fails a report: an unreadable HLO proto or an XProf answer of an
    unexpected shape makes its fact unavailable, with the reason.
    """
    ops, damaged = programs if programs is not None else read_programs(facts, paths)
    for key, build in (("roofline", roofline), ("peak_allocations", peak_allocations)):
        try:
            found = build(facts)
        except Exception as exc:  # an XProf answer of another shape (a new version)
            found = {"available": False, "reason": f"XProf's answer did not parse ({exc!r})"}
        setattr(facts, key, found)
        if not found.get("available"):
            facts.unavailable[key] = found["reason"]
    facts.op_categories = op_categories(facts.graphs.get("device"), facts.backend, ops)
    hlo_stats, _ = _tool(facts, "op_sources")
    _add_sources(facts, ops, (hlo_stats or {}).get("ops") or {})
    from exporter.analysis.facts.neighbourhood import add_neighbourhoods

    try:
        add_neighbourhoods(facts, ops, damaged, *_op_self_times(facts))
    except Exception as exc:  # context, never a report's failure
        facts.unavailable["neighbourhood"] = f"the HLO neighbourhood failed ({exc!r})"
