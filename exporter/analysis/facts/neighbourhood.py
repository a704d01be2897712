"""Each top op's HLO neighbourhood: its producers (operands) and consumers (users).

Read from the module's HLO proto in the capture (the instructions
:func:`program_facts.hlo_ops` reads, with their operand ids resolved in their
computation), as ``xprof get_hlo_neighborhood --radius=1`` answers on the same file.
Each neighbour has its opcode, its shape as XLA prints it, and its own share of device
self time where it is itself an op of the capture (``null`` where it never ran as one:
a parameter, a constant, an op inside a fusion). At most :data:`MAX_NEIGHBOURS` of each,
operands in operand order, users in program order, with the totals beside them.

The data-formatting ops of ``facts.compiler`` get theirs too, so the finding can say
what each copy / transpose / convert sits between. A capture without HLO protos, or with
a damaged one, gives no neighbourhood (``null``) and a reason in ``unavailable``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.analysis.facts.types import FormattingOp, Neighbour, Neighbourhood, TopOp

if TYPE_CHECKING:
    from exporter.analysis.facts.capture import CaptureFacts
    from exporter.analysis.facts.programs import HloOp

__all__ = ["MAX_NEIGHBOURS", "add_neighbourhoods", "neighbourhood"]

MAX_NEIGHBOURS: Final = 5


def _entry(op: HloOp, program: str, times: dict[tuple[str, str], int], total: int) -> Neighbour:
    ns = times.get((program, op.name))
    return {
        "name": op.name,
        "opcode": op.opcode,
        "shape": op.shape or None,
        "share_pct": round(100 * ns / total, 2) if ns and total else None,
        "self_ms": round(ns / 1e6, 3) if ns else None,
    }


def neighbourhood(
    op: HloOp, program: str, times: dict[tuple[str, str], int], total: int
) -> Neighbourhood:
    """An instruction's producers and consumers (radius 1), at most MAX_NEIGHBOURS each."""
    return {
        "module": op.module or None,
        "opcode": op.opcode,
        "shape": op.shape or None,
        "producers": [_entry(o, program, times, total) for o in op.operands[:MAX_NEIGHBOURS]],
        "consumers": [_entry(u, program, times, total) for u in op.users[:MAX_NEIGHBOURS]],
        "producers_total": len(op.operands),
        "consumers_total": len(op.users),
    }


def _locate(
    name: str, programs: dict[str, dict[str, HloOp]], times: dict[tuple[str, str], int]
) -> tuple[str, HloOp] | None:
    """The program an op ran in most (an op name can be in several) and its instruction."""
    ran = sorted(((ns, p) for (p, op), ns in times.items() if op == name), reverse=True)
    for _, program in ran:
        found = programs.get(program, {}).get(name)
        if found is not None:
            return program, found
    for program, ops in programs.items():  # device planes may name programs otherwise
        if name in ops:
            return program, ops[name]
    return None


def add_neighbourhoods(
    facts: CaptureFacts,
    programs: dict[str, dict[str, HloOp]],
    damaged: dict[str, str],
    times: dict[tuple[str, str], int],
    total: int,
) -> None:
    """``neighbourhood`` of each top op and each data-formatting op of ``compiler``;
    ``times``: each (program, op)'s device self ns, ``total`` the device graph's."""
    targets: list[TopOp | FormattingOp] = [*facts.top_ops]
    if facts.compiler is not None:
        targets += facts.compiler["ops"]
    missing: list[str] = []
    for target in targets:
        found = _locate(target["name"], programs, times)
        target["neighbourhood"] = neighbourhood(found[1], found[0], times, total) if found else None
        if found is None and target["name"] not in missing:
            missing.append(target["name"])
    if not missing:
        return
    if damaged:
        modules = ", ".join(sorted(damaged)[:3])
        why = f"the HLO proto of {modules} is damaged ({next(iter(damaged.values()))})"
    elif not programs:
        why = (
            "the capture has no HLO protos (JAX writes them into its /host:metadata plane; "
            "this capture has none)"
        )
    else:
        why = "no instruction of that name in the capture's HLO protos"
    facts.unavailable["neighbourhood"] = (
        f"no HLO neighbourhood for {len(missing)} of {len({t['name'] for t in targets})} ops "
        f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): {why}"
    )
