"""The kernel facts' per-row reductions and launch-call lookup: the linear-time paths
(bincount sums, a table of correlation ids) give what the sort and the binary search
give, on random rows and values, values near int64's edges, and correlation ids that
are sparse, negative, repeated or missing."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.facts import gpu_kernels
from exporter.analysis.facts.gpu_kernels import _per_row, _per_row_sorted


@pytest.mark.parametrize("seed", range(6))
def test_per_row_sums_equal_the_sorted_reduction(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    rows = rng.integers(0, int(rng.integers(1, 300)), n)
    scale = [10**6, 1 << 40, 1 << 52, 1 << 62][seed % 4]  # the last two: sorted path
    values = rng.integers(-scale // 4, scale, n)
    assert list(_per_row(rows, values)) == list(_per_row_sorted(rows, values))


def test_per_row_is_exact_where_float64_sums_are_not() -> None:
    rows = np.zeros(3, np.int64)
    values = np.asarray([(1 << 53) + 1, 1, 1], np.int64)
    assert list(_per_row(rows, values)) == [(0, 3, (1 << 53) + 3, 1, (1 << 53) + 1)]


@pytest.mark.parametrize(
    "ids",
    [
        np.arange(1, 2000),  # CUPTI's
        np.arange(1, 2000)[::-1].copy(),
        np.asarray([5, 9, 9, 12]),  # repeated: the search
        np.asarray([-3, 0, 4]),  # negative: the search
        np.asarray([10**12, 10**12 + 5]),  # sparse: the search
    ],
)
def test_a_kernels_call_is_found_alike_by_table_and_by_search(ids: np.ndarray) -> None:
    ids = ids.astype(np.int64)
    calls = gpu_kernels._Calls.of(ids, np.arange(len(ids), dtype=np.int64) * 7)
    corrs = np.concatenate([ids, ids[::3] + 1, [-1, -5, 0, 10**15, int(ids.max()) + 1]])
    corrs = corrs.astype(np.int64)
    pos, hit = calls.find(corrs)
    assert (calls.table is not None) == (len(ids) > 100)  # the table where dense
    sorted_ids = calls.ids
    want_pos = np.minimum(np.searchsorted(sorted_ids, corrs), len(sorted_ids) - 1)
    want_hit = (sorted_ids[want_pos] == corrs) & (corrs >= 0)
    assert (hit == want_hit).all()
    assert (calls.starts[pos][hit] == calls.starts[want_pos][want_hit]).all()


def test_stat_texts_read_alike_by_table_and_by_search_with_every_kind() -> None:
    """The table path gathers every event at once (non-refs and refs to nothing at
    index 0): a stat metadata entry with id 0 must still read as no text."""
    from exporter.profiles.event_stats import (
        KIND_DOUBLE,
        KIND_NONE,
        KIND_REF,
        KIND_STR,
        StatEvents,
        StatTexts,
    )

    kinds = np.array([KIND_REF, KIND_REF, KIND_REF, KIND_REF, KIND_NONE, KIND_STR, KIND_DOUBLE,
                      KIND_REF, KIND_REF], np.int8)  # fmt: skip
    values = np.array([0, 1, 3, 99, 2, 0, 3, -4, 1 << 50], np.int64)
    piece = StatEvents(values, values, values, kinds.reshape(1, -1), values.reshape(1, -1),
                       ["own"])  # fmt: skip
    names = {0: "zero", 1: "a", 3: "c"}
    table = StatTexts(names)
    search = StatTexts(names | {1 << 45: "far"})
    assert table._table is not None and search._table is None
    for texts in (table, search):
        codes = texts.column(piece, 0)
        assert [texts.texts[c] if c >= 0 else None for c in codes] == [
            "", "a", "c", "", None, "own", "", "", ""]  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_first_seen_compiled_equals_its_numpy_twin(seed: int) -> None:
    """The hash table of ``_xwire.first_seen`` against the dense indexes and sorts of
    the numpy twin: few distinct rows, every row distinct (the table grows many times),
    values at int64's edges, widths 1 to 6."""
    from exporter.profiles import xspace
    from exporter.profiles.event_stats import first_seen, first_seen_numpy

    core = xspace.compiled_core()
    assert core is not None, "exporter.profiles._xwire was not built"
    rng = np.random.default_rng(seed)
    n = [0, 1, 7, 5000, 40_000, 3000, 20_000, 100][seed]
    width = 1 + seed % 6
    distinct = [1, 1, 3, 50, 40_000, 3000, 7, 100][seed]
    edges = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0], np.int64)
    pool = rng.integers(-(1 << 62), 1 << 62, (max(distinct, 1), width))
    pool[: min(len(pool), 4), 0] = edges[: min(len(pool), 4)]
    table = pool[rng.integers(0, len(pool), n)] if n else np.zeros((0, width), np.int64)
    columns = [np.ascontiguousarray(table[:, c]) for c in range(width)]
    if n:
        key, first = first_seen(columns)
    else:
        key, first = first_seen_numpy(columns)  # no rows: the twin answers
    want_key, want_first = first_seen_numpy(columns)
    assert key.tolist() == want_key.tolist() and first.tolist() == want_first.tolist()


def test_first_seen_refuses_columns_that_are_not_a_table() -> None:
    from exporter.profiles import xspace

    core = xspace.compiled_core()
    assert core is not None, "exporter.profiles._xwire was not built"
    for bad in [(np.zeros(3, np.int64), np.zeros(4, np.int64)), (), (b"1234567",),
                (np.zeros(1, np.int64),) * 65]:  # fmt: skip
        with pytest.raises(ValueError):
            core.first_seen(bad)
    with pytest.raises(TypeError):
        core.first_seen([np.zeros(2, np.int64)])  # a tuple, not a list
    with pytest.raises(ValueError, match="contiguous"):
        core.first_seen((np.zeros((4, 2), np.int64)[:, 0],))  # a strided view


@pytest.mark.parametrize("seed", range(5))
def test_a_streams_union_from_its_reach_equals_the_sorting_union(seed: int) -> None:
    from exporter.analysis.facts.gpu_kernels import _sorted_union
    from exporter.analysis.facts.intervals import union

    rng = np.random.default_rng(seed)
    n = [1, 2, 50, 3000, 20_000][seed]
    start = np.sort(rng.integers(0, n * 10, n))  # ties, nesting, overlaps, gaps
    end = start + rng.integers(0, [1, 5, 40, 200, 30][seed], n)  # zero length too
    got = _sorted_union(start, np.maximum.accumulate(end))
    want = union(start, end)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
