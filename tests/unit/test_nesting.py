"""Nesting events of one line into segments: the contain and split rules."""

from __future__ import annotations

import random

import numpy as np

from exporter.profiles import xspace
from exporter.profiles.nesting import (
    Nested,
    _contain_loop,
    _proper,
    _split_loop,
    aggregate,
    dense_index,
    nest,
    window_self,
)


def _arrays(events: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start = np.array([s for s, _ in events], np.int64)
    end = np.array([e for _, e in events], np.int64)
    return start, end, np.arange(len(events), dtype=np.int64)


def _laminar(rng: random.Random, lo: int, hi: int, depth: int) -> list[tuple[int, int]]:
    """Random properly nested intervals inside [lo, hi)."""
    out: list[tuple[int, int]] = []
    at = lo
    while at < hi and rng.random() < 0.8:
        start = rng.randint(at, hi - 1)
        end = rng.randint(start + 1, hi)
        out.append((start, end))
        if depth and end - start > 1:
            out.extend(_laminar(rng, start, end, depth - 1))
        at = end
    return out


def test_vectorised_nesting_matches_the_stack_loop_on_proper_nesting() -> None:
    rng = random.Random(7)
    for _ in range(200):
        events = _laminar(rng, 0, 1000, 6)
        if not events:
            continue
        start, end, label = _arrays(events)
        nested = nest(start, end, label, "contain")
        order = np.lexsort((-end, start))
        parent, depth = _contain_loop(start[order], end[order])
        assert (nested.parent == parent).all()
        assert (nested.depth == depth).all()
        assert (nested.label == label[order]).all()


def test_contain_rule_makes_a_partial_overlap_a_sibling() -> None:
    # XProf: b is not inside a, so a closes; both keep their whole duration.
    start, end, label = _arrays([(0, 100), (10, 60), (40, 90)])
    nested = nest(start, end, label, "contain")
    assert nested.parent.tolist() == [-1, 0, 0]
    assert (nested.end - nested.start).tolist() == [100, 50, 50]


def _check_split(events: list[tuple[int, int]]) -> None:
    start, end, label = _arrays(events)
    nested = nest(start, end, label, "split")
    # Every event's time stays under its own label, whole.
    per_label = np.bincount(nested.label, weights=nested.end - nested.start, minlength=len(events))
    assert per_label.tolist() == (end - start).tolist()
    # Segments nest properly, parents first.
    for i, p in enumerate(nested.parent.tolist()):
        if p >= 0:
            assert p < i
            assert nested.start[p] <= nested.start[i] and nested.end[i] <= nested.end[p]
            assert nested.depth[i] == nested.depth[p] + 1
    # The top level covers exactly the busy time (the union of the events).
    busy = 0
    last = -1
    for s, e in sorted(events):
        if e > last:
            busy += e - max(s, last)
            last = e
    top = nested.parent < 0
    assert int((nested.end - nested.start)[top].sum()) == busy


def test_split_rule_keeps_each_events_time_under_its_name() -> None:
    # b begins inside a and outlives it: its head under a, its tail beside a; c lies
    # wholly inside a, after b began (it must not vanish).
    start, end, label = _arrays([(0, 100), (50, 150), (60, 70)])
    nested = nest(start, end, label, "split")
    rows = list(zip(nested.start.tolist(), nested.end.tolist(), nested.label.tolist(), strict=True))
    parents = nested.parent.tolist()
    assert rows == [(0, 100, 0), (50, 100, 1), (60, 70, 2), (100, 150, 1)]
    assert parents == [-1, 0, 1, -1]
    _check_split([(0, 100), (50, 150), (60, 70)])


def test_split_rule_on_random_overlaps() -> None:
    rng = random.Random(3)
    for _ in range(300):
        events = []
        for _ in range(rng.randint(1, 12)):
            s = rng.randint(0, 50)
            events.append((s, s + rng.randint(1, 30)))
        _check_split(events)


def test_split_loop_on_a_staircase() -> None:
    events = [(i, i + 10) for i in range(40)]  # each begins inside the previous
    _check_split(events)
    start, end, label = _arrays(events)
    assert len(_split_loop(start, end, label)) > len(events)


def test_window_self_splits_by_overlap() -> None:
    start, end, label = _arrays([(0, 100), (20, 40)])
    nested = nest(start, end, label, "contain")
    windows = np.array([[0, 30], [30, 1000]], np.int64)
    nodes, wins, ps = window_self(nested, np.array([1, 2]), windows)
    got = {(int(n), int(w)): int(v) for n, w, v in zip(nodes, wins, ps, strict=True)}
    assert got == {(1, 0): 20, (2, 0): 10, (1, 1): 60, (2, 1): 10}


def test_dense_index_and_exact_aggregate() -> None:
    values = np.array([5, 3, 5, 10**15, 3], np.int64)
    uniq, index = dense_index(values)
    assert uniq.tolist() == [3, 5, 10**15] and index.tolist() == [1, 0, 1, 2, 0]
    big = (1 << 53) + 1  # not exact in float64
    keys, sums = aggregate(np.array([1, 1, 2]), np.array([big, big, -7]))
    assert keys.tolist() == [1, 2] and sums.tolist() == [2 * big, -7]


def _busy(events: list[tuple[int, int]]) -> int:
    busy, last = 0, -1
    for s, e in sorted(events):
        if e > last:
            busy += e - max(s, last)
            last = e
    return busy


def test_split_of_a_wide_staircase_is_linear_and_exact() -> None:
    # 10,000 events, each starting inside the previous and outliving it, all open at
    # once (the attack: a stack rebuilt at every end made 50M segments, 8 GB). Now a
    # few segments per event, every event's time under its own name, busy time on top.
    small = 1_000  # the old rule made 500,500 segments of these 1,000
    start, end, label = _arrays([(i, small + i) for i in range(small)])
    assert len(nest(start, end, label, "split")) <= 4 * small
    n = 10_000
    events = [(i, n + i) for i in range(n)]
    start, end, label = _arrays(events)
    nested = nest(start, end, label, "split")
    assert len(nested) <= 4 * n
    per_label = np.bincount(nested.label, weights=nested.end - nested.start, minlength=n)
    assert per_label.tolist() == (end - start).tolist()
    top = nested.parent < 0
    assert int((nested.end - nested.start)[top].sum()) == _busy(events)
    inner = np.flatnonzero(nested.parent >= 0)
    outer = nested.parent[inner]
    assert (outer < inner).all()
    assert (nested.start[outer] <= nested.start[inner]).all()
    assert (nested.end[inner] <= nested.end[outer]).all()
    assert (nested.depth[inner] == nested.depth[outer] + 1).all()


def test_split_stays_near_linear_on_other_overlap_shapes() -> None:
    # Shapes that defeat one ordering or the other: a chain whose ends interleave with
    # the starts of long events, and two interleaved staircases.
    n = 8_000
    half = n // 2
    chain = [(i, 4 * n - 2 * i) for i in range(half)]
    longs = [(2 * n + 2 * j + 1, 100 * n + j) for j in range(half)]
    stairs = [(2 * i, 2 * i + n) for i in range(half)] + [
        (2 * i + 1, 2 * i + 1 + n // 3) for i in range(half)
    ]
    for events in (chain + longs, stairs):
        start, end, label = _arrays(events)
        nested = nest(start, end, label, "split")
        assert len(nested) <= 16 * n
        per_label = np.bincount(nested.label, weights=nested.end - nested.start, minlength=n)
        assert per_label.tolist() == (end - start).tolist()
        top = nested.parent < 0
        assert int((nested.end - nested.start)[top].sum()) == _busy(events)


def test_split_keeps_start_order_while_few_events_are_above() -> None:
    # Two events above the one that ends: they continue one level up, in start order.
    start, end, label = _arrays([(0, 100), (10, 200), (20, 300)])
    nested = nest(start, end, label, "split")
    rows = list(zip(nested.start.tolist(), nested.end.tolist(), nested.label.tolist(), strict=True))
    assert rows == [(0, 100, 0), (10, 100, 1), (20, 100, 2), (100, 200, 1), (100, 200, 2),
                    (200, 300, 2)]  # fmt: skip
    assert nested.parent.tolist() == [-1, 0, 1, -1, 3, -1]


def test_split_keeps_its_invariants_where_it_reorders() -> None:
    # Dense random overlaps: many ends with more than REORDER_ABOVE events above.
    rng = random.Random(11)
    for _ in range(200):
        events = []
        for _ in range(rng.randint(10, 60)):
            s = rng.randint(0, 100)
            events.append((s, s + rng.randint(1, 200)))
        _check_split(events)


def _fields(nested: Nested) -> list[list[int]]:
    return [
        a.tolist() for a in (nested.start, nested.end, nested.label, nested.parent, nested.depth)
    ]


def test_the_compiled_nesting_is_the_numpy_one() -> None:
    # The compiled core's contain pass (exporter/profiles/_xwire.c) in place of _proper
    # and _contain_loop: the same segments for both rules, on proper nesting, on random
    # overlaps (ties in start and end included) and on staircases. tests/unit/
    # test_decoder.py holds whole graphs to it; this holds each segment.
    core = xspace._xwire
    assert core is not None, "exporter.profiles._xwire was not built"
    rng = random.Random(11)
    shapes: list[list[tuple[int, int]]] = [[], [(5, 6)], [(i, i + 10) for i in range(40)]]
    for _ in range(200):
        shapes.append(_laminar(rng, 0, 1000, 6))
        overlapping = []
        for _ in range(rng.randint(1, 14)):
            s = rng.randint(0, 40)
            overlapping.append((s, s + rng.randint(1, 25)))
        shapes.append(overlapping)
    laminar_seen = {True: 0, False: 0}
    for events in shapes:
        start, end, label = _arrays(events)
        for rule in ("contain", "split"):
            numpy_nested = nest(start, end, label, rule)
            compiled = nest(start, end, label, rule, core)
            assert _fields(compiled) == _fields(numpy_nested), (rule, events)
        if events:
            order = np.lexsort((-end, start))
            laminar = core.contain(start[order], end[order])[2]
            laminar_seen[laminar] += 1
            assert laminar == (_proper(start[order], end[order]) is not None), events
    assert min(laminar_seen.values()) > 50  # both kinds of line were tried
