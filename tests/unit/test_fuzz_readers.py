"""Fuzz the XSpace and pprof readers with generated, hostile protobufs (issue 22).

Hypothesis builds XSpaces (planes, lines, events, stats, metadata) and pprof Profiles
with hostile values: negative and huge offsets, durations and indexes, missing metadata
ids, deep and staircase nesting, many lines, empty names, NUL bytes, bad UTF-8,
truncated or corrupted serialisations and random bytes. Each input goes through the
project's real readers (capture readers, flame-graph conversion, step windows, XLA host
events; pprof decoding, folding and the memory-profile reader) and must either convert
to a well-formed graph (totals non-negative, ``total == self + children``, within what
the input can hold) or fail with the project's own errors: :class:`InputError`, or a
ValueError the project raises itself (never IndexError, OverflowError, DecodeError, a
numpy error...). Per input, memory is bounded with ``tracemalloc`` (64 MiB + 2000x the
input's bytes) and work is counted structurally (events read, segments nested, frames
made), never by the clock: ``deadline=None``, ``derandomize=True`` for CI.
"""

from __future__ import annotations

import gzip
import itertools
import math
import random
import struct
import traceback
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.analysis.sides import xla_host
from exporter.errors import InputError
from exporter.profiles import nesting, xplane
from exporter.profiles.convert import flamegraph_from_capture
from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.memory import load_memory_profile
from exporter.profiles.pprof import decode_pprof, encode_pprof, from_pprof, graphs_from_pprof
from exporter.profiles.steps import step_windows, windowed_flamegraphs
from exporter.profiles.xplane import (
    device_flamegraph,
    host_flamegraph,
    load_capture,
    parse_xspace,
)
from exporter.proto import profile_pb2, xplane_pb2

T = TypeVar("T")

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MEMORY_FLOOR = 64 << 20
MEMORY_PER_BYTE = 2000
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
UINT64_MAX = (1 << 64) - 1

# A string field whose bytes are swapped for invalid UTF-8 after serialising (protobuf's
# Python API cannot set them): same length, so every length prefix stays right.
BAD_UTF8 = "\x01BADUTF8\x01"
BAD_UTF8_BYTES = b"\xc3\x28\xa0\xa1\xff\xfe\x80\xed\xa0"
assert len(BAD_UTF8.encode()) == len(BAD_UTF8_BYTES)


@st.composite
def serialised(draw: st.DrawFn, message: Any) -> bytes:
    """``message``'s bytes, its placeholders made bad UTF-8 in one input of five."""
    data: bytes = message.SerializeToString(deterministic=True)
    if draw(st.integers(0, 4)) == 0:
        data = data.replace(BAD_UTF8.encode(), BAD_UTF8_BYTES)
    return data


# -- hostile values -----------------------------------------------------------------
EDGE_INTS = [0, 1, -1, 2, 999, 1000, 1001, 10**12, 10**17, 10**18, 1 << 62, INT64_MAX,
             INT64_MIN, INT64_MIN + 1, INT64_MAX - 1]  # fmt: skip
U64_EDGES = [0, 1, INT64_MAX, UINT64_MAX]
TEXTS = ["", "a", "a\x00b", "\x00", BAD_UTF8, "x" * 300, "a/b//c/", "/", ";"]
EVENT_NAMES = ["XLA Ops", "train", "jit_step(123)", "jit_step(-9)", "$a.py:3 f", "$",
               "$<unknown> g", "$x.py:99999999999999999999 h", "xla::Foo::bar",
               "ThunkExecutor::Execute", "PjitFunction(update)", "fusion.1", "12", "-4",
               "while"]  # fmt: skip
LINE_NAMES = ["XLA Ops", "XLA Modules", "Steps", "python", "python3",
              "tf_XLAEigen/-2284334949033183961", "Framework Ops", "Stream #1", "/1"]  # fmt: skip
PLANE_NAMES = ["/host:CPU", "/host:CPU", "/device:TPU:0", "/device:GPU:1", "/host:CPU",
               "/device:TPU:0", "Task Environment", "/device:TPU:99999999999999999999",
               "Task Environment", "/device:TPU:0\x00", "/host:metadata"]  # fmt: skip
STAT_LIST = [
    "step_num",
    "group_id",
    "hlo_op",
    "hlo_module",
    "tf_op",
    "name_scope",
    "program_id",
    "hlo_category",
    "run_id",
    "profile_start_time",
    "profile_stop_time",
]


# -- generated XSpaces ---------------------------------------------------------------
# An XSpace is built from one seed Hypothesis draws, by the plain functions below (a
# random.Random): the same shapes and values as Hypothesis strategies would draw field
# by field, at a fraction of the cost. Drawn field by field, an XSpace took ~4,000 draws
# and 99 % of the test's time went to drawing (the readers took ~1 % of it). Values come
# from the tables above (EDGE_INTS, the name lists); a failure prints the XSpace.
Draw = Callable[[random.Random], Any]


# A wide range is drawn as Hypothesis draws one: a magnitude of 8, 16, 32, 64 or 128 bits
# (weighted 4, 8, 1, 1, 0.5), so mostly small values, sometimes anywhere in the range;
# uniform draws would be huge nearly always and make nearly every id or index invalid.
_BITS, _BIT_WEIGHTS = [8, 16, 32, 64, 128], [4.0, 8.0, 1.0, 1.0, 0.5]


def _ints(low: int, high: int) -> Draw:
    if high - low <= 1 << 16:
        return lambda r: r.randint(low, high)

    def wide(r: random.Random) -> int:
        value = r.getrandbits(r.choices(_BITS, _BIT_WEIGHTS)[0])
        value = -value if low < 0 and r.random() < 0.5 else value
        return value if low <= value <= high else r.randint(low, high)

    return wide


def _pick(values: list[Any]) -> Draw:
    return lambda r: r.choice(values)


def _any(*choices: Draw) -> Draw:
    return lambda r: r.choice(choices)(r)


def _text(r: random.Random) -> str:
    """Up to 6 code points, ASCII mostly, any plane sometimes (surrogates excluded)."""
    out = []
    for _ in range(r.randint(0, 6)):
        code = r.randint(0, 127) if r.random() < 0.6 else r.randint(0x80, 0x10FFFF)
        out.append(chr(code if not 0xD800 <= code <= 0xDFFF else 0xFFFD))
    return "".join(out)


def _float(r: random.Random) -> float:
    """NaN, infinities, signed zero, subnormals, huge values, or any 64-bit pattern."""
    if r.random() < 0.5:
        special = [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1.7976931348623157e308,
                   1e300, -1e300, 2.0**63, 7.0, 0.5, -1.5]  # fmt: skip
        return float(r.choice(special))
    value: float = struct.unpack("<d", r.getrandbits(64).to_bytes(8, "little"))[0]
    return value


_I64: Draw = _any(_ints(-3, 3000), _pick(EDGE_INTS), _ints(INT64_MIN, INT64_MAX))
_U64: Draw = _any(_ints(0, 3000), _pick(U64_EDGES), _ints(0, UINT64_MAX))
_SMALL_ID: Draw = _any(_ints(-2, 8), _pick([INT64_MAX, INT64_MIN, 1 << 40]))
_TEXT: Draw = _any(_pick(TEXTS), _text)
_EVENT_NAMES: Draw = _any(_pick(EVENT_NAMES), _TEXT)
_LINE_NAMES: Draw = _any(_pick(LINE_NAMES), _TEXT)
_PLANE_NAMES: Draw = _any(
    _pick(PLANE_NAMES), _pick(["/host:CPU", "/device:TPU:0", "Task Environment"]), _TEXT
)
_STAT_NAMES: Draw = _any(_pick(STAT_LIST), _TEXT)
_STAT_KINDS = ["none", "int", "int", "uint", "double", "str", "bytes", "ref", "ref"]


def _list(r: random.Random, item: Draw, max_size: int) -> list[Any]:
    return [item(r) for _ in range(r.randint(0, max_size))]


def _xstats(r: random.Random, ids: Draw, max_size: int = 3) -> list[Any]:
    out = []
    for _ in range(r.randint(0, max_size)):
        stat = xplane_pb2.XStat(metadata_id=ids(r))
        kind = r.choice(_STAT_KINDS)
        if kind == "int":
            stat.int64_value = _I64(r)
        elif kind == "uint":
            stat.uint64_value = _U64(r)
        elif kind == "double":
            stat.double_value = _float(r)
        elif kind == "str":
            stat.str_value = _any(_TEXT, _pick(["-5", "12", "9" * 30]))(r)
        elif kind == "bytes":
            stat.bytes_value = r.randbytes(r.randint(0, 6))
        elif kind == "ref":
            stat.ref_value = _any(ids, _U64)(r) % (UINT64_MAX + 1)
        out.append(stat)
    return out


def shaped_events(kind: str, n: int, step: int, width: int) -> list[tuple[int, int]]:
    """(offset, duration) ps of ``n`` events in a shape that stresses nesting."""
    if kind == "staircase":  # each starts inside the previous one and outlives it
        return [(i * step, width + step) for i in range(n)]
    if kind == "nested":  # a deep tower of properly nested events
        return [(i * step, max(1, width + 2 * step * (n - i))) for i in range(n)]
    if kind == "same":  # identical events
        return [(step, width)] * n
    if kind == "reverse":  # later starts end earlier, out of order in the file
        return [((n - i) * step, width * (i + 1)) for i in range(n)]
    return [(i * (width + step), width) for i in range(n)]  # flat


# Times mostly small (so events overlap), sometimes hostile.
_TIME: Draw = _any(_ints(-3, 3000), _ints(-3, 3000), _I64)


def _xline(r: random.Random, meta_ids: Draw, stat_ids: Draw) -> xplane_pb2.XLine:
    line = xplane_pb2.XLine(
        id=_I64(r),
        display_id=_SMALL_ID(r),
        name=_LINE_NAMES(r),
        display_name=_any(lambda _: "", _LINE_NAMES)(r),
        timestamp_ns=_any(lambda _: 0, lambda _: 10**18, _I64)(r),
        duration_ps=_I64(r),
    )
    if r.random() < 0.5:  # a shaped run of events
        kind = r.choice(["staircase", "nested", "same", "reverse", "flat"])
        n = r.randint(1, 100)
        step = r.choice([1, 7, 1000, 1 << 40])
        width = r.choice([1, 10, 5000, 1 << 50])
        base = r.choice([0, -(10**6), 1 << 61])
        meta = meta_ids(r)
        for offset, duration in shaped_events(kind, n, step, width):
            line.events.add(metadata_id=meta, offset_ps=base + offset, duration_ps=duration)
    for _ in range(r.randint(0, 12)):
        event = line.events.add(metadata_id=meta_ids(r), duration_ps=_TIME(r))
        if r.randint(0, 9) == 0:
            event.num_occurrences = _I64(r)
        else:
            event.offset_ps = _TIME(r)
        event.stats.extend(_xstats(r, stat_ids))
    return line


def _xplane(r: random.Random) -> xplane_pb2.XPlane:
    plane = xplane_pb2.XPlane(id=_I64(r), name=_PLANE_NAMES(r))
    # Metadata mostly coherent (ids 1..n, the stat names the readers look for), with
    # hostile entries beside: a key that is not the id, ids no metadata has.
    stat_names = _list(r, _STAT_NAMES, 7)
    for sid, name in enumerate(stat_names, 1):
        plane.stat_metadata[sid].id = sid
        plane.stat_metadata[sid].name = name
    for sid in _list(r, _SMALL_ID, 2):
        plane.stat_metadata[sid].id = _SMALL_ID(r)
        plane.stat_metadata[sid].name = _STAT_NAMES(r)
    stat_ids = _any(_ints(1, max(len(stat_names), 1)), _SMALL_ID)
    n_meta = r.randint(0, 6)
    for mid in range(1, n_meta + 1):
        meta = plane.event_metadata[mid]
        meta.id = mid
        meta.name = _EVENT_NAMES(r)
        meta.display_name = _any(lambda _: "", _EVENT_NAMES)(r)
        meta.stats.extend(_xstats(r, stat_ids))
        meta.child_id.extend(_list(r, _SMALL_ID, 2))
    for mid in _list(r, _SMALL_ID, 2):
        plane.event_metadata[mid].id = _SMALL_ID(r)
        plane.event_metadata[mid].name = _EVENT_NAMES(r)
    meta_ids = _any(_ints(1, max(n_meta, 1)), _SMALL_ID)
    plane.stats.extend(_xstats(r, stat_ids))
    lines = r.randint(0, 4)
    if r.randint(0, 7) == 0:
        lines = r.randint(20, 80)  # many lines (mostly tiny)
    for _ in range(lines):
        plane.lines.append(_xline(r, meta_ids, stat_ids))
    return plane


def _xspace(r: random.Random) -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    for _ in range(r.randint(0, 4)):
        space.planes.append(_xplane(r))
    space.hostnames.extend(_list(r, _TEXT, 2))
    space.errors.extend(_list(r, _TEXT, 1))
    return space


def xspaces() -> st.SearchStrategy[xplane_pb2.XSpace]:
    """Hostile XSpaces, each built from one seed (see above)."""
    return st.randoms(use_true_random=True).map(_xspace)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` as written, truncated, with bytes flipped, or with junk around it."""
    how = draw(st.sampled_from(["asis", "asis", "asis", "truncate", "flip", "append",
                                "prepend"]))  # fmt: skip
    if how == "asis" or not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(out)
    junk = draw(st.binary(min_size=1, max_size=12))
    return data + junk if how == "append" else junk + data


# -- what counts as "converted" and what as "refused" -------------------------------
def _refused(exc: BaseException) -> bool:
    """The project's own refusal: InputError, or a plain ValueError raised in exporter/."""
    if isinstance(exc, InputError):
        return True
    if type(exc) is not ValueError:
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "/exporter/" in frames[-1].filename.replace("\\", "/")


def _call(found: list[str], fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None when it refuses the input; anything else fails the test."""
    try:
        return fn(*args)
    except Exception as exc:
        if _refused(exc):
            found.append(f"{getattr(fn, '__name__', fn)}: {exc}")
            return None
        raise


def _frames(graph: FlameGraph) -> Iterator[Frame]:
    stack = [graph.root]
    while stack:
        frame = stack.pop()
        yield frame
        stack.extend(frame.children.values())


def _check_graph(graph: FlameGraph, max_frames: int, max_total: int | None = None) -> None:
    """Totals exact and non-negative, frames within ``max_frames``, pprof-encodable."""
    count = 0
    for frame in _frames(graph):
        count += 1
        assert isinstance(frame.self_value, int), frame
        assert frame.self_value >= 0, frame
        assert frame.total == frame.self_value + sum(c.total for c in frame.children.values())
        assert isinstance(frame.name, str)
    assert count <= max_frames, f"{count} frames from an input allowing {max_frames}"
    if max_total is not None:
        assert graph.root.total <= max_total, (graph.root.total, max_total)
    for part in (graph, *graph.companions):
        assert part.root.total >= 0
    encode_pprof(graph, level=1)  # what the sidecar pushes: must serialise


class _Counted:
    """Segments made by ``nest`` per call, against the split rule's own bound."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._nest = nesting.nest

    def __call__(
        self, start: np.ndarray, end: np.ndarray, label: np.ndarray, rule: Any, core: Any = None
    ) -> Any:
        out = self._nest(start, end, label, rule, core)
        per_event = (len(out) - 64) / max(len(start), 1)
        self.worst = max(self.worst, per_event)
        return out


def _bounded(data: bytes, body: Callable[[], None]) -> None:
    """Run ``body`` under tracemalloc: peak within 64 MiB + 2000x the input's bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        body()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bound = MEMORY_FLOOR + MEMORY_PER_BYTE * len(data)
    assert peak <= bound, f"peak {peak} bytes for a {len(data)}-byte input (bound {bound})"


# -- XSpace --------------------------------------------------------------------------
def _duration_bound(space: xplane_pb2.XSpace | None) -> int | None:
    """The most time (ns) any graph of ``space`` may hold: every event's duration."""
    if space is None:
        return None
    ps = 0
    for plane in space.planes:
        for line in plane.lines:
            ps += sum(max(e.duration_ps, 0) for e in line.events)
    return ps // 1000


def _host_busy_ns(space: xplane_pb2.XSpace | None) -> int | None:
    """Busy time (ns) of the host threads: the union of each line's events."""
    if space is None:
        return None
    ps = 0
    for plane in space.planes:
        if plane.name != xplane.HOST_PLANE:
            continue
        for line in plane.lines:
            spans = sorted((e.offset_ps, e.offset_ps + e.duration_ps)
                           for e in line.events if e.duration_ps > 0)  # fmt: skip
            reach = None
            for start, end in spans:
                if reach is None or start >= reach:
                    ps += end - start
                    reach = end
                elif end > reach:
                    ps += end - reach
                    reach = end
    return ps // 1000


def _convert_capture(
    data: bytes, path: Path, space: xplane_pb2.XSpace | None, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    refused: list[str] = []
    counted = _Counted()
    monkeypatch.setattr(xplane, "nest", counted)
    events_cap = len(data) // 2 + 1  # an event takes two bytes at least
    frames_cap = 64 * len(data) + 1024
    time_cap = _duration_bound(space)

    def check(graph: FlameGraph | None, windows: int = 1) -> None:
        if graph is not None:
            tolerance = frames_cap * windows  # rounding: under 1 ns per frame and window
            limit = None if time_cap is None else time_cap + tolerance
            _check_graph(graph, frames_cap, limit)

    def read(capture: xplane.Capture, fn: Callable[..., T], *args: Any) -> T | None:
        before = capture.events_read
        out = _call(refused, fn, *args)
        read_now = capture.events_read - before
        assert read_now <= events_cap, f"{fn.__name__} read {read_now} events of {events_cap}"
        return out

    def body() -> None:
        capture = _call(refused, parse_xspace, data, "fuzz")
        if capture is None:
            return
        read(capture, capture.time_range)
        check(read(capture, device_flamegraph, capture))
        host = read(capture, host_flamegraph, capture)
        check(host)
        busy = _host_busy_ns(space)
        if busy is not None and host is not None:  # the split rule keeps busy time
            assert abs(host.root.total - busy) <= frames_cap, (host.root.total, busy)
        if busy and host is None and not refused:
            pytest.fail(f"host events with {busy} ns busy time gave no host graph")
        for kind, per_step in ((None, False), ("host", False), ("device", True)):
            check(read(capture, flamegraph_from_capture, capture, kind, per_step))
        found = read(capture, step_windows, capture)
        if found is not None:
            windows, _ = found
            assert all(w.end_ns > w.start_ns for w in windows)
            assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(windows))
            for kind in ("device", "host"):
                graphs = read(capture, windowed_flamegraphs, capture, kind, windows)
                for graph in graphs or ():
                    check(graph, len(windows))
        events = read(capture, xla_host.xla_host_events, capture)
        if events is not None:
            assert len(events.parent) == len(events) and (events.parent < len(events)).all()
            assert (events.end >= events.start).all()
            for graph in _call(refused, xla_host.graphs, events, None) or ():
                check(graph)
        # The file reader (pread) on the same bytes.
        path.write_bytes(data)
        on_disk = _call(refused, load_capture, path)
        if on_disk is not None:
            with on_disk:
                check(read(on_disk, flamegraph_from_capture, on_disk, None, False))

    _bounded(data, body)
    assert counted.worst <= nesting.MAX_SEGMENTS_PER_EVENT, counted.worst
    return refused


def test_generated_xspaces_convert_or_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @FUZZ
    @given(space=xspaces(), data=st.data())
    def run(space: xplane_pb2.XSpace, data: st.DataObject) -> None:
        raw = data.draw(serialised(space))
        sent = data.draw(mutated(raw))
        _convert_capture(sent, tmp_path / "fuzz.xplane.pb", space if sent == raw else None,
                         monkeypatch)  # fmt: skip

    run()


def test_random_bytes_as_xspace_are_refused_or_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @settings(FUZZ, max_examples=150)
    @given(
        data=st.one_of(
            st.binary(max_size=300),
            st.binary(max_size=60).map(lambda b: b"\x0a" + bytes([len(b)]) + b),
        )
    )
    def run(data: bytes) -> None:  # fmt: skip
        _convert_capture(data, tmp_path / "fuzz.xplane.pb", None, monkeypatch)

    run()


# Inputs the decoder differential (tests/unit/test_decoder.py) found crashing a reader
# with other than a refusal: a step stat with no value, an XLA Modules line with no
# events or 2**62 ps away from the ops, a step before the epoch, a line lasting past
# 2**63 ns.
FOUND_ELSEWHERE = [
    "0a9e0212092f686f73743a4350551a" + "091207584c41204f70731a" * 19 + "1e1207584c41204f70732213"
    "080110808080808080808080011801220208012a100801120c08011208737465705f6e756d2a0e0800120a"
    "1208737465705f6e756d",
    "0a51120d2f6465766963653a5450553a301a091207584c41204f70731a1312055374657073220a08011801"
    "2202080128002a100801120c08011208737465705f6e756d2a0e0800120a1208737465705f6e756d",
    "0a4b120d2f6465766963653a5450553a301a111207584c41204f707322060801100018021a17120b584c41"
    "204d6f64756c657318808090bbbad6adf00d2a0e0800120a1208737465705f6e756d",
    "0a41120d2f6465766963653a5450553a301a111207584c41204f707322060801100018021a0d120b584c41"
    "204d6f64756c65732a0e0800120a1208737465705f6e756d",
]


@pytest.mark.parametrize(
    "data",
    [bytes.fromhex(h) for h in FOUND_ELSEWHERE],
    ids=["step-before-epoch", "step-stat-without-value", "modules-far-away", "modules-empty"],
)
def test_inputs_found_by_the_decoder_differential(
    data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.analysis.sides.load import capture_side

    _convert_capture(data, tmp_path / "found.xplane.pb", None, monkeypatch)
    for kind in (None, "device", "host"):
        try:
            side = capture_side(parse_xspace(data, "found"), kind, {})  # type: ignore[arg-type]
        except InputError:
            continue
        for graph in (side[1], *side[2]):
            encode_pprof(graph)  # times fit pprof's int64 fields


def test_a_line_lasting_past_two_to_the_63_ns_still_encodes() -> None:
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    plane.event_metadata[1].name = "work"
    line = plane.lines.add(name="python", timestamp_ns=(1 << 63) - 10, duration_ps=INT64_MAX)
    line.events.add(metadata_id=1, offset_ps=0, duration_ps=5000)
    graph = host_flamegraph(parse_xspace(space.SerializeToString(), "long"))
    assert graph is not None and graph.time_nanos + graph.duration_nanos <= INT64_MAX
    encode_pprof(graph)


# -- pprof ---------------------------------------------------------------------------
STRINGS = ["", "space", "bytes", "allocations", "count", "inuse_space", "inuse_objects",
           "device", "cpu:0", "f", "a.py", "0x1", "kind", "samples", "cpu", "nanoseconds",
           "a\x00b", BAD_UTF8, "$x.py:1 g", "Cls.meth"]  # fmt: skip
# Built from one seed, as the XSpaces are (see "generated XSpaces").
_STRING_INDEX: Draw = _any(
    _ints(0, len(STRINGS) + 2), _pick([-1, -2, 1 << 40]), _ints(INT64_MIN, INT64_MAX)
)
_LOC_ID: Draw = _any(_ints(0, 12), _pick([UINT64_MAX, 1 << 63]))
_VALUE: Draw = _any(
    _ints(0, 1 << 20), _pick([0, 1, -1, INT64_MAX, INT64_MIN]), _ints(INT64_MIN, INT64_MAX)
)
_SAMPLE_TYPES = [[(1, 2), (3, 4)], [(3, 4), (1, 2)], [(5, 4), (6, 2)], [(13, 15)], [(1, 2)], []]


def _profile(r: random.Random) -> profile_pb2.Profile:
    profile = profile_pb2.Profile()
    some = _list(r, _pick(STRINGS), 8)
    table = r.choice([STRINGS, STRINGS, ["", *some], some])
    profile.string_table.extend(table)
    good = _ints(1, len(STRINGS) - 1)
    index = _any(good, good, good, _STRING_INDEX)
    for t, u in r.choice(_SAMPLE_TYPES):
        profile.sample_type.add(type=t, unit=u)
    if r.randint(0, 3) == 0:
        profile.sample_type.add(type=index(r), unit=index(r))
    if r.random() < 0.5:
        profile.period_type.type = index(r)
        profile.period_type.unit = index(r)
    profile.period = _VALUE(r)
    profile.time_nanos = _VALUE(r)
    profile.duration_nanos = _VALUE(r)
    profile.comment.extend(_list(r, _STRING_INDEX, 2))
    profile.default_sample_type = index(r)
    # Ids mostly coherent (1..n), with ids nothing has, repeated ids and huge ones.
    n_functions = r.randint(0, 5)
    function_ids = _any(_ints(1, max(n_functions, 1)), _LOC_ID)
    for number in range(1, n_functions + 1):
        profile.function.add(
            id=number if r.randint(0, 2) else _LOC_ID(r),  # the id, or a hostile one
            name=index(r),
            system_name=index(r),
            filename=index(r),
            start_line=_any(_ints(0, 100), _VALUE)(r),
        )
    n_locations = r.randint(0, 6)
    for number in range(1, n_locations + 1):
        loc = profile.location.add(
            id=number if r.randint(0, 2) else _LOC_ID(r),  # the id, or a hostile one
            address=_any(_LOC_ID, _U64)(r),
        )
        lines = r.randint(0, 3)
        if r.randint(0, 5) == 0:
            lines = r.randint(20, 150)  # many inlined lines
        for _ in range(lines):
            loc.line.add(function_id=function_ids(r), line=_VALUE(r))
    location_ids = _any(_ints(1, max(n_locations, 1)), _LOC_ID)
    deep = r.randint(0, 5) == 0  # deep stacks, repeated ids (recursion, "cycles")
    values = _any(_ints(0, 1 << 20), _pick([0, 1 << 62, INT64_MAX]))
    if r.randint(0, 3) == 0:
        values = _VALUE  # negative values too (a diff profile)
    for _ in range(r.randint(0, 30)):
        stack = [1, 2, 3] * r.randint(1, 200) if deep else _list(r, location_ids, 8)
        sample = profile.sample.add(location_id=stack)
        sample.value.extend(values(r) for _ in range(r.randint(1, 3)))
        for _ in range(r.randint(0, 2)):
            sample.label.add(key=_any(lambda _: 7, index)(r), str=index(r), num=_VALUE(r))
    return profile


def profiles() -> st.SearchStrategy[profile_pb2.Profile]:
    """Hostile pprof Profiles, each built from one seed."""
    return st.randoms(use_true_random=True).map(_profile)


def _fold_pprof(data: bytes, path: Path) -> list[str]:
    refused: list[str] = []
    frames_cap = 64 * len(data) + 1024  # well below MAX_PROFILE_FRAMES for these sizes

    def body() -> None:
        profile = _call(refused, decode_pprof, data, "fuzz")
        if profile is not None:
            types = [profile.string_table[t.type] for t in profile.sample_type]
            graphs = _call(refused, graphs_from_pprof, profile, types) or []
            for graph in graphs:
                _check_graph(graph, frames_cap)
            graph = _call(refused, from_pprof, profile)
            if graph is not None:
                _check_graph(graph, frames_cap)
        path.write_bytes(data)
        memory = _call(refused, load_memory_profile, path)
        if memory is not None:
            _check_graph(memory, frames_cap)

    _bounded(data, body)
    return refused


def test_generated_pprofs_fold_or_are_refused(tmp_path: Path) -> None:
    # 300 seed-built profiles: as many reach the graphs (not refused) as 150 drawn ones did.
    @settings(FUZZ, max_examples=300)
    @given(profile=profiles(), gzipped=st.booleans(), data=st.data())
    def run(profile: profile_pb2.Profile, gzipped: bool, data: st.DataObject) -> None:
        raw = data.draw(serialised(profile))
        raw = gzip.compress(raw, mtime=0) if gzipped else raw
        _fold_pprof(data.draw(mutated(raw)), tmp_path / "fuzz.pprof.gz")

    run()


def test_random_bytes_as_pprof_are_refused_or_folded(tmp_path: Path) -> None:
    @settings(FUZZ, max_examples=150)
    @given(
        data=st.one_of(
            st.binary(max_size=200),
            st.binary(max_size=200).map(lambda b: gzip.compress(b, mtime=0)),
        )
    )
    def run(data: bytes) -> None:  # fmt: skip
        _fold_pprof(data, tmp_path / "fuzz.pprof.gz")

    run()


# -- what the fuzzing found: each input, refused in one line or converted -----------------
def _host_space(events: list[tuple[int, int]], timestamp_ns: int = 0) -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "train"
    line = plane.lines.add(id=1, name="python", timestamp_ns=timestamp_ns)
    for offset, duration in events:
        line.events.add(metadata_id=1, offset_ps=offset, duration_ps=duration)
    return space


@pytest.mark.parametrize(
    "events",
    [
        [(0, 10), (497, INT64_MAX - 1)],  # the end wrapped to negative: was silently 24 ns
        [(0, 10), (INT64_MIN, 10**14)],  # before every window: was dropped silently
    ],
)
def test_an_event_past_2_62_ps_is_refused_not_dropped(events: list[tuple[int, int]]) -> None:
    capture = parse_xspace(_host_space(events).SerializeToString(), "c.xplane.pb")
    with pytest.raises(InputError, match=r"c.xplane.pb: corrupt XProf capture \(an event lies"):
        host_flamegraph(capture)


def test_a_profile_start_past_2_63_ns_is_refused() -> None:
    # Was OverflowError from windowed_flamegraphs and an unpushable pprof (time_nanos).
    space = _host_space([(0, 10**6)], timestamp_ns=5)
    space.planes[0].stat_metadata[2].id = 2
    space.planes[0].stat_metadata[2].name = "step_num"
    space.planes[0].lines[0].events[0].stats.add(metadata_id=2, int64_value=1)
    env = space.planes.add(name="Task Environment")
    env.stat_metadata[1].id = 1
    env.stat_metadata[1].name = "profile_start_time"
    env.stats.add(metadata_id=1, uint64_value=UINT64_MAX)
    capture = parse_xspace(space.SerializeToString(), "c.xplane.pb")
    with pytest.raises(InputError, match="corrupt XProf capture"):
        host_flamegraph(capture)
    with pytest.raises(InputError, match="corrupt XProf capture"):
        step_windows(capture)


def test_xla_host_events_name_a_corrupt_line() -> None:
    # Was google.protobuf DecodeError (bad UTF-8 in the line's name) out of the analysis.
    space = _host_space([(0, 10)])
    plane = space.planes[0]
    plane.stat_metadata[2].id = 2
    plane.stat_metadata[2].name = "hlo_op"
    plane.lines[0].name = BAD_UTF8
    data = space.SerializeToString().replace(BAD_UTF8.encode(), BAD_UTF8_BYTES)
    with pytest.raises(InputError, match=r"c.xplane.pb: corrupt XProf capture \(a line"):
        xla_host.xla_host_events(parse_xspace(data, "c.xplane.pb"))


def test_a_tracer_line_number_past_int64_still_makes_a_pushable_pprof() -> None:
    # "$x.py:99999999999999999999 h" made line 10**20: encode_pprof raised ValueError.
    space = _host_space([(0, 10**6)])
    space.planes[0].event_metadata[1].name = "$x.py:99999999999999999999 h"
    graph = host_flamegraph(parse_xspace(space.SerializeToString(), "c"))
    assert graph is not None
    assert graph.root.total == 1000
    decode_pprof(encode_pprof(graph))


def _cpu_profile() -> profile_pb2.Profile:
    profile = profile_pb2.Profile(string_table=["", "space", "bytes", "f"])
    profile.sample_type.add(type=1, unit=2)
    profile.function.add(id=1, name=3)
    profile.location.add(id=1).line.add(function_id=1)
    profile.sample.add(location_id=[1], value=[5])
    return profile


@pytest.mark.parametrize("field", ["name", "filename", "period_type"])
@pytest.mark.parametrize("index", [999, -2])
def test_a_string_index_outside_the_table_is_a_value_error(field: str, index: int) -> None:
    # Was IndexError (999) or silently another string (-2: the table's second last).
    profile = _cpu_profile()
    if field == "period_type":
        profile.period_type.type = index
    else:
        setattr(profile.function[0], field, index)
    with pytest.raises(
        ValueError, match=f"corrupt pprof: string index {index} is past its 4 strings"
    ):
        from_pprof(profile)


def test_values_summing_past_int64_are_refused(tmp_path: Path) -> None:
    # Two samples of 2**62 + 2**62 - 1 on one stack: the graph could not be encoded.
    profile = _cpu_profile()
    profile.sample[0].value[0] = INT64_MAX
    profile.sample.add(location_id=[1], value=[INT64_MAX])
    with pytest.raises(ValueError, match="values sum past 2\\*\\*63: refused"):
        from_pprof(profile)
    path = tmp_path / "m.pprof"
    path.write_bytes(profile.SerializeToString())
    with pytest.raises(InputError, match=r"m\.pprof: its space values sum past"):
        load_memory_profile(path)


def test_reading_a_small_memory_profile_allocates_what_it_holds(tmp_path: Path) -> None:
    # read(max_bytes + 1) allocated a 64 MiB buffer for every profile, however small.
    path = tmp_path / "m.pprof"
    path.write_bytes(_cpu_profile().SerializeToString())
    tracemalloc.start()
    try:
        load_memory_profile(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
