"""Interval arithmetic behind the step breakdown, against a naive reference."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from exporter.analysis.facts.capture import CaptureFacts, _host_facts
from exporter.analysis.facts.intervals import covered, subtract, union
from exporter.proto import xplane_pb2
from tests.xspace_builder import PlaneBuilder


def naive_covered(starts: list[int], ends: list[int], lo: int, hi: int) -> int:
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in zip(starts, ends, strict=True))


def test_covered_and_subtract_match_a_naive_sweep() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randrange(0, 30)
        starts = np.array([rng.randrange(0, 1000) for _ in range(n)], np.int64)
        ends = starts + np.array([rng.randrange(1, 100) for _ in range(n)], np.int64)
        merged = union(starts, ends)
        cut = union(starts[::2] + 5, starts[::2] + 40)
        rest = subtract(*merged, *cut)
        spans = [(lo, lo + rng.randrange(0, 300)) for lo in
                 (rng.randrange(-50, 1100) for _ in range(rng.randrange(1, 8)))]  # fmt: skip
        for (lo, hi), got in zip(spans, covered(*merged, spans).tolist(), strict=True):
            assert got == naive_covered(merged[0].tolist(), merged[1].tolist(), lo, hi)
        for lo, hi in spans:
            whole = naive_covered(merged[0].tolist(), merged[1].tolist(), lo, hi)
            removed = sum(
                naive_covered([a], [b], lo, hi)
                for a, b in zip(*union(*_intersect(merged, cut)), strict=True)
            )
            assert covered(*rest, [(lo, hi)])[0] == whole - removed


def _intersect(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    pieces = [
        (max(s1, s2), min(e1, e2))
        for s1, e1 in zip(*(x.tolist() for x in a), strict=True)
        for s2, e2 in zip(*(x.tolist() for x in b), strict=True)
        if min(e1, e2) > max(s1, s2)
    ]
    return np.array([p[0] for p in pieces], np.int64), np.array([p[1] for p in pieces], np.int64)


def test_device_busy_per_step_is_the_union_of_op_time_averaged_over_chips(tmp_path: Path) -> None:
    # Two chips, two steps (0-1000 ns, 1000-2000 ns). Chip 0 runs a `while` (100-500)
    # with a body op nested in it (200-300) and an op (900-1100) that crosses into step
    # 2; chip 1 runs one op in each step. Nested time must not count twice, and time is
    # cut at the step boundary.
    space = xplane_pb2.XSpace()
    chips = [PlaneBuilder(space, f"/device:TPU:{n}") for n in (0, 1)]
    for chip in chips:
        steps = chip.line("Steps")
        chip.event(steps, "1", 0, 1000, step_num=1)
        chip.event(steps, "2", 1000, 1000, step_num=2)
    ops = chips[0].line("XLA Ops")
    chips[0].event(ops, "while.1", 100, 400)
    chips[0].event(ops, "fusion.2", 200, 100)
    chips[0].event(ops, "fusion.3", 900, 200)
    ops = chips[1].line("XLA Ops")
    chips[1].event(ops, "fusion.2", 0, 300)
    chips[1].event(ops, "fusion.3", 1500, 250)
    path = tmp_path / "tpu.xplane.pb"
    path.write_bytes(space.SerializeToString())

    host = _host_facts(path, CaptureFacts())

    # chip 0: 400 + 100 in step 1, 100 in step 2; chip 1: 300, then 250
    assert host.xla_busy.tolist() == [(500 + 300) / 2, (100 + 250) / 2]
    assert [hi - lo for lo, hi in host.cycles] == [1000, 1000]
