"""XProf captures on the wire: an XSpace opened lazily, its lines decoded to columns.

This is the decoding half of reading a capture (:mod:`exporter.profiles.xplane` builds
the graphs). A capture is never held whole: the XSpace's top-level fields are framed
first (planes and host names), a plane's own fields when the plane is first read (its
metadata parsed by protobuf, its lines left on disk), and each line is read when a
conversion asks for it, so memory follows the largest line, not the file, and captures
past protobuf's 2 GiB message limit (which XProf refuses) open like any other.

A line's events become three int64 columns (metadata id, offset, duration) through the
compiled decode core (``_xwire.c``) where the package was built with a compiler, else
through protobuf; both give the same columns (``tests/unit/test_decoder.py`` checks
every fixture both ways), and a line the compiled core does not recognise as canonical
protobuf is read through protobuf, which names a corrupt one. :data:`DECODER` says
which is in use (``mlprof --version``, ``/readyz``); ``MLPROF_DECODER=python`` forces
protobuf.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, pairwise
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
from google.protobuf.internal.decoder import _DecodeVarint as _decode_varint
from google.protobuf.message import DecodeError

from exporter.ascii_digits import parse_ascii_int
from exporter.errors import InputError
from exporter.profiles.capture_files import CAPTURES_NAMED, CHUNKED_SUFFIX
from exporter.profiles.nesting import FAR
from exporter.proto import xplane_pb2

if TYPE_CHECKING:
    from exporter.profiles.event_stats import LineTap

try:
    from exporter.profiles import _xwire  # type: ignore[attr-defined]
except ImportError:  # installed without a compiler: protobuf reads every line
    _xwire = None

__all__ = [
    "DECODER",
    "DEVICE_PLANE_RE",
    "HOST_PLANE",
    "LINE_WINDOW",
    "Capture",
    "LineHeader",
    "OpLine",
    "Plane",
    "PlaneRef",
    "compiled_core",
    "lasting_columns",
    "line_columns",
    "line_headers",
    "line_pieces",
    "load_capture",
    "parse_xspace",
    "read_line",
    "stat_int",
    "stat_values",
    "use_decoder",
]

DEVICE_PLANE_RE = re.compile(r"^/device:(TPU|GPU):\d+$")
HOST_PLANE = "/host:CPU"
PS_PER_NS = 1000
# Line timestamps below this (1973) are relative to the profile start (XProf normalises
# them so in CPU captures), not nanoseconds since the epoch.
_RELATIVE_BELOW_NS = 10**17
_INT64 = 1 << 63  # times past it (ns or ps) are corrupt: numpy and pprof hold int64
# A plane's fields are framed from windows of this size: one read covers the headers
# of thousands of metadata entries, and a line's body is skipped without reading it.
_WINDOW = 1 << 20
_MAX_FIELD_HEADER = 20  # a tag and a length varint: at most 10 bytes each
_XSPACE_PLANES, _XSPACE_HOSTNAMES, _PLANE_LINES = 1, 4, 3
# A line longer than this is read through windows of it (see line_pieces), so memory
# follows the window, not the line: a 2.5 GB capture's op lines are 620 MB each. At
# about 18 bytes per op event, a window is about 0.9 M events.
LINE_WINDOW = 1 << 24
_REMEMBERED_HEADER_BYTES = 1 << 16  # shorter lines' headers are read again: cheap
# Planes' metadata bytes kept per capture (Capture.plane): an analysis opens the same
# plane ~14 times, and framing its metadata fields in Python costs more than parsing
# them (7 ms for a GPU plane of 75 KB). Only the serialized bytes are kept, each
# plane's up to 1 MiB, 4 MiB in all: a TPU plane's large metadata is framed again,
# as before, so its captures' peak memory does not grow.
_REMEMBERED_PLANE_BYTES = 1 << 20
_REMEMBERED_PLANES_BYTES = 1 << 22

Reader = Callable[[int, int], bytes]  # (offset, length) -> bytes

DECODER: str = (
    "compiled" if _xwire is not None and os.environ.get("MLPROF_DECODER") != "python" else "python"
)


def compiled_core() -> Any | None:
    """The compiled core while it is the decoder in use, else None.

    Graph building follows it too (:func:`exporter.profiles.nesting.nest`, the frames'
    self time in ``xplane.py``): ``MLPROF_DECODER=python`` and :func:`use_decoder` then
    run the numpy twins, so the differential tests hold every compiled path to one.
    """
    return _xwire if DECODER == "compiled" else None


@contextmanager
def use_decoder(name: str) -> Iterator[None]:
    """Read lines with ``name`` ("compiled" or "python") inside the block (for tests)."""
    global DECODER
    if name not in ("compiled", "python") or (name == "compiled" and _xwire is None):
        raise ValueError(f"decoder {name!r} is not available (this install has {DECODER})")
    before, DECODER = DECODER, name
    try:
        yield
    finally:
        DECODER = before


@dataclass(frozen=True, slots=True)
class PlaneRef:
    """Where one plane's bytes are in the capture."""

    name: str
    start: int
    end: int


class _Fields:
    """Frames the fields of ``[start, end)`` through windows of the capture."""

    def __init__(self, read: Reader, start: int, end: int, source: str) -> None:
        self.read, self.end, self.source = read, end, source
        self.pos = start
        self._at, self._buf = start, b""

    def bytes_of(self, start: int, stop: int) -> bytes:
        """The bytes of ``[start, stop)``, from the window when it holds them."""
        if self._at <= start and stop <= self._at + len(self._buf):
            return self._buf[start - self._at : stop - self._at]
        return self.read(start, stop - start)

    def __iter__(self) -> Iterator[tuple[int, int, int, int, int]]:
        """(field number, wire type, field start, body start, end) of each field."""
        while self.pos < self.end:
            pos = self.pos
            if pos + _MAX_FIELD_HEADER > self._at + len(self._buf):
                self._at, self._buf = pos, self.read(pos, min(_WINDOW, self.end - pos))
            here = pos - self._at
            try:
                tag, used = _decode_varint(self._buf, here)
                number, wire = tag >> 3, tag & 7
                if wire == 2:
                    length, used = _decode_varint(self._buf, used)
                    body, stop = self._at + used, self._at + used + length
                elif wire == 0:
                    _, used = _decode_varint(self._buf, used)
                    body = stop = self._at + used
                elif wire in (1, 5):
                    body = self._at + used
                    stop = body + (8 if wire == 1 else 4)
                else:  # groups (deprecated) and invalid types: no XProf writer makes them
                    raise InputError(
                        f"{self.source}: not an XProf capture (field {number} at byte {pos} "
                        f"has wire type {wire})"
                    )
            except (IndexError, ValueError, DecodeError):
                raise InputError(
                    f"{self.source}: truncated or corrupt XProf capture (bad field header "
                    f"at byte {pos})"
                ) from None
            if number < 1:
                raise InputError(
                    f"{self.source}: not an XProf capture (field number 0 at byte {pos})"
                )
            if stop > self.end:
                raise InputError(
                    f"{self.source}: truncated XProf capture (a field at byte {pos} needs "
                    f"{stop - self.end} more bytes than the file has)"
                )
            self.pos = stop
            yield number, wire, pos, body, stop


class _Lines(Sequence[bytes]):
    """A plane's serialized lines, each read from the capture when asked for."""

    def __init__(self, read: Reader, spans: list[tuple[int, int]]) -> None:
        self._read, self._spans = read, spans

    def span(self, index: int) -> tuple[int, int]:
        """Where line ``index``'s bytes are in the capture: [start, end)."""
        return self._spans[index]

    def read(self, start: int, length: int) -> bytes:
        return self._read(start, length)

    def __len__(self) -> int:
        return len(self._spans)

    def __getitem__(self, index: int) -> bytes:  # type: ignore[override]
        start, end = self._spans[index]
        return self._read(start, end - start)

    def __iter__(self) -> Iterator[bytes]:
        return (self._read(start, end - start) for start, end in self._spans)


class Plane:
    """One plane: its metadata and stats parsed, its lines read one at a time."""

    __slots__ = ("_meta", "lines")

    def __init__(self, meta: xplane_pb2.XPlaneByLine, lines: _Lines) -> None:
        self._meta, self.lines = meta, lines

    @property
    def id(self) -> int:
        return self._meta.id

    @property
    def name(self) -> str:
        return self._meta.name

    @property
    def event_metadata(self) -> Any:
        return self._meta.event_metadata

    @property
    def stat_metadata(self) -> Any:
        return self._meta.stat_metadata

    @property
    def stats(self) -> Any:
        return self._meta.stats


@dataclass(frozen=True, slots=True)
class OpLine:
    """One device op line as a conversion reads it (what ``Capture.on_op_line`` gets):
    the plane, the line's start (ns), its lasting events' metadata ids, starts and ends
    (ps after the line's start). A long line arrives in pieces (:func:`line_pieces`),
    one call each; ``sole`` says the line is the plane's only op line, so no other
    line's events overlap its pieces."""

    ref: PlaneRef
    plane: Plane
    base_ns: int
    ids: np.ndarray
    starts_ps: np.ndarray
    ends_ps: np.ndarray
    sole: bool = True


@dataclass
class Capture:
    """An XProf capture opened for conversion; planes are parsed when needed.

    ``source`` (the file or session) is named in every error; ``events_read`` counts
    the events the conversions have read so far.
    """

    source: str
    size: int
    read: Reader
    planes: list[PlaneRef] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)
    events_read: int = 0
    steps: int = 0  # events on a device plane's Steps line (set by device_flamegraph)
    handle: BinaryIO | None = None  # the open file planes are read from, if any
    # Called with each device op line the conversion reads (an OpLine). The analysis
    # takes device busy and communication time from it rather than reading every op
    # event a second time.
    on_op_line: Callable[[OpLine], None] | None = None
    # Reads more stats of the GPU stream lines a conversion reads, in the same pass
    # (event_stats.LineTap: the kernel facts), so a stream line is read once.
    stream_tap: LineTap | None = None
    _start_ns: int | None = None  # profile_start_time, read when first needed
    # Headers of long lines by their bytes' span: a line's header fields follow its
    # events, so reading one scans the whole line (20 MB for a GPU stream of 500 k
    # kernels), and the conversions of one analysis ask for it several times.
    _headers: dict[tuple[int, int], LineHeader] = field(
        default_factory=dict, repr=False, compare=False
    )
    _plane_bytes: dict[PlaneRef, tuple[bytes, list[tuple[int, int]]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def close(self) -> None:
        """Close the file (a capture from bytes has none)."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_space(cls, space: xplane_pb2.XSpace, source: str = "<memory>") -> Capture:
        """A capture from an in-memory XSpace (e.g. a synthetic one)."""
        return parse_xspace(space.SerializeToString(), source)

    @property
    def device_planes(self) -> list[PlaneRef]:
        return [p for p in self.planes if DEVICE_PLANE_RE.fullmatch(p.name)]

    @property
    def host_planes(self) -> list[PlaneRef]:
        return [p for p in self.planes if p.name == HOST_PLANE]

    @property
    def plane_names(self) -> list[str]:
        return [p.name for p in self.planes]

    def plane(self, ref: PlaneRef) -> Plane:
        """Open one plane: its metadata parsed, its lines framed (read when needed)."""
        kept = self._plane_bytes.get(ref)
        if kept is None:
            fields = _Fields(self.read, ref.start, ref.end, self.source)
            meta_parts, spans = [], []
            for number, wire, start, body, stop in fields:
                if number == _PLANE_LINES and wire == 2:
                    spans.append((body, stop))
                else:
                    meta_parts.append(fields.bytes_of(start, stop))
            kept = (b"".join(meta_parts), spans)
            del meta_parts
            held = sum(len(b) for b, _ in self._plane_bytes.values())
            if len(kept[0]) <= _REMEMBERED_PLANE_BYTES and (
                held + len(kept[0]) <= _REMEMBERED_PLANES_BYTES
            ):
                self._plane_bytes[ref] = kept
        meta_bytes, spans = kept
        meta = xplane_pb2.XPlaneByLine()
        try:
            meta.ParseFromString(meta_bytes)
        except DecodeError:
            raise InputError(
                f"{self.source}: corrupt XProf capture (plane {ref.name!r} does not parse)"
            ) from None
        return Plane(meta, _Lines(self.read, spans))

    def _profile_start_ns(self) -> int:
        for ref in self.planes:
            if ref.name == "Task Environment":
                plane = self.plane(ref)
                names = {m.id: m.name for m in plane.stat_metadata.values()}
                for stat in plane.stats:
                    if names.get(stat.metadata_id) == "profile_start_time":
                        return stat_int(stat)
        return 0

    def line_start_ns(self, timestamp_ns: int) -> int:
        """A line's start in ns since the epoch (relative line times are made absolute)."""
        if timestamp_ns >= _RELATIVE_BELOW_NS:
            return timestamp_ns
        if self._start_ns is None:
            self._start_ns = self._profile_start_ns()
        start = self._start_ns + timestamp_ns
        if not -_INT64 <= start < _INT64:
            raise InputError(f"{self.source}: corrupt XProf capture (a line starts at {start} ns)")
        return start

    def time_range(self) -> tuple[int, int]:
        """(start ns since epoch, duration ns) from ``Task Environment``, else the lines.

        Without a Task Environment plane the range spans the device and host lines'
        own timestamps and durations; with none of those either, it is (now, 0): a
        profile stamped 0 would be outside Pyroscope's ingestion window.
        """
        for ref in self.planes:
            if ref.name != "Task Environment":
                continue
            plane = self.plane(ref)
            names = {m.id: m.name for m in plane.stat_metadata.values()}
            values = {names.get(s.metadata_id): stat_int(s) for s in plane.stats}
            start, stop = values.get("profile_start_time"), values.get("profile_stop_time")
            if not 0 <= (start or 0) < _INT64 or not 0 <= (stop or 0) < _INT64:
                raise InputError(f"{self.source}: corrupt XProf capture (profile time {start})")
            if start:
                return start, max(0, (stop or start) - start)
        return self._lines_range() or (time.time_ns(), 0)

    def _lines_range(self) -> tuple[int, int] | None:
        first, last = 0, 0
        for ref in (*self.device_planes, *self.host_planes):
            plane = self.plane(ref)
            for index in range(len(plane.lines)):
                try:
                    header = line_header(self, plane, index)
                except InputError:
                    continue  # the conversion itself names a corrupt line
                if header.timestamp_ns <= 0:
                    continue
                begin = self.line_start_ns(header.timestamp_ns)
                stop = begin + max(0, header.duration_ps) // PS_PER_NS
                first = min(first or begin, begin)
                last = max(last, stop)
        # A corrupt line may claim to last past 2**63 ns; pprof holds int64.
        return (first, min(last, _INT64 - 1) - first) if first else None


def _open(read: Reader, size: int, source: str) -> Capture:
    try:
        return _framed(read, size, source)
    except InputError:
        # A JSON trace (Chrome's, Kineto's, a trace_viewer export) fails on its first byte
        # with "field 15 at byte 0 has wire type 3": say what it looks like instead. Only
        # after framing failed: an XSpace may start with bytes that read as whitespace.
        head = read(0, min(size, 64)).lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf")
        if head[:1] in (b"{", b"["):
            raise InputError(
                f"{source}: looks like JSON (a Chrome/Kineto trace?), not an XProf capture "
                f"({CAPTURES_NAMED})"
            ) from None
        raise


def _framed(read: Reader, size: int, source: str) -> Capture:
    capture = Capture(source, size, read)
    fields = _Fields(read, 0, size, source)
    for number, wire, start, body, stop in fields:
        if wire != 2:
            raise InputError(
                f"{source}: not an XProf capture (field {number} at byte {start} has wire "
                f"type {wire}, expected an XSpace)"
            )
        if number == _XSPACE_PLANES:
            header = xplane_pb2.XPlaneHeader()
            try:
                header.ParseFromString(_plane_head(fields, body, stop))
            except DecodeError:
                raise InputError(
                    f"{source}: corrupt XProf capture (plane at byte {body} does not parse)"
                ) from None
            capture.planes.append(PlaneRef(header.name, body, stop))
        elif number == _XSPACE_HOSTNAMES:
            capture.hostnames.append(fields.bytes_of(body, stop).decode("utf-8", "replace"))
    if not capture.planes:
        raise InputError(f"{source}: not an XProf capture (no planes in the XSpace)")
    return capture


def _plane_head(fields: _Fields, start: int, end: int) -> bytes:
    """A plane's name field, framed up to it (the rest of the plane is not read)."""
    for number, _wire, field_start, _body, stop in _Fields(fields.read, start, end, fields.source):
        if number == 2:  # XPlane.name; writers put it before the lines
            return fields.read(field_start, stop - field_start)
    return b""


@dataclass(frozen=True, slots=True)
class LineHeader:
    index: int
    id: int
    name: str
    display_name: str
    timestamp_ns: int
    duration_ps: int = 0


def _corrupt_line(capture: Capture, plane: Plane, index: int) -> InputError:
    return InputError(
        f"{capture.source}: corrupt XProf capture (line {index} of plane "
        f"{plane.name!r} does not parse)"
    )


class _NotCanonicalError(Exception):
    """A line the compiled core hands back to protobuf."""


def _scans(plane: Plane, index: int, events: bool) -> Iterator[tuple[Any, ...]]:
    """The compiled core's reading of line ``index``, a window of at most
    :data:`LINE_WINDOW` bytes at a time (bigger only for one field bigger than that)."""
    pos, end = plane.lines.span(index)
    window = LINE_WINDOW
    while True:
        final = end - pos <= window
        found = _xwire.scan_line(plane.lines.read(pos, min(window, end - pos)), final, events)
        if found is None:
            raise _NotCanonicalError
        yield found
        if final:
            return
        pos += found[0]
        if not found[0]:  # one field longer than the window: read it whole
            window *= 2


def _scanned_header(plane: Plane, index: int) -> LineHeader:
    ints, names = [0, 0, 0, 0], [b"", b""]
    for _, values, seen, name, display, _, _ in _scans(plane, index, events=False):
        for slot in range(4):  # the last value of a field wins, as in protobuf
            if seen >> slot & 1:
                ints[slot] = values[slot]
        names = [name if seen & 16 else names[0], display if seen & 32 else names[1]]
    return LineHeader(index, ints[0], names[0].decode(), names[1].decode(), ints[2], ints[3])


def line_header(capture: Capture, plane: Plane, index: int) -> LineHeader:
    """Line ``index``'s ids, names and times; its events are skipped, not decoded.

    A long line's header is read once per capture (lines of at least
    :data:`_REMEMBERED_HEADER_BYTES`: as many as the file holds such spans).
    """
    span = plane.lines.span(index)
    found = capture._headers.get(span)
    if found is None:
        found = _line_header(capture, plane, index)
        if span[1] - span[0] >= _REMEMBERED_HEADER_BYTES:
            capture._headers[span] = found
    return found


def _line_header(capture: Capture, plane: Plane, index: int) -> LineHeader:
    if DECODER == "compiled":
        try:
            return _scanned_header(plane, index)
        except (_NotCanonicalError, UnicodeDecodeError):
            pass  # protobuf's verdict on the line, below
    header = xplane_pb2.XLineHeader()
    try:
        header.ParseFromString(plane.lines[index])  # events skipped (unknown, freed with it)
    except DecodeError:
        raise _corrupt_line(capture, plane, index) from None
    return LineHeader(
        index, header.id, header.name, header.display_name, header.timestamp_ns,
        header.duration_ps,
    )  # fmt: skip


def line_headers(capture: Capture, plane: Plane) -> list[LineHeader]:
    """Each line's index, ids, names and times; the events are not kept."""
    return [line_header(capture, plane, index) for index in range(len(plane.lines))]


def read_line(capture: Capture, plane: Plane, index: int) -> xplane_pb2.XLine:
    """Parse line ``index`` of ``plane`` (InputError naming it when corrupt)."""
    line = xplane_pb2.XLine()
    try:
        line.ParseFromString(plane.lines[index])
    except DecodeError:
        raise _corrupt_line(capture, plane, index) from None
    capture.events_read += len(line.events)
    return line


def parse_xspace(data: bytes, source: str) -> Capture:
    """Open XSpace bytes; InputError naming ``source`` when they are not a capture."""
    if not data:
        raise InputError(f"{source}: empty, expected an XProf capture ({CAPTURES_NAMED})")
    view = memoryview(data)
    return _open(lambda start, length: bytes(view[start : start + length]), len(data), source)


def load_capture(path: Path) -> Capture:
    """Open a capture file; its planes are read from disk when needed.

    An ``.xplane.pb`` is read in place. An ``.xplane.riegeli`` (XProf's chunked capture)
    is first merged into one XSpace, as XProf merges it, in an anonymous temporary file
    (``TMPDIR``; gone when the capture is closed), which is then read the same way.
    """
    try:
        size = path.stat().st_size
        handle: BinaryIO = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read capture ({exc.strerror or exc})") from None
    if not size:
        handle.close()
        raise InputError(f"{path}: empty file, expected an XProf capture ({CAPTURES_NAMED})")
    if path.name.endswith(CHUNKED_SUFFIX):
        handle.close()
        handle = _merged(path)
        size = os.fstat(handle.fileno()).st_size
    fd = handle.fileno()

    def read(start: int, length: int) -> bytes:
        data = os.pread(fd, length, start)
        if len(data) != length:
            raise InputError(f"{path}: file changed or was truncated while reading")
        return data

    try:
        capture = _open(read, size, str(path))
    except BaseException:
        handle.close()
        raise
    capture.handle = handle  # planes are read from it when a conversion needs them
    return capture


def _merged(path: Path) -> BinaryIO:
    """``path``'s records merged into one XSpace, in an unnamed temporary file."""
    import tempfile  # here, as riegeli: it loads shutil, random and the compressors

    from exporter.profiles import riegeli

    merged = tempfile.TemporaryFile(prefix="mlprof-xspace-")  # noqa: SIM115 (the caller closes it)
    try:
        riegeli.write_xspace(path, merged)
        merged.flush()
    except OSError as exc:
        merged.close()
        raise InputError(f"{path}: cannot read capture ({exc.strerror or exc})") from None
    except BaseException:
        merged.close()
        raise
    return merged


# -- stats ---------------------------------------------------------------------------
def stat_int(stat: xplane_pb2.XStat) -> int:
    """A stat's value as an int (0 when it holds none)."""
    kind = stat.WhichOneof("value")
    if kind in ("int64_value", "uint64_value", "ref_value"):
        return int(getattr(stat, kind))
    if kind == "double_value":
        # NaN and inf (int() raises on them) hold no number either.
        return int(stat.double_value) if math.isfinite(stat.double_value) else 0
    if kind == "str_value":
        return parse_ascii_int(stat.str_value, signed=True) or 0
    return 0


def stat_values(
    plane: Plane,
    stats: Iterable[xplane_pb2.XStat],
    names: dict[int, str] | None = None,
    wanted: frozenset[str] | None = None,
) -> dict[str, str | int | float]:
    """Stats by name (``ref_value`` resolved); ``names`` maps the plane's stat ids."""
    if names is None:
        names = {m.id: m.name for m in plane.stat_metadata.values()}
    out: dict[str, str | int | float] = {}
    for stat in stats:
        name = names.get(stat.metadata_id)
        if name is None or (wanted is not None and name not in wanted):
            continue
        kind = stat.WhichOneof("value")
        if kind == "ref_value":
            out[name] = names.get(stat.ref_value, "")
        elif kind is not None and kind != "bytes_value":
            out[name] = getattr(stat, kind)
    return out


# -- events as columns ----------------------------------------------------------------
_GET_ID_OFF_DUR = attrgetter("metadata_id", "offset_ps", "duration_ps")
Columns = tuple[np.ndarray, np.ndarray, np.ndarray]


def event_columns(events: Sequence[xplane_pb2.XEvent], source: str) -> Columns:
    """metadata ids, starts (ps), ends (ps) of parsed events that last (see below)."""
    flat = np.fromiter(chain.from_iterable(map(_GET_ID_OFF_DUR, events)), np.int64, 3 * len(events))
    rows = flat.reshape(-1, 3)
    return lasting_columns(rows[:, 0], rows[:, 1], rows[:, 2], source)


def line_columns(capture: Capture, plane: Plane, index: int) -> Columns:
    """metadata ids, starts (ps), ends (ps) of line ``index``'s events that last.

    Instant events (markers, zero duration) carry no time and are left out. Through the
    compiled core the line's bytes become the columns in one pass; through protobuf
    ``attrgetter`` reads the parsed events' fields and ``np.fromiter`` packs them, so no
    list of Python ints is built either way.
    """
    if DECODER == "compiled":
        start, end = plane.lines.span(index)
        found = _xwire.scan_line(plane.lines.read(start, end - start), True, True)
        if found is not None:
            return _columns(capture, found[6])
    return event_columns(read_line(capture, plane, index).events, capture.source)


def _columns(capture: Capture, raw: tuple[bytes, bytes, bytes]) -> Columns:
    ids, offs, durs = (np.frombuffer(column, np.int64) for column in raw)
    capture.events_read += len(ids)
    return lasting_columns(ids, offs, durs, capture.source)


def line_pieces(capture: Capture, plane: Plane, index: int) -> Iterator[Columns]:
    """Line ``index``'s columns (as :func:`line_columns`) in pieces that no event crosses.

    Every event of a piece ends at or before every event of a later piece starts, so
    each piece nests on its own and sums of per-piece results equal the whole line's.
    A line up to :data:`LINE_WINDOW` bytes is one piece. A longer one is read twice
    through windows of that size: first to find where the windows may be cut (after a
    window when everything before it ends before anything after it starts), then each
    piece is decoded, so memory follows the window, not the line. A line no window
    boundary can cut (one event spanning it), the pure-Python decoder and a
    non-canonical line give one piece.
    """
    start, end = plane.lines.span(index)
    if DECODER != "compiled" or end - start <= LINE_WINDOW:
        yield line_columns(capture, plane, index)
        return
    bounds, lows, highs = [start], [], []
    try:
        for found in _scans(plane, index, events=True):
            ids, offs, durs = (np.frombuffer(c, np.int64) for c in found[6])
            _, offs, ends = lasting_columns(ids, offs, durs, capture.source)
            bounds.append(bounds[-1] + found[0])
            lows.append(int(offs.min()) if len(offs) else FAR)
            highs.append(int(ends.max()) if len(ends) else -FAR)
    except _NotCanonicalError:
        yield line_columns(capture, plane, index)
        return
    before = np.maximum.accumulate(highs)[:-1]  # latest end up to each window
    after = np.minimum.accumulate(lows[::-1])[::-1][1:]  # earliest start after it
    cuts = [start, *(bounds[i + 1] for i in np.flatnonzero(before <= after).tolist()), end]
    for lo, hi in pairwise(cuts):
        found = _xwire.scan_line(plane.lines.read(lo, hi - lo), True, True)
        if found is None:  # read whole-field by whole-field above: the file changed
            raise _corrupt_line(capture, plane, index)
        yield _columns(capture, found[6])


def lasting_columns(ids: np.ndarray, offs: np.ndarray, durs: np.ndarray, source: str) -> Columns:
    """Events with a positive duration as (ids, starts, ends); one past 2**62 ps is corrupt."""
    keep = durs > 0
    if not keep.all():
        ids, durs, offs = ids[keep], durs[keep], offs[keep]
    ends = offs + durs
    # Offset + duration wrapped past 2**63 ps, or beyond the FAR edge of every window.
    if len(ends) and ((ends < offs).any() or offs.min() < -FAR or ends.max() > FAR):
        raise InputError(f"{source}: corrupt XProf capture (an event lies past 2**62 ps)")
    return ids, offs, ends
