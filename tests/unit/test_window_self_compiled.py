"""Self time per (node, window) compiled (``_treegraphs.window_self``) is the numpy one.

``nesting.window_self`` splits each segment's self time across time windows; a
compare's per-step graphs call it for every line with the step windows. With the
compiled core in use it runs in one compiled pass; the numpy code is its twin
(``MLPROF_DECODER=python``). Both must give the same sparse sums, in the same order,
zero sums included, on any nesting and any windows (cut inside segments, empty, past
the line, one window around everything) and through either of the pass's tables.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from exporter.profiles import nesting, xspace
from exporter.profiles.nesting import nest, window_self


def _windows(rng: random.Random, lo: int, hi: int) -> np.ndarray:
    shape = rng.randrange(4)
    if shape == 0:  # one window around everything: the whole-line case
        return np.array([[lo - 5, hi + 5]], np.int64)
    edges = sorted(rng.sample(range(lo - 50, hi + 50), 2 * rng.randint(1, 12)))
    if shape == 1:  # tiles: each ends where the next starts, some empty
        edges = edges[: len(edges) // 2 + 1]
        pairs = list(itertools.pairwise(sorted([*edges, rng.choice(edges)])))  # one empty
    else:  # gaps between windows
        pairs = list(zip(edges[::2], edges[1::2], strict=True))
    return np.array(pairs, np.int64)


def _case(rng: random.Random) -> tuple[nesting.Nested, np.ndarray, np.ndarray]:
    events = []
    for _ in range(rng.randint(1, 60)):
        s = rng.randint(0, 1_000)
        events.append((s, s + rng.randint(1, 400)))
    start = np.array([s for s, _ in events], np.int64)
    end = np.array([e for _, e in events], np.int64)
    rule = rng.choice(["contain", "split"])
    nested = nest(start, end, np.arange(len(events), dtype=np.int64), rule)
    spread = rng.choice([5, 50, 10**6])  # 10**6: keys too sparse for a table, sorted
    node = np.array([rng.randrange(spread) for _ in range(len(nested))], np.int64)
    return nested, node, _windows(rng, 0, 1_400)


def test_the_compiled_pass_is_the_numpy_one() -> None:
    core = xspace.compiled_core()
    assert core is not None and nesting._compiled_window_self is not None, (
        "exporter.profiles._treegraphs was not built"
    )
    rng = random.Random(33)
    zero_sums = 0
    for _ in range(600):
        nested, node, windows = _case(rng)
        compiled = window_self(nested, node, windows, core)
        twin = window_self(nested, node, windows)
        assert [c.tolist() for c in compiled] == [t.tolist() for t in twin], windows.tolist()
        zero_sums += int((twin[2] == 0).sum())
    assert zero_sums > 0  # a key whose overlaps cancel (or an empty window) stays


def test_bad_arrays_are_one_error() -> None:
    compiled = nesting._compiled_window_self
    assert compiled is not None
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="different lengths"):
        compiled(one, one, one, np.zeros(2, np.int64), one, one)
    with pytest.raises(ValueError, match="out of range"):
        compiled(one, one + 5, np.array([3], np.int64), one, one, one + 9)
    with pytest.raises(ValueError, match="out of range"):
        compiled(one, one + 5, -one - 1, -one - 1, one, one + 9)
    with pytest.raises(ValueError, match="too large"):
        two = np.array([0, 10], np.int64)  # node * 2 windows past int64
        compiled(one, one + 5, -one - 1, one + (1 << 62), two, two + 5)
    with pytest.raises(ValueError, match="int64"):
        compiled(*[np.zeros(1, np.int32)] * 6)
