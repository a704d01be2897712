"""The roofline and peak-allocation facts and their findings, either side of each
threshold; the op-category table's classification; op sources read from a hand-built
HLO proto in a capture's metadata plane; XProf's absence never failing a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts.capture import CaptureFacts
from exporter.analysis.facts.programs import (
    HloOp,
    add_program_facts,
    hlo_ops,
    op_category,
    peak_allocations,
    roofline,
)
from exporter.analysis.report import rules
from exporter.proto import xplane_pb2


def roofline_facts(intensity: float, **overrides: Any) -> CaptureFacts:
    ridge = 240.0
    r: dict[str, Any] = {
        "available": True,
        "bound_by": "HBM",
        "bottleneck_operational_intensity_flop_per_byte": intensity,
        "operational_intensity_flop_per_byte": intensity,
        "ridge_point_flop_per_byte": ridge,
        "achieved_flop_rate_gflops": 1000.0,
        "peak_flop_rate_gflops": 197000.0,
        "compute_efficiency_pct": 0.5,
        "hbm_bw_utilization_pct": 80.0,
        "custom_call_share_pct": 0.0,
        "custom_call_note": "No custom calls: XLA's cost model counts every op's FLOPs.",
    } | overrides
    return CaptureFacts(backend="tpu", roofline=r)


def memory_bound(facts: CaptureFacts) -> rules.Finding | None:
    return rules.MemoryBoundRule().apply(facts)


def test_memory_bound_is_p1_under_a_quarter_of_the_ridge_and_p2_above() -> None:
    below = memory_bound(roofline_facts(0.24 * 240.0))
    above = memory_bound(roofline_facts(0.26 * 240.0))
    assert below is not None and below.priority == "P1"
    assert above is not None and above.priority == "P2"
    assert below.evidence["ridge_point_flop_per_byte"] == 240.0
    assert "57.6 FLOP/B" in below.title and "HBM" in below.title


def test_memory_bound_stays_silent_when_compute_bound_unknown_or_custom_calls_dominate() -> None:
    assert memory_bound(roofline_facts(300.0, bound_by="Compute")) is None
    assert memory_bound(CaptureFacts(roofline={"available": False, "reason": "CPU"})) is None
    assert memory_bound(CaptureFacts()) is None
    assert memory_bound(roofline_facts(10.0, custom_call_share_pct=50.0)) is None
    found = memory_bound(roofline_facts(10.0, custom_call_share_pct=49.0))
    assert found is not None and found.evidence["custom_call_share_pct"] == 49.0


def test_oom_finding_names_the_largest_buffers() -> None:
    memory = {"peak_bytes": 95, "capacity_bytes": 100, "peak_pct": 95.0, "source": "x"}
    buffer = {
        "module": "jit_train_step(3)",
        "instruction": "fusion.7",
        "bytes": 3 * 2**30,
        "shape": "bf16[8,2048,4096]{2,1,0}",
        "source": "train.py:88",
    }
    named = rules.OomRiskRule().apply(
        CaptureFacts(memory=memory, peak_allocations={"available": True, "largest": [buffer]})
    )
    assert named is not None and named.priority == "P0"
    assert "fusion.7 3072.0 MiB bf16[8,2048,4096]" in named.detail and "train.py:88" in named.detail
    assert named.evidence["largest_buffer_bytes"] == 3 * 2**30
    assert named.to_json()["largest_buffers"][0]["instruction"] == "fusion.7"
    bare = rules.OomRiskRule().apply(CaptureFacts(memory=memory | {"peak_pct": 76.0}))
    assert bare is not None and bare.priority == "P1" and "Largest" not in bare.detail


@pytest.mark.parametrize(
    ("name", "category", "hlo", "framework_op", "expected"),
    [
        ("all-reduce-start.3", None, None, "", "collectives"),
        ("fusion.1", "all-gather", None, "", "collectives"),
        ("custom-call.2", "custom-call", None, "model/attn/flash_attention", "attention"),
        ("custom-call.2", "custom-call", None, "model/attention/my_kernel", "custom calls"),
        ("fusion.3", "loop fusion", None, "model/attention/add", "elementwise"),
        ("ynn_fusion.3", None, HloOp("fusion", {"dot", "parameter"}), "", "matmul/convolution"),
        ("fusion.9", "convolution fusion", None, "", "matmul/convolution"),
        ("copy.4", "data formatting", None, "", "data formatting"),
        ("transpose.2", None, HloOp("transpose"), "", "data formatting"),
        ("wrapped_tanh", None, HloOp("fusion", {"tanh", "parameter"}), "", "elementwise"),
        ("wrapped_sine.3", None, None, "", "elementwise"),
        ("ThunkExecutor::Execute (wait for completion)", None, None, "", "runtime wait"),
        ("sort.1", None, HloOp("sort"), "", "other"),
    ],
)
def test_op_categories(
    name: str, category: str | None, hlo: HloOp | None, framework_op: str, expected: str
) -> None:
    assert op_category(name, category, hlo, framework_op) == expected


# --- a hand-built HLO proto (wire format: xla/service/hlo.proto field numbers) ---------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _msg(*fields: tuple[int, int | bytes | str]) -> bytes:
    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += _varint(number << 3) + _varint(value)
        else:
            data = value.encode() if isinstance(value, str) else value
            out += _varint(number << 3 | 2) + _varint(len(data)) + data
    return out


def _hlo_proto() -> bytes:
    fused = _msg(
        (1, "fused_computation"),
        (5, 7),
        (2, _msg((1, "param_0"), (2, "parameter"))),
        (2, _msg((1, "dot.0"), (2, "dot"))),
    )
    entry = _msg(
        (1, "main"),
        (5, 8),
        # metadata: op_name, then the stack frame id (source via the module's index)
        (2, _msg((1, "fusion.1"), (2, "fusion"), (7, _msg((2, "jit(f)/dot_general"), (15, 1))),
                 (38, _varint(7)))),
        (2, _msg((1, "copy.2"), (2, "copy"),
                 (7, _msg((2, "jit(f)/transpose"), (3, "model.py"), (4, 12))))),
    )  # fmt: skip
    stack_index = _msg(
        (1, "train.py"),
        (2, "step"),
        (3, _msg((1, 1), (2, 1), (3, 44))),
        (4, _msg((1, 1))),
    )
    return _msg((1, _msg((1, "jit_f"), (3, fused), (3, entry), (17, stack_index))))


def _capture_with_hlo(path: Path, hlo: bytes) -> Path:
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:metadata")
    plane.stat_metadata[1].id, plane.stat_metadata[1].name = 1, "Hlo Proto"
    meta = plane.event_metadata[1]
    meta.id, meta.name = 1, "jit_f(5)"
    meta.stats.add(metadata_id=1).bytes_value = hlo
    other = space.planes.add(id=2, name="/host:CPU")
    other.lines.add(id=1, name="python")
    path.write_bytes(space.SerializeToString())
    return path


def test_hlo_ops_read_opcodes_fused_calls_and_source_lines(tmp_path: Path) -> None:
    path = _capture_with_hlo(tmp_path / "h.xplane.pb", _hlo_proto())
    ops = hlo_ops([path])["jit_f"]
    assert ops["fusion.1"].opcode == "fusion" and ops["fusion.1"].called_opcodes == {
        "parameter",
        "dot",
    }
    assert ops["fusion.1"].source == "train.py:44"  # through the stack-frame index
    assert ops["copy.2"].source == "model.py:12"  # inline in the metadata
    assert op_category("fusion.1", None, ops["fusion.1"]) == "matmul/convolution"
    assert op_category("copy.2", None, ops["copy.2"]) == "data formatting"


def test_a_damaged_hlo_proto_gives_no_sources_and_no_failure(tmp_path: Path) -> None:
    path = _capture_with_hlo(tmp_path / "bad.xplane.pb", b"\x0a\xff\xff\xff\x0f")
    assert hlo_ops([path]) == {}
    facts = CaptureFacts(backend="cpu", xprof={"available": False, "reason": "not asked"})
    add_program_facts(facts, [path])
    assert facts.roofline == {"available": False, "reason": "not asked"}
    assert facts.peak_allocations == {"available": False, "reason": "not asked"}
    assert facts.unavailable["roofline"] == "not asked"


def test_an_unreadable_hlo_is_a_reason_not_a_failed_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The HLO is read once per capture with its host's facts (CPU collectives' opcodes
    # come from it): a capture whose metadata plane cannot be read still gets a report.
    from exporter.analysis.facts import programs as program_facts
    from exporter.analysis.report.document import analyze
    from exporter.errors import InputError

    path = _capture_with_hlo(tmp_path / "h.xplane.pb", _hlo_proto())
    read: list[str] = []

    def unreadable(capture: Any, damaged: Any = None) -> Any:
        read.append(capture.source)
        raise InputError("the metadata plane does not parse")

    monkeypatch.setattr(program_facts, "capture_hlo_ops", unreadable)
    facts = analyze(str(path), xprof=False).facts
    assert facts.unavailable["hlo"] == program_facts.unreadable_hlo(
        InputError("the metadata plane does not parse")
    )
    assert len(read) == 1  # once for the capture, not again for the program facts


def test_xprof_tool_errors_become_reasons() -> None:
    facts = CaptureFacts(
        xprof={
            "available": True,
            "tools": {
                "roofline_model": {"error": "ValueError: boom"},
                "memory_viewer": {"summary": {"modules": []}},
            },
        }
    )
    assert roofline(facts) == {
        "available": False,
        "reason": "XProf's roofline_model: ValueError: boom",
    }
    assert peak_allocations(facts)["reason"] == "XProf's memory viewer found no HLO module"
    no_rows = CaptureFacts(
        xprof={"available": True, "tools": {"roofline_model": {"summary": {"program": None}}}}
    )
    assert "no rows" in roofline(no_rows)["reason"]
