"""XProf chunked captures (``*.xplane.riegeli``): Riegeli/records of XSpace chunks.

Where these files come from (read in the public sources):

* The continuous-profiling ``get_snapshot`` call does **not** write them.
  ``xprof/pywrap/profiler_plugin_impl.cc`` (openxla/xprof) ``GetSnapshot`` calls
  ``tsl::profiler::GetSnapshot`` in ``xla/tsl/profiler/rpc/client/capture_profile.cc``
  (openxla/xla), which takes the XSpace the server put in its ``ProfileResponse``
  (``ProfilerServiceImpl::GetSnapShot`` in ``xla/tsl/profiler/rpc/profiler_service_impl.cc``
  collects it with ``emit_xspace`` set) and saves it with ``SaveXSpace``
  (``xla/tsl/profiler/rpc/client/save_profile.cc``): one binary proto,
  ``<logdir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host_port>.xplane.pb``.
* ``.xplane.riegeli`` is written by ``SaveXSpaceChunks`` (a vector of XSpaces, one file;
  used by ``ExportToTensorBoard(logdir, run, xspaces)`` in ``capture_profile.cc``) and by
  ``SaveXSpaceChunk`` (one XSpace appended per call; each call writes a whole Riegeli
  file, so the result is a concatenation of padded files), both in ``save_profile.cc``.
  Options: ``RecordWriterBase::Options::FromString("brotli:6")`` plus padding to the
  64 KiB block boundary; nothing else, so chunks are simple (not transposed), brotli
  compressed, and each record is one serialized XSpace. The XSpaces are what
  ``DestructiveChunkXSpace`` (``xla/tsl/profiler/utils/xplane_utils.cc``) cuts: the first
  keeps hostnames/errors/warnings, each further one holds one piece of one plane (same
  name and id, copies of its metadata maps and plane stats, a share of its lines; a line
  too big is split into pieces with the same id, name and timestamp).
* XProf reads them in ``SessionSnapshot::GetXSpaceFromRiegeli``
  (``xprof/convert/repository.cc``, openxla/xprof): every record parsed as an XSpace, the
  first taken whole, each further one merged into it with ``MergeXSpace``. The current
  ``repository.cc`` calls ``tsl::profiler::MergeXSpace`` (``xplane_utils.h``); the rules
  followed here are those of the ``MergeXSpace`` that a version of ``repository.cc``
  defines inline (the tsl copy was not readable where this was written).
  :func:`write_xspace` does that merge; :func:`_merge_records` lists the rules.
  XProf reads with a recovery callback that skips damaged regions silently; here a
  damaged file is refused, naming what is wrong (see "Hashes" below).

File format: google/riegeli ``doc/riegeli_records_file_format.md``. Handled: block
headers every 64 KiB (their distances are checked against the chunk they interrupt),
the file signature (the fixed first 64 bytes, checked byte for byte; signatures later in
the file, as appending writes them, are skipped), padding and metadata chunks (skipped),
simple chunks (``'r'``) uncompressed or brotli compressed (what the writer uses).
Refused with an :class:`~exporter.errors.InputError`: transposed chunks (``'t'``; the
writer does not make them), zstd and snappy compression (likewise), unknown chunk types.

Hashes are verified, as the Riegeli library does (``riegeli/records/block.h``,
``riegeli/chunk_encoding/chunk.h``): every block header's ``header_hash`` (of its two
distances), every chunk header's ``header_hash`` (of its other 32 bytes) and every
chunk's ``data_hash`` (of its data), each 64-bit HighwayHash under Riegeli's fixed key
(:mod:`exporter.profiles.highwayhash`). A mismatch is an :class:`InputError` naming the
chunk or block header and both values, not a counted skip as XProf's recovery makes:
a skipped chunk is a missing piece of the capture (XProf reads a file whose hashes are
all wrong as an empty session), and totals computed without it would be wrong without
saying so. A chunk's data is hashed in a first pass, block by block, before any of it is
decompressed, so a damaged chunk is never decoded. ``records_bytes`` verifies headers
only (it reads no chunk data). Beside the hashes every size is still checked against
the file's size and the chunk's own fields: the chunk's end computed from its header
must lie inside the file, block headers must point at the chunk being read, the sizes
buffer must hold exactly ``num_records`` sizes summing to ``decoded_data_size``,
decompressed sizes must equal the sizes the chunk declares.

Memory: one chunk's decoded records at a time (plus the record the caller keeps), at
most ``max_chunk_bytes``; compressed data is streamed through the decompressor in pieces
of at most one block. ``write_xspace`` reads one record at a time, spools events to a
temporary file (``TMPDIR``) and holds only plane headers, metadata maps and line headers
in memory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, Final

from google.protobuf.message import DecodeError

from exporter.errors import InputError
from exporter.profiles.highwayhash import HighwayHash64, riegeli_hash
from exporter.proto import xplane_pb2

__all__ = [
    "MAX_CHUNK_BYTES",
    "iter_records",
    "records_bytes",
    "write_xspace",
]

BLOCK_SIZE: Final = 1 << 16
BLOCK_HEADER_SIZE: Final = 24
USABLE_BLOCK_SIZE: Final = BLOCK_SIZE - BLOCK_HEADER_SIZE
CHUNK_HEADER_SIZE: Final = 40

# A record is one serialized XSpace, and protobuf refuses messages of 2 GiB and more, so
# a chunk written by the profiler holds less than that (the writer's chunks are 1 MiB
# unless one record is bigger). Larger claims are corruption, not data.
MAX_CHUNK_BYTES: Final = (1 << 31) - 1

# The first 64 bytes of every Riegeli/records file (the spec prints them): a block
# header (previous 0, next 64) and the signature chunk's header ('s', all sizes 0).
FILE_SIGNATURE: Final = bytes.fromhex(
    "83 af 70 d1 0d 88 4a 3f 00 00 00 00 00 00 00 00"
    " 40 00 00 00 00 00 00 00 91 ba c2 3c 92 87 e1 a9"
    " 00 00 00 00 00 00 00 00 e1 9f 13 c0 e9 b1 c3 72"
    " 73 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
)

_SIGNATURE: Final = 0x73  # 's'
_METADATA: Final = 0x6D  # 'm'
_PADDING: Final = 0x70  # 'p'
_SIMPLE: Final = 0x72  # 'r'
_TRANSPOSED: Final = 0x74  # 't'

_NONE: Final = 0
_BROTLI: Final = 0x62  # 'b'
_ZSTD: Final = 0x7A  # 'z'
_SNAPPY: Final = 0x73  # 's'

_READ_PIECE: Final = 1 << 20  # spool copies


# -- Riegeli/records --------------------------------------------------------------------
def _num_overhead_blocks(pos: int, size: int) -> int:
    return (size + (pos + USABLE_BLOCK_SIZE - 1) % BLOCK_SIZE) // USABLE_BLOCK_SIZE


def _add_with_overhead(pos: int, size: int) -> int:
    return pos + size + _num_overhead_blocks(pos, size) * BLOCK_HEADER_SIZE


def _round_up_to_possible_chunk_boundary(pos: int) -> int:
    remaining = (-pos) % BLOCK_SIZE
    return pos + max(0, remaining - (USABLE_BLOCK_SIZE - 1))


def _chunk_end(chunk_begin: int, data_size: int, num_records: int) -> int:
    return max(
        _add_with_overhead(chunk_begin, CHUNK_HEADER_SIZE + data_size),
        _round_up_to_possible_chunk_boundary(chunk_begin + num_records),
    )


def _u64(raw: bytes, at: int) -> int:
    return int.from_bytes(raw[at : at + 8], "little")


class _File:
    """A Riegeli file read by logical position: block headers stepped over, and checked."""

    def __init__(self, path: Path, handle: BinaryIO, size: int) -> None:
        self.path = path
        self.handle = handle
        self.size = size
        self.pos = 0  # physical position, never inside a block header

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.path}: not a readable Riegeli/records file: {what}")

    def _skip_block_header(self) -> None:
        if self.pos % BLOCK_SIZE == 0:
            self.pos += BLOCK_HEADER_SIZE

    def pieces(self, n: int) -> Iterator[bytes]:
        """The next ``n`` logical bytes, in pieces that end at block boundaries."""
        while n > 0:
            self._skip_block_header()
            take = min(n, BLOCK_SIZE - self.pos % BLOCK_SIZE)
            if self.pos + take > self.size:
                raise self.fail(f"truncated at byte {self.size} (needs {self.pos + take})")
            self.handle.seek(self.pos)
            piece = self.handle.read(take)
            if len(piece) != take:
                raise self.fail(f"truncated at byte {self.pos + len(piece)}")
            self.pos += take
            n -= take
            yield piece

    def read(self, n: int) -> bytes:
        return b"".join(self.pieces(n))

    def check_data_hash(self, chunk: _Chunk, stored: int) -> None:
        """Hash the chunk's data (a pass of its own, block by block); the file stays put."""
        start = self.pos
        hasher = HighwayHash64()
        for piece in self.pieces(chunk.data_size):
            hasher.update(piece)
        self.pos = start
        computed = hasher.digest()
        if computed != stored:
            raise self.fail(
                f"{chunk.where}: data_hash {stored:#018x} is not the hash of its "
                f"{chunk.data_size} data bytes ({computed:#018x})"
            )

    def check_block_headers(self, chunk_begin: int, chunk_end: int) -> None:
        """Every block header inside the chunk must point at its beginning and its end."""
        first = -(-chunk_begin // BLOCK_SIZE) * BLOCK_SIZE
        for block in range(first, chunk_end, BLOCK_SIZE):
            self.handle.seek(block)
            raw = self.handle.read(BLOCK_HEADER_SIZE)
            if len(raw) != BLOCK_HEADER_SIZE:
                raise self.fail(f"truncated block header at byte {block}")
            stored, computed = _u64(raw, 0), riegeli_hash(raw[8:])
            if stored != computed:
                raise self.fail(
                    f"block header at byte {block}: header_hash {stored:#018x} is not the "
                    f"hash of its contents ({computed:#018x})"
                )
            previous, following = _u64(raw, 8), _u64(raw, 16)
            if previous != block - chunk_begin or following != chunk_end - block:
                raise self.fail(
                    f"block header at byte {block} points at a chunk from byte "
                    f"{block - previous} to {block + following}, expected {chunk_begin} "
                    f"to {chunk_end}"
                )


class _Varints:
    """Varints read from a bytes-like buffer, each bounds-checked."""

    def __init__(self, buf: bytes | bytearray | memoryview, fail: InputError) -> None:
        self.buf = buf
        self.at = 0
        self.failure = fail

    def next(self) -> int:
        value = shift = 0
        buf = self.buf
        while True:
            if self.at >= len(buf) or shift > 63:
                raise self.failure
            byte = buf[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7


def _varint_from(data: _File, what: str) -> tuple[int, int]:
    """A varint64 read byte by byte from the file; returns (value, bytes read)."""
    value = shift = 0
    for count in range(1, 11):
        byte = data.read(1)[0]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, count
        shift += 7
    raise data.fail(f"{what}: varint longer than 10 bytes")


def _inflate(pieces: Iterator[bytes], expected: int, fail: InputError) -> bytearray:
    """Brotli-decompress ``pieces``; the output must be exactly ``expected`` bytes."""
    import brotli  # the brotli package: Google's own binding

    decompressor = brotli.Decompressor()
    out = bytearray()
    try:
        for piece in pieces:
            data = piece
            while True:
                out += decompressor.process(data, output_buffer_limit=expected - len(out) + 1)
                data = b""
                if len(out) > expected:
                    raise fail
                if decompressor.can_accept_more_data():
                    break
        finished = decompressor.is_finished()
    except brotli.error:
        raise fail from None
    if not finished or len(out) != expected:
        raise fail
    return out


def _decode_block(
    data: _File, size: int, compression: int, bound: int, where: str, what: str
) -> bytearray:
    """One compressed block of ``size`` bytes: at most ``bound`` bytes decoded."""
    if compression == _NONE:
        if size > bound:
            raise data.fail(f"{where}: {what} of {size} bytes, over the bound of {bound}")
        raw = bytearray()
        for piece in data.pieces(size):
            raw += piece
        return raw
    declared, used = _varint_from(data, f"{where}: {what}")
    if used > size:
        raise data.fail(f"{where}: {what} is shorter than its size prefix")
    if declared > bound:
        raise data.fail(
            f"{where}: {what} decompresses to {declared} bytes, over the bound of {bound}"
        )
    fail = data.fail(f"{where}: {what} does not brotli-decompress to its declared size")
    return _inflate(data.pieces(size - used), declared, fail)


def _simple_chunk(
    data: _File, where: str, data_size: int, num_records: int, decoded_size: int, bound: int
) -> Iterator[bytes]:
    if data_size < 2:
        raise data.fail(f"{where}: simple chunk of {data_size} data bytes")
    compression = data.read(1)[0]
    if compression in (_ZSTD, _SNAPPY):
        name = "zstd" if compression == _ZSTD else "snappy"
        raise data.fail(
            f"{where}: {name}-compressed chunk (only brotli and none are read; XProf's "
            "writer uses brotli)"
        )
    if compression not in (_NONE, _BROTLI):
        raise data.fail(f"{where}: unknown compression type 0x{compression:02x}")
    sizes_size, used = _varint_from(data, f"{where}: compressed_sizes_size")
    rest = data_size - 1 - used
    if sizes_size > rest:
        raise data.fail(
            f"{where}: sizes buffer of {sizes_size} bytes, past the chunk's {rest} data bytes"
        )
    if decoded_size > bound:
        raise data.fail(
            f"{where}: chunk decodes to {decoded_size} bytes, over the bound of {bound}"
        )
    sizes = _decode_block(
        data, sizes_size, compression, min(bound, 10 * num_records), where, "record sizes"
    )
    values_size = rest - sizes_size
    if compression == _NONE and values_size != decoded_size:
        raise data.fail(f"{where}: {values_size} bytes of records, the header says {decoded_size}")
    values = _decode_block(data, values_size, compression, decoded_size, where, "records")
    if len(values) != decoded_size:
        raise data.fail(f"{where}: {len(values)} bytes of records, the header says {decoded_size}")
    malformed = data.fail(f"{where}: record sizes buffer is malformed")
    varints = _Varints(sizes, malformed)  # checked whole first: no record of a bad chunk
    total = 0
    for _ in range(num_records):
        total += varints.next()
        if total > decoded_size:
            raise data.fail(f"{where}: record sizes add up past {decoded_size} bytes")
    if varints.at != len(sizes) or total != decoded_size:
        raise data.fail(
            f"{where}: record sizes do not match the header ({num_records} records, "
            f"{decoded_size} bytes)"
        )
    varints = _Varints(sizes, malformed)
    view = memoryview(values)
    start = 0
    for _ in range(num_records):
        end = start + varints.next()
        yield bytes(view[start:end])
        start = end


@dataclass(frozen=True)
class _Chunk:
    """A chunk's header fields, its position checked against the file."""

    begin: int
    end: int
    kind: int  # chunk_type
    data_size: int
    num_records: int
    decoded_size: int

    @property
    def where(self) -> str:
        return f"chunk at byte {self.begin}"


def _chunks(path: Path, *, verify_data: bool = True) -> Iterator[tuple[_File, _Chunk]]:
    """Each chunk of the Riegeli/records file ``path``, its header and block headers checked.

    With ``verify_data`` the chunk's data is hashed and checked against its header first.

    The file is positioned after the chunk's header; the caller may read its data, and
    the next chunk is read from the chunk's end whatever the caller did.
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        data = _File(path, handle, size)
        if size < len(FILE_SIGNATURE):
            raise data.fail(f"{size} bytes, shorter than the 64-byte file signature")
        if handle.read(len(FILE_SIGNATURE)) != FILE_SIGNATURE:
            raise data.fail("the first 64 bytes are not the Riegeli/records signature")
        while data.pos < size:
            chunk_begin = data.pos
            header = data.read(CHUNK_HEADER_SIZE)
            stored, computed = _u64(header, 0), riegeli_hash(header[8:])
            if stored != computed:
                raise data.fail(
                    f"chunk at byte {chunk_begin}: header_hash {stored:#018x} is not the hash "
                    f"of its header ({computed:#018x}; a damaged file, or one written "
                    "without Riegeli's hashes)"
                )
            data_size = _u64(header, 8)
            num_records = int.from_bytes(header[25:32], "little")
            chunk = _Chunk(
                begin=chunk_begin,
                end=_chunk_end(chunk_begin, data_size, num_records),
                kind=header[24],
                data_size=data_size,
                num_records=num_records,
                decoded_size=_u64(header, 32),
            )
            if chunk.end > size:
                raise data.fail(
                    f"{chunk.where} claims {data_size} data bytes and {num_records} records, "
                    f"ending at byte {chunk.end}, past the file's end at {size}"
                )
            data.check_block_headers(chunk_begin, chunk.end)
            if chunk.kind in (_SIGNATURE, _PADDING):
                if num_records or chunk.decoded_size or (chunk.kind == _SIGNATURE and data_size):
                    raise data.fail(f"{chunk.where}: {chr(chunk.kind)!r} chunk with nonzero sizes")
            elif chunk.kind == _METADATA:
                if num_records:
                    raise data.fail(f"{chunk.where}: metadata chunk claims {num_records} records")
            elif chunk.kind == _TRANSPOSED:
                raise data.fail(
                    f"{chunk.where}: transposed chunk (not read: XProf's writer makes simple "
                    "chunks)"
                )
            elif chunk.kind != _SIMPLE:
                raise data.fail(f"{chunk.where}: unknown chunk type 0x{chunk.kind:02x}")
            if verify_data:
                data.check_data_hash(chunk, _u64(header, 16))
            yield data, chunk
            data.pos = chunk.end


def iter_records(path: Path, *, max_chunk_bytes: int = MAX_CHUNK_BYTES) -> Iterator[bytes]:
    """Yield the records of the Riegeli/records file ``path`` in order."""
    for data, chunk in _chunks(path):
        if chunk.kind == _SIMPLE:
            yield from _simple_chunk(
                data,
                chunk.where,
                chunk.data_size,
                chunk.num_records,
                chunk.decoded_size,
                max_chunk_bytes,
            )


def records_bytes(path: Path) -> int:
    """The records' size once decoded: what the chunked capture is as XSpaces.

    Read from the chunk headers alone (nothing is decompressed, only the headers are
    hashed), so it costs a seek per chunk. A brotli-compressed capture is several times
    its file size once decoded, and XProf's converters take memory in proportion to
    that, not to the file.
    """
    chunks = _chunks(path, verify_data=False)
    return sum(chunk.decoded_size for _, chunk in chunks if chunk.kind == _SIMPLE)


# -- protobuf wire format ---------------------------------------------------------------
class _WireError(Exception):
    pass


def _read_varint(buf: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise _WireError
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """(field, wire type, value or payload start, payload end, entry start) per field."""
    at = 0
    end = len(buf)
    while at < end:
        entry = at
        key, at = _read_varint(buf, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _WireError
        if wire == 0:
            value, at = _read_varint(buf, at)
            yield number, wire, value, at, entry
        elif wire == 2:
            length, at = _read_varint(buf, at)
            if at + length > end:
                raise _WireError
            yield number, wire, at, at + length, entry
            at += length
        elif wire == 1:
            at += 8
            if at > end:
                raise _WireError
            yield number, wire, 0, at, entry
        elif wire == 5:
            at += 4
            if at > end:
                raise _WireError
            yield number, wire, 0, at, entry
        else:
            raise _WireError


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint_bytes(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(number: int, payload_size: int) -> bytes:
    return _varint_bytes(number << 3 | 2) + _varint_bytes(payload_size)


def _int_field(number: int, value: int) -> bytes:
    return _varint_bytes(number << 3) + _varint_bytes(value) if value else b""


def _name_of(buf: memoryview) -> str:
    """Field 2 (``name``) of an XPlane, XEventMetadata or XStatMetadata."""
    name = ""
    for number, wire, start, end, _ in _fields(buf):
        if number == 2 and wire == 2:
            name = bytes(buf[start:end]).decode("utf-8", "replace")
    return name


# -- the merge ---------------------------------------------------------------------------
IdMap = dict[int, int]


@dataclass
class _Segment:
    """Serialized XEvent entries of one line piece, kept in the spool."""

    offset: int
    length: int
    timestamp_ns: int  # the piece's own line timestamp: event offsets are relative to it
    event_ids: IdMap | None = None  # None: ids kept as they are
    stat_ids: IdMap | None = None


@dataclass
class _Line:
    line_id: int
    head: bytes  # every field but events, timestamp_ns and duration_ps
    timestamp_ns: int
    duration_ps: int
    segments: list[_Segment] = field(default_factory=list)


@dataclass
class _Metadata:
    """One metadata map: id -> (name, serialized value)."""

    entries: dict[int, tuple[str, bytes]] = field(default_factory=dict)


@dataclass
class _Plane:
    name: str
    head: bytes  # id, name and unknown fields
    lines: list[_Line] = field(default_factory=list)
    event_metadata: _Metadata = field(default_factory=_Metadata)
    stat_metadata: _Metadata = field(default_factory=_Metadata)
    stats: list[tuple[int, bytes]] = field(default_factory=list)  # (metadata id, XStat)


@dataclass
class _Space:
    planes: list[_Plane] = field(default_factory=list)
    top: dict[int, list[bytes]] = field(default_factory=lambda: {2: [], 3: [], 4: []})


class _Merger:
    """``MergeXSpace`` of XProf, over serialized records, events spooled to disk."""

    def __init__(self, spool: IO[bytes]) -> None:
        self.spool = spool
        self.space = _Space()
        self.first = True

    # parsing ------------------------------------------------------------------------
    def _spool_events(self, buf: memoryview, runs: list[tuple[int, int]]) -> tuple[int, int]:
        self.spool.seek(0, os.SEEK_END)
        offset = self.spool.tell()
        length = 0
        for start, end in runs:
            self.spool.write(buf[start:end])
            length += end - start
        return offset, length

    def _line(self, buf: memoryview, event_ids: IdMap | None, stat_ids: IdMap | None) -> _Line:
        head = bytearray()
        line_id = timestamp = duration = 0
        runs: list[tuple[int, int]] = []
        for number, wire, value, end, entry in _fields(buf):
            if number == 4 and wire == 2:
                if runs and runs[-1][1] == entry:
                    runs[-1] = (runs[-1][0], end)
                else:
                    runs.append((entry, end))
                continue
            if number == 3 and wire == 0:
                timestamp = _signed(value)
                continue
            if number == 9 and wire == 0:
                duration = _signed(value)
                continue
            if number == 1 and wire == 0:
                line_id = _signed(value)
            head += buf[entry:end]
        offset, length = self._spool_events(buf, runs)
        segment = _Segment(offset, length, timestamp, event_ids, stat_ids)
        return _Line(line_id, bytes(head), timestamp, duration, [segment])

    @staticmethod
    def _map_entry(buf: memoryview) -> tuple[int, bytes, str]:
        key = 0
        value = memoryview(b"")
        for number, wire, start, end, _ in _fields(buf):
            if number == 1 and wire == 0:
                key = _signed(start)
            elif number == 2 and wire == 2:
                value = buf[start:end]
        return key, bytes(value), _name_of(value)

    def _plane_parts(
        self, buf: memoryview
    ) -> tuple[bytes, str, list[memoryview], _Metadata, _Metadata, list[tuple[int, bytes]]]:
        head = bytearray()
        name = ""
        lines: list[memoryview] = []
        event_md, stat_md = _Metadata(), _Metadata()
        stats: list[tuple[int, bytes]] = []
        for number, wire, start, end, entry in _fields(buf):
            if wire == 2 and number == 3:
                lines.append(buf[start:end])
            elif wire == 2 and number in (4, 5):
                key, value, md_name = self._map_entry(buf[start:end])
                (event_md if number == 4 else stat_md).entries[key] = (md_name, value)
            elif wire == 2 and number == 6:
                stat = bytes(buf[start:end])
                stats.append((_stat_metadata_id(stat), stat))
            else:
                if number == 2 and wire == 2:
                    name = bytes(buf[start:end]).decode("utf-8", "replace")
                head += buf[entry:end]
        return bytes(head), name, lines, event_md, stat_md, stats

    def _new_plane(self, buf: memoryview) -> _Plane:
        head, name, lines, event_md, stat_md, stats = self._plane_parts(buf)
        plane = _Plane(name, head, [], event_md, stat_md, stats)
        plane.lines = [self._line(line, None, None) for line in lines]
        return plane

    # merging (xplane_utils MergeXSpace / MergePlane / MergePlaneLines / MergeLine) -----
    def add(self, record: bytes) -> None:
        buf = memoryview(record)
        planes: list[memoryview] = []
        top: dict[int, list[bytes]] = {2: [], 3: [], 4: []}
        for number, wire, start, end, _ in _fields(buf):
            if wire != 2:
                continue
            if number == 1:
                planes.append(buf[start:end])
            elif number in top:
                top[number].append(bytes(buf[start:end]))
        space = self.space
        if self.first:  # the first record is taken whole (Swap)
            self.first = False
            space.top = top
            space.planes = [self._new_plane(plane) for plane in planes]
            return
        for number, values in top.items():  # hostnames, errors, warnings: new ones only
            seen = set(space.top[number])
            for value in values:
                if value not in seen:
                    seen.add(value)
                    space.top[number].append(value)
        by_name = {plane.name: plane for plane in space.planes}  # later duplicates win
        for plane_buf in reversed(planes):  # XProf releases planes from the end
            name = _name_of(plane_buf)
            target = by_name.get(name)
            if target is None:
                space.planes.append(self._new_plane(plane_buf))
            else:
                self._merge_plane(plane_buf, target)

    def _merge_plane(self, buf: memoryview, to: _Plane) -> None:
        _, _, lines, event_md, stat_md, stats = self._plane_parts(buf)
        event_ids = _remap(event_md, to.event_metadata)
        stat_ids = _remap(stat_md, to.stat_metadata)
        event_map = None if _identity(event_ids) else event_ids
        stat_map = None if _identity(stat_ids) else stat_ids
        by_id = {line.line_id: line for line in to.lines}  # later duplicates win
        for line_buf in reversed(lines):
            line = self._line(line_buf, event_map, stat_map)
            target = by_id.get(line.line_id)
            if target is None:
                to.lines.append(line)
                continue
            # MergeLine: events stay relative to the earlier timestamp; longest duration.
            target.timestamp_ns = min(target.timestamp_ns, line.timestamp_ns)
            target.duration_ps = max(target.duration_ps, line.duration_ps)
            target.segments.extend(line.segments)
        existing = {metadata_id for metadata_id, _ in to.stats}
        for metadata_id, stat in stats:
            remapped = stat_ids.get(metadata_id, metadata_id)
            if remapped not in existing:
                existing.add(remapped)
                to.stats.append((remapped, _with_metadata_id(stat, remapped)))

    # writing ------------------------------------------------------------------------
    def _entries(self, segment: _Segment) -> Iterator[bytes]:
        """The XEvent payloads of a spooled segment, read a piece at a time.

        Seeks before every read, so the caller may append to the spool between yields.
        """
        position = segment.offset
        end = segment.offset + segment.length
        pending = b""
        while position < end:
            self.spool.seek(position)
            piece = self.spool.read(min(_READ_PIECE, end - position))
            if not piece:
                raise _WireError
            position += len(piece)
            pending += piece
            view = memoryview(pending)
            at = 0
            while at < len(view):
                try:
                    _, after_key = _read_varint(view, at)
                    length, start = _read_varint(view, after_key)
                except _WireError:
                    break
                if start + length > len(view):
                    break
                yield bytes(view[start : start + length])
                at = start + length
            pending = bytes(view[at:])
            del view
        if pending:
            raise _WireError

    def _append(self, raw: bytes | bytearray) -> int:
        self.spool.seek(0, os.SEEK_END)
        offset = self.spool.tell()
        self.spool.write(raw)
        return offset

    def _settle(self, line: _Line) -> None:
        """Rewrite the segments whose events need new offsets or metadata ids."""
        settled = []
        for segment in line.segments:
            shift_ps = (segment.timestamp_ns - line.timestamp_ns) * 1000
            if not shift_ps and segment.event_ids is None and segment.stat_ids is None:
                settled.append(segment)
                continue
            offset: int | None = None
            length = 0
            out = bytearray()
            for payload in self._entries(segment):
                try:
                    event = xplane_pb2.XEvent.FromString(payload)
                except DecodeError:
                    raise _WireError from None
                if shift_ps:
                    event.offset_ps = event.offset_ps + shift_ps
                if segment.event_ids is not None:
                    event.metadata_id = segment.event_ids.get(event.metadata_id, event.metadata_id)
                if segment.stat_ids is not None:
                    for stat in event.stats:
                        stat.metadata_id = segment.stat_ids.get(stat.metadata_id, stat.metadata_id)
                raw = event.SerializeToString()
                out += _delimited(4, len(raw)) + raw
                if len(out) >= _READ_PIECE:
                    start = self._append(out)
                    offset = start if offset is None else offset
                    length += len(out)
                    out = bytearray()
            if out or offset is None:
                start = self._append(out)
                offset = start if offset is None else offset
                length += len(out)
            settled.append(_Segment(offset, length, line.timestamp_ns))
        line.segments = settled

    def write(self, out: BinaryIO) -> int:
        written = 0
        for plane in self.space.planes:
            for line in plane.lines:
                self._settle(line)
            line_heads = []
            for line in plane.lines:
                head = (
                    line.head + _int_field(3, line.timestamp_ns) + _int_field(9, line.duration_ps)
                )
                size = len(head) + sum(segment.length for segment in line.segments)
                line_heads.append((_delimited(3, size) + head, line.segments))
            tail = bytearray()
            for number, metadata in ((4, plane.event_metadata), (5, plane.stat_metadata)):
                for key, (_, value) in metadata.entries.items():
                    entry = _int_field(1, key) + _delimited(2, len(value)) + value
                    tail += _delimited(number, len(entry)) + entry
            for _, stat in plane.stats:
                tail += _delimited(6, len(stat)) + stat
            size = len(plane.head) + len(tail)
            size += sum(len(h) + sum(s.length for s in segs) for h, segs in line_heads)
            prefix = _delimited(1, size) + plane.head
            out.write(prefix)
            written += len(prefix)
            for head, segments in line_heads:
                out.write(head)
                written += len(head)
                for segment in segments:
                    written += self._copy(segment, out)
            out.write(tail)
            written += len(tail)
        for number in (2, 3, 4):
            for value in self.space.top[number]:
                entry = _delimited(number, len(value)) + value
                out.write(entry)
                written += len(entry)
        return written

    def _copy(self, segment: _Segment, out: BinaryIO) -> int:
        self.spool.seek(segment.offset)
        left = segment.length
        while left:
            piece = self.spool.read(min(_READ_PIECE, left))
            if not piece:
                raise _WireError
            out.write(piece)
            left -= len(piece)
        return segment.length


def _stat_metadata_id(stat: bytes) -> int:
    for number, wire, value, _, _ in _fields(memoryview(stat)):
        if number == 1 and wire == 0:
            return _signed(value)
    return 0


def _with_metadata_id(stat: bytes, metadata_id: int) -> bytes:
    try:
        message = xplane_pb2.XStat.FromString(stat)
    except DecodeError:
        raise _WireError from None
    message.metadata_id = metadata_id
    return bytes(message.SerializeToString())


def _remap(source: _Metadata, target: _Metadata) -> IdMap:
    """``BuildSingleMetadataMap``: ids of ``source`` in ``target``, matched by name.

    A named entry whose name ``target`` lacks is added under the next free id (its value
    copied as it is, its own ``id`` field included); unnamed entries keep their id and
    are not copied. XProf walks both maps in protobuf map order (unspecified); here
    ``target`` goes in its stored order (a later entry of a repeated name wins) and
    ``source`` by ascending id, so new ids can differ from XProf's, never the names.
    """
    by_name: dict[str, int] = {}
    next_id = 0
    for key, (name, _) in target.entries.items():
        if name:
            by_name[name] = key
        next_id = max(next_id, key + 1)
    ids: IdMap = {}
    for key in sorted(source.entries):
        name, value = source.entries[key]
        if not name:
            ids[key] = key
            continue
        if name not in by_name:
            by_name[name] = next_id
            target.entries[next_id] = (name, value)
            next_id += 1
        ids[key] = by_name[name]
    return ids


def _identity(ids: IdMap) -> bool:
    return all(key == value for key, value in ids.items())


def _merge_records(path: Path, spool: IO[bytes], max_chunk_bytes: int) -> _Merger:
    """Merge the file's records as ``MergeXSpace`` does (``xla/tsl/profiler/utils``).

    * hostnames, errors and warnings of later records are added when new;
    * a plane whose name the merged space lacks is appended (the record's planes taken
      from its end, as XProf releases them); one whose name it has is merged into the
      last plane of that name: metadata matched by name (see :func:`_remap`), lines
      matched by id (new lines appended, again from the end), a matched line's events
      appended after its own, offsets made relative to the earlier of the two
      timestamps, its duration the longer of the two; plane stats whose (remapped)
      metadata id is already present are dropped;
    * only an event's own ``metadata_id`` and its stats' ``metadata_id`` are remapped,
      not ``ref_value`` stats nor the stats inside copied metadata, as in XProf.

    XProf then runs ``FixHloMetadataInXSpace`` (its own HLO proto clean-up); not done.
    """
    merger = _Merger(spool)
    for index, record in enumerate(iter_records(path, max_chunk_bytes=max_chunk_bytes)):
        try:
            merger.add(record)
        except _WireError:
            raise InputError(
                f"{path}: record {index} is not a serialized XSpace (malformed protobuf)"
            ) from None
    if merger.first:
        raise InputError(f"{path}: no records (an empty snapshot)")
    return merger


def write_xspace(path: Path, out: BinaryIO, *, max_chunk_bytes: int = MAX_CHUNK_BYTES) -> int:
    """Write to ``out`` the one XSpace XProf merges from ``path``; return bytes written."""
    with tempfile.TemporaryFile(prefix="mlprof-riegeli-") as spool:
        merger = _merge_records(path, spool, max_chunk_bytes)
        try:
            return merger.write(out)
        except _WireError:
            raise InputError(f"{path}: a record holds a malformed event") from None
