"""The split rule compiled (``_treegraphs.split``) is its twin ``nesting._split_loop``.

``nest(..., "split", core)`` runs the compiled sweep on a line whose events overlap
without nesting (a Python-traced thread: 37 k events in one line of the real JAX CPU
capture); ``_split_loop`` is the pure-Python twin that ``MLPROF_DECODER=python`` runs.
Both must give the same segments, field by field and in the same order, on every
shape: the rule itself, the reordering past ``REORDER_ABOVE``, ties, and the bound.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exporter.profiles import nesting, tree_graphs, xspace
from exporter.profiles.nesting import Nested, _split_loop, nest
from exporter.profiles.xplane import line_headers, load_capture
from exporter.profiles.xspace import line_pieces
from tests.harness import ROOT


def _arrays(events: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start = np.array([s for s, _ in events], np.int64)
    end = np.array([e for _, e in events], np.int64)
    # Labels unlike the indexes, so a segment's event and its label cannot be confused.
    return start, end, np.arange(len(events), dtype=np.int64) * 7 + 3


def _fields(nested: Nested) -> list[list[int]]:
    return [
        a.tolist() for a in (nested.start, nested.end, nested.label, nested.parent, nested.depth)
    ]


def _twin(start: np.ndarray, end: np.ndarray, label: np.ndarray) -> Nested:
    """What ``MLPROF_DECODER=python`` nests: numpy where the events nest properly, else
    the Python loop."""
    return nest(start, end, label, "split")


def _sweeps(start: np.ndarray, end: np.ndarray, label: np.ndarray) -> tuple[Nested, Nested]:
    """The two sweeps themselves on the events sorted by start: compiled and Python."""
    order = np.lexsort((-end, start))
    start, end, label = start[order], end[order], label[order]
    budget = nesting.MAX_SEGMENTS_PER_EVENT * len(start) + nesting.MIN_SEGMENT_BUDGET
    assert nesting._compiled_split is not None
    made = [np.frombuffer(x, np.int64) for x in
            nesting._compiled_split(start, end, nesting.REORDER_ABOVE, budget)]  # fmt: skip
    compiled = Nested(made[0], made[1], label[made[2]], made[3], made[4])
    return compiled, _split_loop(start, end, label)


def _shapes() -> list[list[tuple[int, int]]]:
    rng = random.Random(20261205)
    shapes: list[list[tuple[int, int]]] = [
        [(0, 100), (50, 150), (60, 70)],
        [(0, 100), (10, 200), (20, 300)],
        [(i, i + 10) for i in range(40)],  # a staircase
        [(i, 2_000 + i) for i in range(1_000)],  # a wide one: reordered at every end
        [(0, 10), (0, 10), (5, 10), (5, 20), (10, 20), (10, 10 + 1)],  # ties everywhere
        [(i, 4 * 300 - 2 * i) for i in range(150)]
        + [(2 * 300 + 2 * j + 1, 100 * 300 + j) for j in range(150)],  # a chain and longs
    ]
    for _ in range(300):  # sparse overlaps: the rule itself, few events above an end
        events = []
        for _ in range(rng.randint(1, 14)):
            s = rng.randint(0, 50)
            events.append((s, s + rng.randint(1, 30)))
        shapes.append(events)
    for _ in range(150):  # dense: many ends with more than REORDER_ABOVE events above
        events = []
        for _ in range(rng.randint(10, 80)):
            s = rng.randint(0, 100)
            events.append((s, s + rng.randint(1, 200)))
        shapes.append(events)
    for _ in range(50):  # wide ranges: ends near the int64 edges and past nesting.FAR
        events = []
        for _ in range(rng.randint(2, 30)):
            s = rng.randint(-(1 << 62), 1 << 62)
            events.append((s, min(s + rng.randint(1, 1 << 61), (1 << 63) - 1)))
        shapes.append(events)
    return shapes


def test_the_compiled_split_is_built_and_used() -> None:
    assert nesting._compiled_split is not None, "exporter.profiles._treegraphs was not built"
    assert tree_graphs.frame_maker() is not None


def test_the_compiled_split_is_the_python_loop_segment_for_segment() -> None:
    core = xspace.compiled_core()
    assert core is not None
    reordered = 0
    for events in _shapes():
        start, end, label = _arrays(events)
        compiled = nest(start, end, label, "split", core)
        assert _fields(compiled) == _fields(_twin(start, end, label)), events
        # The sweeps alone, on laminar lines too (which nest() gives the contain pass).
        swept, twin = _sweeps(start, end, label)
        assert _fields(swept) == _fields(twin), events
        reordered += len(twin) > 2 * len(events)
    assert reordered > 0  # shapes that make more segments than events were tried


@pytest.fixture(scope="module")
def python_traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real JAX CPU capture with the Python tracer on (bench's workload, 12 steps)."""
    out = tmp_path_factory.mktemp("python-traced")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "python_traced_workload.py"), str(out), "12"],
        capture_output=True, text=True, check=False, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.split("DONE ", 1)[1].strip())


def test_a_real_python_traced_line_nests_alike(python_traced: Path) -> None:
    # The shape the compiled sweep is for: the Python thread of a Python-traced capture,
    # whose calls overlap without nesting here and there (laminar lines reach neither).
    core = xspace.compiled_core()
    assert core is not None
    split_lines = 0
    with load_capture(python_traced) as capture:
        for ref in capture.host_planes:
            plane = capture.plane(ref)
            for header in line_headers(capture, plane):
                for ids, starts, ends in line_pieces(capture, plane, header.index):
                    order = np.lexsort((-ends, starts))
                    if not len(ids) or core.contain(starts[order], ends[order])[2]:
                        continue
                    split_lines += 1
                    compiled = nest(starts, ends, ids, "split", core)
                    assert _fields(compiled) == _fields(_twin(starts, ends, ids))
                    swept, twin = _sweeps(starts, ends, ids)
                    assert _fields(swept) == _fields(twin)
    assert split_lines > 0


def test_the_bound_is_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shape past the segment budget: both refuse it with one message, and the
    # compiled sweep holds at most the budget (plus one reopening) meanwhile.
    monkeypatch.setattr(nesting, "MIN_SEGMENT_BUDGET", 0)
    monkeypatch.setattr(nesting, "MAX_SEGMENTS_PER_EVENT", 1)
    start, end, label = _arrays([(i, 10 + i) for i in range(40)])
    with pytest.raises(ValueError) as twin:
        _split_loop(start, end, label)
    with pytest.raises(ValueError) as compiled:
        nest(start, end, label, "split", xspace.compiled_core())
    assert str(compiled.value) == str(twin.value)
    assert "refused" in str(twin.value)


def test_bad_buffers_are_one_error() -> None:
    split = nesting._compiled_split
    assert split is not None
    with pytest.raises(ValueError):
        split(np.zeros(3, np.int64), np.zeros(2, np.int64), 8, 100)
    with pytest.raises(ValueError):
        split(np.zeros(3, np.int32), np.zeros(3, np.int32), 8, 100)
    empty = split(np.zeros(0, np.int64), np.zeros(0, np.int64), 8, 100)
    assert [len(x) for x in empty] == [0] * 5
