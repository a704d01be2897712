"""A small Riegeli/records writer for tests, written from the format spec.

google/riegeli ``doc/riegeli_records_file_format.md``: a file is a sequence of chunks
(40-byte header, data, padding); at every multiple of 64 KiB a 24-byte block header
interrupts whatever is there, even a chunk header, and gives the distances back to the
beginning and on to the end of the chunk it interrupts. The file begins with the fixed
64 bytes of the signature chunk. Simple chunks (``'r'``) hold a compression byte, the
size of the compressed sizes buffer (varint), the sizes buffer (one varint per record)
and the concatenated records; a compressed buffer starts with its decompressed size
(varint). Every hash is Riegeli's: HighwayHash-64 under its fixed key, of a block
header's two distances, of a chunk header's other 32 bytes and of a chunk's data
(``Writer(hashes=False)`` writes zeros instead, as this writer once did: files that
XProf's server reads as empty and the reader refuses).

This is independent of ``exporter.profiles.riegeli``: it builds the physical file by
walking byte positions, inserting a block header whenever the position reaches a block
boundary, and checks that the chunk ends where the spec's formula says it must.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import brotli

from exporter.profiles.highwayhash import riegeli_hash
from exporter.proto import xplane_pb2

BLOCK = 1 << 16
BLOCK_HEADER = 24
CHUNK_HEADER = 40
USABLE = BLOCK - BLOCK_HEADER

# The spec prints the first 64 bytes of every file (hashes included).
SIGNATURE = bytes.fromhex(
    "83af70d10d884a3f0000000000000000"
    "400000000000000091bac23c9287e1a9"
    "0000000000000000e19f13c0e9b1c372"
    "73000000000000000000000000000000"
)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def spec_chunk_end(begin: int, data_size: int, num_records: int) -> int:
    """``chunk_end`` as the spec's implementation notes compute it."""
    overhead = (CHUNK_HEADER + data_size + (begin + USABLE - 1) % BLOCK) // USABLE
    with_overhead = begin + CHUNK_HEADER + data_size + overhead * BLOCK_HEADER
    remaining = BLOCK - 1 - (begin + num_records + BLOCK - 1) % BLOCK
    boundary = begin + num_records + max(0, remaining - (USABLE - 1))
    return max(with_overhead, boundary)


def rehash_chunk_header(buf: bytearray, begin: int) -> None:
    """Recompute the header_hash of the chunk header at ``begin`` (not across a block)."""
    buf[begin : begin + 8] = riegeli_hash(bytes(buf[begin + 8 : begin + 40])).to_bytes(8, "little")


def compress_block(raw: bytes, compression: str) -> bytes:
    if compression == "none":
        return raw
    if compression == "brotli":
        return varint(len(raw)) + brotli.compress(raw, quality=6)
    raise ValueError(compression)


def simple_chunk_data(records: Sequence[bytes], compression: str = "brotli") -> bytes:
    byte = {"none": b"\x00", "brotli": b"b"}[compression]
    sizes = compress_block(b"".join(varint(len(r)) for r in records), compression)
    values = compress_block(b"".join(records), compression)
    return byte + varint(len(sizes)) + sizes + values


class Writer:
    """Builds a Riegeli/records file in memory."""

    def __init__(self, signature: bool = True, *, hashes: bool = True) -> None:
        self.buf = bytearray()
        self.hashes = hashes
        if signature:
            self.buf += SIGNATURE

    def _block_header(self, chunk_begin: int, chunk_end: int) -> None:
        block = len(self.buf)
        distances = (block - chunk_begin).to_bytes(8, "little")
        distances += (chunk_end - block).to_bytes(8, "little")
        self.buf += self._hash(distances) + distances

    def _hash(self, data: bytes) -> bytes:
        return (riegeli_hash(data) if self.hashes else 0).to_bytes(8, "little")

    def _put(self, logical: bytes, chunk_begin: int, chunk_end: int) -> None:
        at = 0
        while at < len(logical):
            if len(self.buf) % BLOCK == 0:
                self._block_header(chunk_begin, chunk_end)
            room = BLOCK - len(self.buf) % BLOCK
            piece = logical[at : at + room]
            self.buf += piece
            at += len(piece)

    def chunk(
        self, chunk_type: bytes, data: bytes, num_records: int = 0, decoded_size: int = 0
    ) -> tuple[int, int]:
        """Append one chunk; returns its (begin, end) positions."""
        begin = len(self.buf)
        end = spec_chunk_end(begin, len(data), num_records)
        rest = (
            len(data).to_bytes(8, "little")
            + self._hash(data)  # data_hash
            + chunk_type
            + num_records.to_bytes(7, "little")
            + decoded_size.to_bytes(8, "little")
        )
        header = self._hash(rest) + rest  # header_hash first
        self._put(header + data, begin, end)
        while len(self.buf) < end:  # the chunk's padding
            if len(self.buf) % BLOCK == 0:
                self._block_header(begin, end)
            room = min(BLOCK - len(self.buf) % BLOCK, end - len(self.buf))
            self.buf += bytes(room)
        assert len(self.buf) == end, (len(self.buf), end)
        return begin, end

    def records(self, records: Sequence[bytes], compression: str = "brotli") -> tuple[int, int]:
        data = simple_chunk_data(records, compression)
        return self.chunk(b"r", data, len(records), sum(len(r) for r in records))

    def pad_to_block(self) -> None:
        """A padding chunk that makes the file end on a block boundary."""
        begin = len(self.buf)
        if begin % BLOCK == 0:
            return
        target = -(-begin // BLOCK) * BLOCK
        if target - begin < CHUNK_HEADER:
            target += BLOCK
        for data_size in range(target - begin - CHUNK_HEADER, -1, -1):
            if spec_chunk_end(begin, data_size, 0) == target:
                self.chunk(b"p", bytes(data_size))
                return
        raise AssertionError("no padding chunk size ends on the boundary")

    def getvalue(self) -> bytes:
        return bytes(self.buf)


def write_file(
    path: Path,
    records: Iterable[bytes],
    *,
    compression: str = "brotli",
    per_chunk: int = 1,
    pad: bool = True,
    hashes: bool = True,
) -> bytes:
    """Write ``records``, ``per_chunk`` to a chunk; returns the bytes written."""
    writer = Writer(hashes=hashes)
    batch: list[bytes] = []
    for record in records:
        batch.append(record)
        if len(batch) == per_chunk:
            writer.records(batch, compression)
            batch = []
    if batch:
        writer.records(batch, compression)
    if pad:
        writer.pad_to_block()
    data = writer.getvalue()
    path.write_bytes(data)
    return data


def chunk_xspace(space: xplane_pb2.XSpace, max_events: int) -> list[bytes]:
    """Cut ``space`` as ``DestructiveChunkXSpace`` does, by event count instead of bytes.

    First the space without planes, then per plane its header (metadata and stats, no
    lines), then pieces with copies of that header and a share of the lines; a line of
    more than ``max_events`` events is cut into pieces with its id, name and timestamp.
    """
    head = xplane_pb2.XSpace()
    head.CopyFrom(space)
    del head.planes[:]
    out = [head.SerializeToString()]
    for plane in space.planes:
        base = xplane_pb2.XPlane()
        base.CopyFrom(plane)
        del base.lines[:]
        out.append(xplane_pb2.XSpace(planes=[base]).SerializeToString())
        piece = xplane_pb2.XPlane()
        piece.CopyFrom(base)
        count = 0
        for line in plane.lines:
            for start in range(0, max(1, len(line.events)), max_events):
                part = piece.lines.add()
                part.CopyFrom(line)
                del part.events[:]
                part.events.extend(line.events[start : start + max_events])
                count += len(part.events)
                if count >= max_events:
                    out.append(xplane_pb2.XSpace(planes=[piece]).SerializeToString())
                    piece = xplane_pb2.XPlane()
                    piece.CopyFrom(base)
                    count = 0
        if piece.lines:
            out.append(xplane_pb2.XSpace(planes=[piece]).SerializeToString())
    return out
