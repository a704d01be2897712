"""The kernel facts' compiled per-kernel passes (``_kernel_streams.c``) give what their
numpy twins give: a stream's per-row sums, busy intervals, gaps and launch waits, and a
host piece's launch calls, on generated columns, fuzzed ones and hostile values (times
near int64's edges that wrap, kernels out of order, correlation ids negative, repeated,
sparse or past int64, empty and one-kernel streams); and whole captures read alike
through either decoder when fuzzed (shuffled streams, repeated and odd stats, empty
lines)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from exporter.analysis.facts import gpu_kernels
from exporter.analysis.facts.gpu_kernels import (
    _Calls,
    _launch_piece,
    _launch_piece_numpy,
    _per_row,
    _per_row_sorted,
    _stream_numpy,
    _stream_pass,
    gpu_kernel_facts,
    read_kernels,
)
from exporter.profiles.event_stats import (
    KIND_DOUBLE,
    KIND_EMPTY,
    KIND_INT64,
    KIND_NONE,
    KIND_REF,
    KIND_STR,
    KIND_UINT64,
    StatEvents,
)
from exporter.profiles.nesting import FAR
from exporter.profiles.xspace import parse_xspace, use_decoder
from exporter.proto import xplane_pb2
from exporter.testing.synthetic_gpu import gpu_capture

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)


def test_the_compiled_passes_are_built_and_used() -> None:
    assert gpu_kernels._kernel_streams is not None, "facts._kernel_streams was not built"
    with use_decoder("compiled"):
        assert gpu_kernels._passes() is not None
    with use_decoder("python"):
        assert gpu_kernels._passes() is None


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    for field, x, y in zip(a._fields, a, b, strict=True):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype == np.int64, field
            assert x.tolist() == y.tolist(), field
        else:
            assert x == y, field


def _both(rows: np.ndarray, offs: np.ndarray, durs: np.ndarray, corrs: np.ndarray,
          base_ns: int, row_count: int, calls: _Calls, cuts: int = 0) -> Any:  # fmt: skip
    """The twin on the whole stream, the compiled pass on it and in pieces cut at
    ``cuts`` random places (some empty)."""
    columns = tuple(np.asarray(c, np.int64) for c in (rows, offs, durs, corrs))
    want = _stream_numpy([columns], base_ns, row_count, calls)
    at = sorted(random.Random(cuts).choices(range(len(rows) + 1), k=cuts))
    pieces = [tuple(c[lo:hi] for c in columns) for lo, hi in zip([0, *at], [*at, len(rows)],
                                                                   strict=True)]  # fmt: skip
    with use_decoder("compiled"):
        _same(_stream_pass([columns], base_ns, row_count, calls), want)
        _same(_stream_pass(pieces, base_ns, row_count, calls), want)
    _same(_stream_numpy(pieces, base_ns, row_count, calls), want)
    return want


def _calls(rng: np.random.Generator, n: int, shape: str) -> _Calls:
    if shape == "none":
        ids = np.zeros(0, np.int64)
    elif shape == "dense":  # CUPTI's: the table
        ids = np.arange(1, n + 1, dtype=np.int64)
    elif shape == "repeated":
        ids = rng.integers(0, max(n // 2, 1), n)
    elif shape == "negative":
        ids = rng.integers(-n, n, n)
    else:  # sparse: the search
        ids = rng.integers(0, 1 << 62, n)
    starts = rng.integers(-(10**6), 10**7, len(ids))
    return _Calls.of(ids.astype(np.int64), starts.astype(np.int64))


@pytest.mark.parametrize("shape", ["dense", "repeated", "negative", "sparse", "none"])
@pytest.mark.parametrize("seed", range(4))
def test_a_stream_pass_equals_its_numpy_twin(shape: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    row_count = int(rng.integers(1, 50))
    rows = rng.integers(0, row_count, n)
    # Kernels in order with gaps and overlaps, as a stream gives them (ps, with
    # remainders that floor toward -inf where negative).
    offs = np.cumsum(rng.integers(-2_000, 9_000_000, n)) - 10**6 + rng.integers(-999, 999, n)
    if seed % 2:  # out of order: sorted first, alike
        offs = rng.permutation(offs)
    durs = rng.integers(1, 5_000_000, n)
    calls = _calls(rng, n, shape)
    corrs = np.where(rng.random(n) < 0.8, np.arange(1, n + 1), rng.integers(-5, 2 * n + 5, n))
    found = _both(rows, offs, durs, corrs, 1_700_000_000_000_000_000, row_count, calls, seed)
    assert sum(count for _, count, *_ in found.rows) == n
    if shape == "dense":
        assert found.correlated and len(found.wait_from)


@pytest.mark.parametrize("seed", range(30))
def test_a_stream_pass_equals_its_twin_on_hostile_columns(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 40))
    edges = np.asarray([INT64_MIN, INT64_MIN + 1, -FAR, -1, 0, 1, 999, 1000, FAR - 1, FAR,
                        INT64_MAX - 1, INT64_MAX], np.int64)  # fmt: skip

    def column() -> np.ndarray:
        mixed = np.where(rng.random(n) < 0.5, rng.choice(edges, n), rng.integers(-5000, 5000, n))
        return mixed.astype(np.int64)

    row_count = int(rng.integers(1, 4))
    rows = rng.integers(0, row_count, n)
    base_ns = int(rng.choice([0, -(10**18), INT64_MAX - 10, INT64_MIN + 10, 1 << 62]))
    ids = column() if seed % 3 else np.arange(n, dtype=np.int64)
    calls = _Calls.of(ids, column())
    corrs = np.where(rng.random(n) < 0.5, rng.integers(0, n + 1, n), column())
    _both(rows, column(), column(), corrs, base_ns, row_count, calls, seed % 4)


def test_a_stream_of_one_kernel_has_no_gap_and_an_empty_one_nothing() -> None:
    calls = _Calls.of(np.asarray([3], np.int64), np.asarray([5], np.int64))
    one = _both(np.asarray([0]), np.asarray([7_000]), np.asarray([2_500]), np.asarray([3]),
                0, 1, calls)  # fmt: skip
    assert one.rows == [(0, 1, 2, 2, 2)] and one.latencies == [(0, 1, 2, 2)]
    assert (one.first_ns, one.last_ns, one.correlated) == (7, 9, 1)
    assert one.busy_starts.tolist() == [7] and not len(one.gaps)
    empty = np.zeros(0, np.int64)
    none = _both(empty, empty, empty, empty, 0, 0, calls)
    assert none.rows == [] and not len(none.busy_starts)


def test_a_row_past_the_rows_is_refused_by_both() -> None:
    args = (np.asarray([0, 3]), np.asarray([0, 10]), np.asarray([5, 5]), np.asarray([-1, -1]))
    calls = _Calls.of(np.zeros(0, np.int64), np.zeros(0, np.int64))
    columns = [tuple(np.asarray(c, np.int64) for c in args)]
    with pytest.raises(ValueError, match="row"):
        _stream_numpy(columns, 0, 2, calls)
    with use_decoder("compiled"), pytest.raises(ValueError, match="row"):
        _stream_pass(columns, 0, 2, calls)


def test_a_piece_of_unequal_columns_is_refused() -> None:
    calls = _Calls.of(np.zeros(0, np.int64), np.zeros(0, np.int64))
    one, two = np.zeros(1, np.int64), np.zeros(2, np.int64)
    with use_decoder("compiled"), pytest.raises(ValueError, match="unequal"):
        _stream_pass([(one, one, two, one)], 0, 1, calls)


def test_per_row_sums_past_int64_are_exact() -> None:
    """The sort's sums wrapped in int64 before (the compiled pass's never did)."""
    rows = np.zeros(4, np.int64)
    values = np.full(4, INT64_MAX, np.int64)
    assert list(_per_row_sorted(rows, values)) == [(0, 4, 4 * INT64_MAX, INT64_MAX, INT64_MAX)]
    values = np.asarray([INT64_MIN, INT64_MIN, 5], np.int64)
    assert list(_per_row(rows[:3], values)) == [(0, 3, 2 * INT64_MIN + 5, INT64_MIN, 5)]


def _piece(rng: np.random.Generator, n: int, metas: list[int]) -> StatEvents:
    kinds = rng.choice([KIND_NONE, KIND_EMPTY, KIND_DOUBLE, KIND_UINT64, KIND_INT64, KIND_STR,
                        KIND_REF], n, p=[0.05, 0.05, 0.05, 0.1, 0.55, 0.15, 0.05])  # fmt: skip
    strings = ["12", "0", "-4", "x7", "", "9" * 30, str(INT64_MAX), str(INT64_MAX + 1), "٣"]
    values = rng.integers(-50, 1000, n)
    values = np.where(rng.random(n) < 0.1, INT64_MIN + rng.integers(0, 5, n), values)  # past int64
    values = np.where(kinds == KIND_STR, rng.integers(0, len(strings), n), values)
    edges = np.asarray([-FAR - 1, -FAR, -1, 0, 1, 1999, FAR, FAR + 1], np.int64)
    offs = np.where(rng.random(n) < 0.2, rng.choice(edges, n), rng.integers(-5000, 10**9, n))
    durs = np.where(rng.random(n) < 0.2, rng.choice(edges, n), rng.integers(0, 10**6, n))
    return StatEvents(rng.choice(metas, n).astype(np.int64), offs.astype(np.int64),
                      durs.astype(np.int64), kinds.astype(np.int8).reshape(1, n),
                      values.astype(np.int64).reshape(1, n), strings)  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_a_launch_piece_equals_its_numpy_twin(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 2000))
    piece = _piece(rng, n, [1, 2, 3, 7, 1 << 40])
    calls = np.asarray(sorted({2, 7, 1 << 40} if seed % 2 else {3}), np.int64)
    base_ns = int(rng.choice([0, 1_700_000_000_000_000_000, INT64_MAX - 5, -(1 << 62)]))
    want = _launch_piece_numpy(piece, calls, base_ns)
    with use_decoder("compiled"):
        found = _launch_piece(piece, calls, base_ns)
    for a, b in zip(found, want, strict=True):
        assert a.dtype == b.dtype == np.int64
        assert a.tolist() == b.tolist()
    if n > 100:
        assert len(want[0]) and (want[0] >= 0).all()


def _fuzzed(seed: int) -> bytes:
    """A synthetic GPU capture, changed at random: kernels shuffled, correlation ids
    repeated, past int64, as strings or doubles, stats repeated, lines emptied."""
    rng = random.Random(seed)
    space = gpu_capture(steps=3, kernels_per_step=40, devices=2).space
    for plane in space.planes:
        names = {m.id: m.name for m in plane.stat_metadata.values()}
        corr = next((i for i, name in names.items() if name == "correlation_id"), None)
        for line in plane.lines:
            events = list(line.events)
            if rng.random() < 0.15:
                del line.events[:]  # an empty line
                continue
            if rng.random() < 0.4:
                rng.shuffle(events)
                del line.events[:]
                line.events.extend(events)
            for event in line.events:
                roll = rng.random()
                if corr is None or roll > 0.3:
                    continue
                stat = event.stats.add(metadata_id=corr)  # repeated: the last one counts
                if roll < 0.05:
                    stat.uint64_value = (1 << 64) - 1 - rng.randrange(3)  # past int64
                elif roll < 0.1:
                    stat.str_value = str(rng.randrange(-3, 400))
                elif roll < 0.15:
                    stat.double_value = 12.0
                elif roll < 0.2:
                    stat.int64_value = -rng.randrange(1, 5)
                else:
                    stat.int64_value = rng.randrange(0, 400)  # repeated ids
                if rng.random() < 0.1:
                    event.offset_ps = rng.choice([-(1 << 62), (1 << 62) + 5, -3_001])
    return space.SerializeToString()


def _facts(data: bytes) -> dict[str, Any]:
    return gpu_kernel_facts([read_kernels(parse_xspace(data, "fuzz"))], "gpu", top=1000)


@pytest.mark.parametrize("seed", range(8))
def test_fuzzed_captures_give_the_same_facts_through_either_decoder(seed: int) -> None:
    data = _fuzzed(seed)
    with use_decoder("python"):
        want = _facts(data)
    with use_decoder("compiled"):
        assert _facts(data) == want
    assert want["available"]


def test_an_empty_gpu_plane_reads_alike() -> None:
    space = xplane_pb2.XSpace()
    space.planes.add(id=1, name="/device:GPU:0").lines.add(id=1, name="Stream #1(Compute)")
    data = space.SerializeToString()
    with use_decoder("python"):
        want = _facts(data)
    with use_decoder("compiled"):
        assert _facts(data) == want
    assert want["available"] is False
