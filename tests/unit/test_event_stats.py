"""Events with their stats as columns: the compiled core (``_xwire.scan_line`` with stat
ids, read in windows) and the pure-Python twin (protobuf) give the same columns, and
the GPU facts and device graph built from them are the same either way.

Inputs: synthetic GPU captures (CUPTI-shaped stream lines, launch calls), hand-encoded
stats protobuf's writer never makes (a value oneof set twice, a stat without a value or
without an id, doubles, bytes, uint64 past int64, refs to nothing, strings instead of
refs, a known field of another wire type), lines with bytes changed at random, and a
line of distinct strings read through small windows (memory follows the window).
"""

from __future__ import annotations

import random
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest

from exporter.analysis.facts.gpu_kernels import gpu_kernel_facts, read_kernels
from exporter.errors import InputError
from exporter.profiles import xspace
from exporter.profiles.event_stats import StatEvents, StatTexts, int_column, read_stat_events
from exporter.profiles.pprof import to_pprof
from exporter.profiles.xplane import device_flamegraph
from exporter.profiles.xspace import parse_xspace, use_decoder
from exporter.proto import xplane_pb2
from exporter.testing.synthetic_gpu import gpu_capture
from tests.riegeli_writer import varint
from tests.xspace_builder import PlaneBuilder

DETAILS = "regs:32 static_shared:0 dynamic_shared:1024 grid:128,1,1 block:256,1,1 occ_pct:50.0"


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(payload, int)
        return tag + varint(payload & (1 << 64) - 1)
    if wire == 1:
        assert isinstance(payload, bytes)
        return tag + payload
    assert isinstance(payload, bytes)
    return tag + varint(len(payload)) + payload


def _capture_of_lines(lines: list[bytes]) -> xspace.Capture:
    """A capture of one GPU plane holding ``lines`` as they are (no metadata)."""
    plane = _field(2, 2, b"/device:GPU:0") + b"".join(_field(3, 2, x) for x in lines)
    return parse_xspace(_field(1, 2, plane), "lines")


def _events(pieces: Iterator[StatEvents]) -> list[Any]:
    """Every event with its columns, strings resolved (pieces index their own)."""
    out = []
    for piece in pieces:
        for i in range(len(piece.ids)):
            stats = tuple(
                (int(k), piece.strings[int(v)] if k == 5 else int(v))
                for k, v in zip(piece.kinds[:, i], piece.values[:, i], strict=True)
            )
            out.append((int(piece.ids[i]), int(piece.offsets[i]), int(piece.durations[i]), stats))
    return out


def _read(capture: xspace.Capture, decoder: str, columns: dict[int, int], width: int,
          window: int | None = None) -> Any:  # fmt: skip
    """Every line's events and columns through ``decoder`` (refusals as outcomes)."""
    out = []
    with use_decoder(decoder), mock.patch.object(xspace, "LINE_WINDOW", window or (1 << 24)):
        for ref in capture.planes:
            plane = capture.plane(ref)
            for index in range(len(plane.lines)):
                try:
                    out.append(read_stat_events(capture, plane, index, columns, width, _events))
                except InputError as exc:
                    out.append(("refused", str(exc)))
    return out


def _all_stats(space: xplane_pb2.XSpace, width: int) -> dict[int, int]:
    """Every stat id of the space's planes, several to a column."""
    ids = {m.id for p in space.planes for m in p.stat_metadata.values()} | {0}
    return {i: i % width for i in ids}


@pytest.mark.parametrize("window", [None, 256, 4096])
def test_gpu_capture_columns_are_the_twins(window: int | None) -> None:
    space = gpu_capture(steps=3, kernels_per_step=40, devices=2).space
    capture = parse_xspace(space.SerializeToString(), "gpu")
    columns = _all_stats(space, 3)
    compiled = _read(capture, "compiled", columns, 3, window)
    python = _read(capture, "python", columns, 3)
    assert compiled == python
    kinds = {k for line in python for event in line for k, _ in event[3]}
    assert kinds == {0, 4, 7}  # int64 and ref stats met, and events without some
    assert sum(len(line) for line in python) > 400


def _stat(*fields: bytes) -> bytes:
    return _field(4, 2, b"".join(fields))  # an XEvent's stats field


def _odd_line() -> bytes:
    """One event per odd stat encoding; stat ids 1-3 are the wanted ones."""
    double = struct.pack("<d", -2.5)
    events = [
        # the value oneof set twice in one stat: protobuf keeps the last member
        [_stat(_field(1, 0, 1), _field(5, 2, b"text"), _field(4, 0, -7))],
        # two stats of one id: the last wins; then another id of the same column
        [
            _stat(_field(1, 0, 1), _field(7, 0, 2)),
            _stat(_field(1, 0, 1), _field(3, 0, 5)),
            _stat(_field(1, 0, 3), _field(5, 2, "é".encode())),
        ],
        # no value; a double; bytes; no metadata id at all (id 0, not wanted)
        [
            _stat(_field(1, 0, 2)),
            _stat(_field(1, 0, 1), _field(2, 1, double)),
            _stat(_field(1, 0, 3), _field(6, 2, b"\xff\x00")),
            _stat(_field(4, 0, 9)),
        ],
        # uint64 past int64, a ref to nothing, the id after the value, unknown fields
        [
            _stat(_field(3, 0, (1 << 64) - 3), _field(1, 0, 1)),
            _stat(_field(1, 0, 2), _field(7, 0, 999)),
            _stat(_field(1, 0, 3), _field(9, 0, 1), _field(5, 2, b"x")),
        ],
        [],  # no stats
        [_stat(_field(1, 0, 2), _field(5, 2, b"text"))],  # the same string again
    ]
    body = b""
    for i, stats in enumerate(events):
        event = _field(1, 0, 10 + i) + _field(2, 0, 1000 * i) + _field(3, 0, 500) + b"".join(stats)
        body += _field(4, 2, event)
    return _field(1, 0, 7) + _field(2, 2, b"Stream #7(Compute)") + body


def test_odd_stat_encodings_read_as_protobuf_reads_them() -> None:
    capture = _capture_of_lines([_odd_line()])
    columns = {1: 0, 2: 1, 3: 1}  # ids 2 and 3 share a column: the later stat wins
    compiled = _read(capture, "compiled", columns, 2)
    assert compiled == _read(capture, "python", columns, 2)
    (events,) = compiled
    stats = [e[3] for e in events]
    bits = struct.unpack("<q", struct.pack("<d", -2.5))[0]
    assert stats[0] == ((4, -7), (0, 0))
    assert stats[1] == ((3, 5), (5, "é"))
    assert stats[2] == ((2, bits), (6, 0))  # id 2 without a value, then id 3's bytes
    assert stats[3] == ((3, -3), (5, "x"))  # uint64 as its int64 bits; unknown field skipped
    assert stats[4] == ((0, 0), (0, 0)) and stats[5] == ((0, 0), (5, "text"))
    # As XProf reads them: text codes (a ref to nothing and non-strings are "") and ints.
    piece = read_stat_events(capture, capture.plane(capture.planes[0]), 0, columns, 2, list)[0]
    texts = StatTexts({2: "kernel_a"})
    assert [texts.texts[c] if c >= 0 else None for c in texts.column(piece, 1)] == [
        None, "é", "", "x", None, "text",
    ]  # fmt: skip
    assert int_column(piece, 0).tolist() == [-7, 5, -1, -1, -1, -1]  # past int64: no id


def test_a_known_stat_field_of_another_wire_type_goes_to_protobuf() -> None:
    from exporter.profiles import _xwire  # type: ignore[attr-defined]

    event = _field(1, 0, 3) + _field(3, 0, 10) + _stat(_field(1, 0, 1), _field(4, 2, b"ab"))
    line = _field(4, 2, event)
    ids, slots = np.array([1], np.int64).tobytes(), np.array([0], np.int64).tobytes()
    assert _xwire.scan_line(line, True, True) is not None  # framing alone: fine
    assert _xwire.scan_line(line, True, True, ids, slots, 1) is None  # the core refuses
    capture = _capture_of_lines([line])
    assert _read(capture, "compiled", {1: 0}, 1) == _read(capture, "python", {1: 0}, 1)


def test_stat_requests_out_of_range_are_refused() -> None:
    from exporter.profiles import _xwire  # type: ignore[attr-defined]

    ids = np.array([3, 1], np.int64).tobytes()
    slots = np.array([0, 0], np.int64).tobytes()
    with pytest.raises(ValueError, match="ascend"):
        _xwire.scan_line(b"", True, True, ids, slots, 1)
    with pytest.raises(ValueError, match="width"):
        _xwire.scan_line(b"", True, True, ids[:8], slots[:8], 0)
    capture = _capture_of_lines([b""])
    with pytest.raises(ValueError, match="below width"):
        read_stat_events(capture, capture.plane(capture.planes[0]), 0, {1: 2}, 2, list)


def test_lines_with_bytes_changed_read_alike() -> None:
    """Either both readers give the same columns or both refuse the line."""
    from exporter.profiles import _xwire  # type: ignore[attr-defined]

    space = gpu_capture(steps=1, kernels_per_step=12).space
    lines = [x.SerializeToString() for p in space.planes for x in p.lines if x.events]
    lines.append(_odd_line())
    columns = {i: i % 2 for i in range(8)}
    rng = random.Random(5)
    accepted = 0
    for _ in range(400):
        data = bytearray(rng.choice(lines))
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        capture = _capture_of_lines([bytes(data)])
        compiled = _read(capture, "compiled", columns, 2)
        assert compiled == _read(capture, "python", columns, 2), bytes(data).hex()
        ids = np.array(sorted(columns), np.int64).tobytes()
        slots = np.array([columns[i] for i in sorted(columns)], np.int64).tobytes()
        accepted += _xwire.scan_line(bytes(data), True, True, ids, slots, 2) is not None
    assert accepted > 40  # many changes leave lines the core reads itself


# -- what is built from the columns ---------------------------------------------------
def _hostile_gpu_space() -> xplane_pb2.XSpace:
    """Kernels whose stats are strings (not refs), on the metadata, missing, or odd."""
    space = gpu_capture(steps=2, kernels_per_step=30, devices=2).space
    gpu = PlaneBuilder(space, "/device:GPU:7")
    stream = gpu.line("Stream #3(Compute)")
    ids = {n: gpu.stat_id(n) for n in ("kernel_details", "hlo_op", "hlo_module",
                                       "correlation_id", "memcpy_details", "tf_op")}  # fmt: skip
    on_meta = gpu.meta("meta_kernel", kernel_details=DETAILS, hlo_op="dot.3")
    for i in range(6):
        event = stream.events.add(metadata_id=on_meta, offset_ps=i * 10_000_000,
                                  duration_ps=1_000_000 + i * 1001)  # fmt: skip
        if i % 2:  # the event's own op wins over its metadata's
            event.stats.add(metadata_id=ids["hlo_op"], str_value=f"own.{i}")
        event.stats.add(metadata_id=ids["correlation_id"], uint64_value=(1 << 63) + i)
    for i, stats in enumerate([
        {"kernel_details": DETAILS, "hlo_module": "jit_f(1)", "tf_op": "jit(f)/a/b"},
        {"kernel_details": DETAILS, "memcpy_details": "size:8"},  # details: a kernel
        {"hlo_op": "no_details.1"},  # the plane has kernel_details: not a kernel
        {"kernel_details": ""},  # empty details: not a kernel
    ]):  # fmt: skip
        event = stream.events.add(metadata_id=gpu.meta(f"k{i}"), offset_ps=(100 + i) * 10**6,
                                  duration_ps=2_000_000)  # fmt: skip
        for name, value in stats.items():
            event.stats.add(metadata_id=ids[name], str_value=value)
    stream.events.add(metadata_id=gpu.meta("instant"), offset_ps=5, duration_ps=0)
    stream.events.add(metadata_id=9999, offset_ps=7 * 10**8, duration_ps=3_000_000)
    return space


def _gpu_outputs(data: bytes) -> tuple[Any, Any]:
    facts = gpu_kernel_facts([read_kernels(parse_xspace(data, "gpu"))], "gpu", top=1000)
    graph = device_flamegraph(parse_xspace(data, "gpu"))
    assert graph is not None
    return facts, to_pprof(graph).SerializeToString(deterministic=True)


@pytest.mark.parametrize("hostile", [False, True])
def test_gpu_facts_and_graph_are_the_same_through_either_reader(hostile: bool) -> None:
    space = _hostile_gpu_space() if hostile else gpu_capture(steps=3, devices=2).space
    data = space.SerializeToString()
    with use_decoder("python"):
        expected = _gpu_outputs(data)
    with use_decoder("compiled"):
        assert _gpu_outputs(data) == expected
    with use_decoder("compiled"), mock.patch.object(xspace, "LINE_WINDOW", 300):
        assert _gpu_outputs(data) == expected  # lines read in many windows
    facts = expected[0]
    assert facts["available"] and facts["launch_overhead"]["available"]
    if hostile:
        rows = {(k["name"], k["hlo_op"]) for k in facts["kernels"]}
        assert {("meta_kernel", "dot.3"), ("meta_kernel", "own.1"), ("k0", None)} <= rows
        assert ("k1", None) in rows and not {n for n, _ in rows} & {"k2", "k3", "instant"}
        assert ("<kernel 9999>", None) not in rows  # no kernel_details: not a kernel


def test_gpu_stream_lines_are_not_parsed_by_protobuf_in_the_compiled_pass() -> None:
    """Before the stats were columns, every stream and launch line went through
    protobuf (about 6 us of Python a kernel)."""
    data = gpu_capture(steps=2, kernels_per_step=20).space.SerializeToString()
    real = xspace.read_line

    def refuse(capture: xspace.Capture, plane: Any, index: int) -> Any:
        if plane.name.startswith(("/device:GPU", "/host:CUPTI")):
            raise AssertionError(f"{plane.name} line {index} parsed by protobuf")
        return real(capture, plane, index)

    with use_decoder("compiled"), mock.patch.object(xspace, "read_line", refuse):
        facts, graph = _gpu_outputs(data)
    assert facts["kernel_count"] == 40 and facts["launch_overhead"]["available"] and graph


def test_a_line_of_distinct_strings_reads_in_memory_of_its_window() -> None:
    """Hostile: 60,000 kernels each with its own op string (a string table as big as
    the line). Through windows of 64 KiB the read holds a window's columns, not the
    line's."""
    line = xplane_pb2.XLine(id=1, name="Stream #1(Compute)")
    for i in range(60_000):
        event = line.events.add(metadata_id=1, offset_ps=i * 1000, duration_ps=500)
        event.stats.add(metadata_id=1, str_value=f"op_{i:08d}_" + "x" * 40)
    data = line.SerializeToString()
    capture = _capture_of_lines([data])
    plane = capture.plane(capture.planes[0])

    def count(pieces: Iterator[StatEvents]) -> int:
        return sum(len(p.strings) for p in pieces)

    with use_decoder("compiled"), mock.patch.object(xspace, "LINE_WINDOW", 1 << 16):
        tracemalloc.start()
        try:
            distinct = read_stat_events(capture, plane, 0, {1: 0}, 1, count)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert distinct == 60_000
    assert len(data) > 4_000_000 and peak < len(data) // 8, (peak, len(data))


def test_ref_texts_read_alike_by_table_and_by_search() -> None:
    """Small stat ids resolve through a table, others (hostile: huge or negative ids)
    through a search; a ref to an id that names nothing is the empty text either way."""
    refs = np.array([1, 2, 3, 0, 7, -5, 1 << 40, 2], np.int64)
    piece = StatEvents(refs, refs, refs, np.full((1, 8), 7, np.int8), refs.reshape(1, 8), [])
    small = StatTexts({1: "a", 2: "b", 3: "c"})
    huge = StatTexts({1: "a", 2: "b", 3: "c", 1 << 41: "far", -9: "neg"})
    assert small._table is not None and huge._table is None
    expected = ["a", "b", "c", "", "", "", "", "b"]
    for texts in (small, huge):
        assert [texts.texts[c] for c in texts.column(piece, 0)] == expected


def test_launch_calls_out_of_correlation_order_link_alike() -> None:
    space = gpu_capture(steps=2, kernels_per_step=30, devices=2, gemm_every=0).space
    expected = _gpu_outputs(space.SerializeToString())[0]
    cupti = next(p for p in space.planes if p.name == "/host:CUPTI")
    lines = list(cupti.lines)[::-1]  # the second GPU's calls (higher ids) first
    del cupti.lines[:]
    cupti.lines.extend(lines)
    assert _gpu_outputs(space.SerializeToString())[0] == expected
    assert expected["launch_overhead"]["correlated_kernels"] == 120
