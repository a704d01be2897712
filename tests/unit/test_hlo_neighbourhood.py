"""Top ops' HLO neighbourhood (producers and consumers) read from a hand-built HLO proto
in a capture's metadata plane, and the data-formatting finding naming what each copy
sits between; a missing or damaged proto gives no neighbourhood and a reason."""

from __future__ import annotations

from pathlib import Path

from exporter.analysis.facts.capture import CaptureFacts, _compiler, _top_ops
from exporter.analysis.facts.neighbourhood import MAX_NEIGHBOURS, neighbourhood
from exporter.analysis.facts.programs import add_program_facts, hlo_ops
from exporter.analysis.report import rules
from exporter.profiles.flamegraph import FlameGraph
from tests.unit.test_program_facts import _capture_with_hlo, _msg, _varint

F32 = 11


def _shape(*dims: int, layout: tuple[int, ...] | None = None) -> bytes:
    minor_to_major = layout if layout is not None else tuple(range(len(dims) - 1, -1, -1))
    return _msg(
        (2, F32),
        (3, b"".join(_varint(d) for d in dims)),
        (5, _msg((1, b"".join(_varint(i) for i in minor_to_major)))),
    )


def _inst(name: str, opcode: str, inst_id: int, shape: bytes, *operands: int) -> bytes:
    fields: list[tuple[int, int | bytes | str]] = [
        (1, name),
        (2, opcode),
        (3, shape),
        (35, inst_id),
    ]
    if operands:
        fields.append((36, b"".join(_varint(o) for o in operands)))  # packed operand_ids
    return _msg(*fields)


def _module() -> bytes:
    """p = param; fusion.2(p); copy.3(fusion.2) transposed; dot.7(copy.3, p) the root;
    seven add.N(p, p) so that p has more users than are listed."""
    x = _shape(8, 16)
    entry = [
        _inst("p", "parameter", 1, x),
        _inst("fusion.2", "fusion", 2, x, 1),
        _inst("copy.3", "copy", 3, _shape(8, 16, layout=(0, 1)), 2),
        _inst("dot.7", "dot", 4, _shape(16, 16), 3, 1),
        *(_inst(f"add.{i}", "add", 10 + i, x, 1, 1) for i in range(7)),
    ]
    # A fused computation whose ids collide with the entry's: ids are per computation.
    fused = _msg(
        (1, "fused_computation"), (5, 7), (2, _inst("param_0", "parameter", 1, x)),
        (2, _inst("neg.1", "negate", 2, x, 1)),
    )  # fmt: skip
    main = _msg((1, "main"), (5, 8), *((2, i) for i in entry))
    return _msg((1, _msg((1, "jit_f"), (3, fused), (3, main))))


def _facts(path: Path | None) -> CaptureFacts:
    graph = FlameGraph(sample_type="device_time", unit="nanoseconds")
    for op, ms in (("copy.3", 40), ("dot.7", 30), ("fusion.2", 20), ("add.0", 10)):
        graph.add(["jit_f", op], ms * 1_000_000)
    facts = CaptureFacts(
        backend="cpu",
        graphs={"device": graph},
        xprof={"available": False, "reason": "not asked"},
    )
    facts.top_ops = _top_ops(graph)
    facts.compiler = _compiler(graph)
    add_program_facts(facts, [path] if path else [])
    return facts


def test_graph_and_shapes_are_read_per_computation(tmp_path: Path) -> None:
    ops = hlo_ops([_capture_with_hlo(tmp_path / "n.xplane.pb", _module())])["jit_f"]
    copy = ops["copy.3"]
    assert copy.module == "jit_f(5)" and copy.shape == "f32[8,16]{0,1}"
    assert [o.name for o in copy.operands] == ["fusion.2"]
    assert [u.name for u in copy.users] == ["dot.7"]
    assert [o.name for o in ops["dot.7"].operands] == ["copy.3", "p"]
    assert [o.name for o in ops["neg.1"].operands] == ["param_0"]  # not the entry's p
    assert len(ops["p"].users) == 9  # fusion.2, dot.7, add.0..6 (each once)


def test_top_ops_carry_producers_and_consumers_with_their_time(tmp_path: Path) -> None:
    facts = _facts(_capture_with_hlo(tmp_path / "n.xplane.pb", _module()))
    top = {o["name"]: o for o in facts.top_ops}
    near = top["copy.3"]["neighbourhood"]
    assert near["module"] == "jit_f(5)" and near["opcode"] == "copy"
    assert near["producers"] == [
        {"name": "fusion.2", "opcode": "fusion", "shape": "f32[8,16]{1,0}", "share_pct": 20.0,
         "self_ms": 20.0}
    ]  # fmt: skip
    assert near["consumers"][0]["name"] == "dot.7" and near["consumers"][0]["share_pct"] == 30.0
    dot = top["dot.7"]["neighbourhood"]
    param = dot["producers"][1]
    assert param["name"] == "p" and param["share_pct"] is None  # never ran as an op
    assert dot["consumers"] == [] and dot["consumers_total"] == 0
    assert top["add.0"]["neighbourhood"]["producers_total"] == 1  # add.0(p, p): p once
    assert "neighbourhood" not in facts.unavailable
    # The parameter's nine users are capped at five, the total kept.
    p = hlo_ops([tmp_path / "n.xplane.pb"])["jit_f"]["p"]
    capped = neighbourhood(p, "jit_f", {}, 0)
    assert len(capped["consumers"]) == MAX_NEIGHBOURS and capped["consumers_total"] == 9


def test_formatting_finding_says_what_a_copy_sits_between(tmp_path: Path) -> None:
    facts = _facts(_capture_with_hlo(tmp_path / "n.xplane.pb", _module()))
    found = rules.CompilerInefficiencyRule().apply(facts)
    assert found is not None and found.priority == "P1"  # copy.3: 40 % of device time
    assert "copy.3 f32[8,16]{0,1} between fusion.2 (producer) and dot.7 (consumer)" in (
        found.detail
    )
    assert found.evidence["ops_placed"] == 1
    placed = found.to_json()["formatting_ops"][0]
    assert placed["name"] == "copy.3" and placed["producers"][0]["name"] == "fusion.2"
    assert placed["consumers"][0] == {
        "name": "dot.7", "opcode": "dot", "shape": "f32[16,16]{1,0}", "share_pct": 30.0
    }  # fmt: skip


def test_no_or_a_damaged_proto_gives_no_neighbourhood_and_a_reason(tmp_path: Path) -> None:
    bare = _facts(None)
    assert all(o["neighbourhood"] is None for o in bare.top_ops)
    assert "no HLO protos" in bare.unavailable["neighbourhood"]
    found = rules.CompilerInefficiencyRule().apply(bare)
    assert found is not None and "between" not in found.detail
    assert "formatting_ops" not in found.to_json()
    damaged = _facts(_capture_with_hlo(tmp_path / "bad.xplane.pb", b"\x0a\xff\xff\xff\x0f"))
    assert all(o["neighbourhood"] is None for o in damaged.top_ops)
    assert "jit_f(5) is damaged" in damaged.unavailable["neighbourhood"]
    assert damaged.op_categories is not None  # the rest of the report stands
