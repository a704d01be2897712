"""XProf's chunked captures (.xplane.riegeli): records read back, merged as XProf merges.

Test files come from tests/riegeli_writer.py (written from the Riegeli/records spec);
the merge is checked against ``_xprof_merge`` below, a transcription of XProf's
``MergeXSpace`` over protobuf objects (``xla/tsl/profiler/utils``, first in
``xprof/convert/repository.cc``), independent of the streaming merge under test.
"""

from __future__ import annotations

import io
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import brotli
import pytest

from exporter.errors import InputError
from exporter.profiles.capture_files import CHUNKED_SUFFIX
from exporter.profiles.riegeli import iter_records, write_xspace
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture
from tests import riegeli_writer as rw

T = TypeVar("T")


# -- a reference merge and a chunker, in the shape XProf's writer and reader have --------
def _remap(source: Any, target: Any) -> dict[int, int]:
    """``BuildSingleMetadataMap``: source ids to target ids by name, new names added."""
    by_name: dict[str, int] = {}
    next_id = 0
    for key in sorted(target):
        if target[key].name:
            by_name[target[key].name] = key
        next_id = max(next_id, key + 1)
    ids = {}
    for key in sorted(source):
        meta = source[key]
        if not meta.name:
            ids[key] = key
            continue
        if meta.name not in by_name:
            by_name[meta.name] = next_id
            target[next_id].CopyFrom(meta)
            next_id += 1
        ids[key] = by_name[meta.name]
    return ids


def _remap_event(event: xplane_pb2.XEvent, events: dict[int, int], stats: dict[int, int]) -> None:
    event.metadata_id = events.get(event.metadata_id, event.metadata_id)
    for stat in event.stats:
        stat.metadata_id = stats.get(stat.metadata_id, stat.metadata_id)


def _merge_plane(src: xplane_pb2.XPlane, dst: xplane_pb2.XPlane) -> None:
    events = _remap(src.event_metadata, dst.event_metadata)
    stats = _remap(src.stat_metadata, dst.stat_metadata)
    to_lines = {line.id: line for line in dst.lines}
    for line in reversed(src.lines):
        target = to_lines.get(line.id)
        if target is None:
            new = dst.lines.add()
            new.CopyFrom(line)
            for event in new.events:
                _remap_event(event, events, stats)
            continue
        piece = xplane_pb2.XLine.FromString(line.SerializeToString())
        if piece.timestamp_ns < target.timestamp_ns:
            for event in target.events:
                event.offset_ps += (target.timestamp_ns - piece.timestamp_ns) * 1000
            target.timestamp_ns = piece.timestamp_ns
        elif piece.timestamp_ns > target.timestamp_ns:
            for event in piece.events:
                event.offset_ps += (piece.timestamp_ns - target.timestamp_ns) * 1000
        for event in piece.events:
            _remap_event(event, events, stats)
            target.events.add().CopyFrom(event)
        target.duration_ps = max(target.duration_ps, piece.duration_ps)
    existing = {stat.metadata_id for stat in dst.stats}
    for stat in src.stats:
        remapped = stats.get(stat.metadata_id, stat.metadata_id)
        if remapped not in existing:
            existing.add(remapped)
            new_stat = dst.stats.add()
            new_stat.CopyFrom(stat)
            new_stat.metadata_id = remapped


def _xprof_merge(records: list[bytes]) -> xplane_pb2.XSpace:
    merged = xplane_pb2.XSpace.FromString(records[0])
    for raw in records[1:]:
        src = xplane_pb2.XSpace.FromString(raw)
        for name in ("hostnames", "errors", "warnings"):
            seen = set(getattr(merged, name))
            for value in getattr(src, name):
                if value not in seen:
                    seen.add(value)
                    getattr(merged, name).append(value)
        to_planes = {plane.name: plane for plane in merged.planes}
        for plane in reversed(src.planes):
            if plane.name in to_planes:
                _merge_plane(plane, to_planes[plane.name])
            else:
                merged.planes.add().CopyFrom(plane)
    return merged


def _merged(path: Path) -> xplane_pb2.XSpace:
    out = io.BytesIO()
    written = write_xspace(path, out)
    assert written == len(out.getvalue())
    return xplane_pb2.XSpace.FromString(out.getvalue())


def _sorted_lines(space: xplane_pb2.XSpace) -> dict[str, list[bytes]]:
    return {
        plane.name: sorted(line.SerializeToString(deterministic=True) for line in plane.lines)
        for plane in space.planes
    }


def _traced(work: Callable[[], T]) -> tuple[T, int]:
    """``work()`` and the peak of Python memory allocated while it ran."""
    tracemalloc.start()
    try:
        result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


# -- records ----------------------------------------------------------------------------
@pytest.mark.parametrize("compression", ["brotli", "none"])
def test_records_come_back_exactly(tmp_path: Path, compression: str) -> None:
    records = rw.chunk_xspace(tpu_capture(devices=2, steps=3, ops_per_step=500).space, 400)
    records[3:3] = [b"", b"\x00" * 70_000, bytes(range(256))]
    path = tmp_path / f"host{CHUNKED_SUFFIX}"
    data = rw.write_file(path, records, compression=compression, per_chunk=3)
    assert len(data) % rw.BLOCK == 0
    assert list(iter_records(path)) == records


@pytest.mark.parametrize("compression", ["brotli", "none"])
def test_a_record_across_many_blocks(tmp_path: Path, compression: str) -> None:
    big = tpu_capture(devices=4, steps=10, ops_per_step=600).space.SerializeToString()
    noise = random.Random(1).randbytes(300_000)  # brotli cannot shrink it
    path = tmp_path / "big.xplane.riegeli"
    data = rw.write_file(path, [big, noise, b"tail"], compression=compression, per_chunk=1)
    assert len(data) > 5 * rw.BLOCK
    assert list(iter_records(path)) == [big, noise, b"tail"]


def test_a_chunk_header_cut_by_a_block_header(tmp_path: Path) -> None:
    for filler in range(65_300, 65_500):
        writer = rw.Writer()
        writer.records([b"x" * filler], "none")
        if rw.BLOCK - 40 < len(writer.buf) < rw.BLOCK:  # the next header straddles
            break
    else:
        raise AssertionError("no filler size puts a chunk header across the boundary")
    begin, _ = writer.records([b"after the boundary", b"second"], "none")
    assert begin < rw.BLOCK < begin + rw.CHUNK_HEADER
    path = tmp_path / "split.xplane.riegeli"
    path.write_bytes(writer.getvalue())
    assert list(iter_records(path)) == [b"x" * filler, b"after the boundary", b"second"]


def test_padding_metadata_and_appended_files_are_read_through(tmp_path: Path) -> None:
    first = rw.Writer()
    first.records([b"one", b"two"])
    first.chunk(b"m", b"\x00serialized RecordsMetadata, skipped")
    first.chunk(b"p", bytes(100))
    first.records([b"three"], "none")
    first.pad_to_block()
    second = rw.Writer()  # SaveXSpaceChunk appends a whole padded file per call
    second.records([b"four"])
    second.pad_to_block()
    path = tmp_path / "appended.xplane.riegeli"
    path.write_bytes(first.getvalue() + second.getvalue())
    assert list(iter_records(path)) == [b"one", b"two", b"three", b"four"]


def test_reading_keeps_about_one_chunk_in_memory(tmp_path: Path) -> None:
    rng = random.Random(2)
    records = [rng.randbytes(200_000) for _ in range(12)]
    path = tmp_path / "many.xplane.riegeli"
    rw.write_file(path, records, per_chunk=1)  # 2.4 MB of records
    count, peak = _traced(lambda: sum(1 for _ in iter_records(path)))
    assert count == 12
    assert peak < 1_200_000


# -- the merged XSpace --------------------------------------------------------------------
def test_a_chunked_capture_merges_back_like_xprof(tmp_path: Path) -> None:
    space = tpu_capture(devices=2, steps=4, ops_per_step=800, distinct_ops=150).space
    records = rw.chunk_xspace(space, 700)
    assert len(records) > 8
    path = tmp_path / "tpu-vm-0.xplane.riegeli"
    rw.write_file(path, records, per_chunk=2)
    merged = _merged(path)
    assert merged == _xprof_merge(records)
    # XProf appends later lines in reverse, otherwise the capture comes back whole.
    assert [p.name for p in merged.planes] == [p.name for p in space.planes]
    assert _sorted_lines(merged) == _sorted_lines(space)
    for got, want in zip(merged.planes, space.planes, strict=True):
        assert dict(got.event_metadata) == dict(want.event_metadata)
        assert list(got.stats) == list(want.stats)


def _renumber_stats(plane: xplane_pb2.XPlane, offset: int) -> None:
    old = dict(plane.stat_metadata)
    plane.ClearField("stat_metadata")
    for key, meta in old.items():
        plane.stat_metadata[key + offset].CopyFrom(meta)
        plane.stat_metadata[key + offset].id = key + offset
    for stat in plane.stats:
        stat.metadata_id += offset
    for line in plane.lines:
        for event in line.events:
            for stat in event.stats:
                stat.metadata_id += offset


def test_windows_with_other_metadata_ids_and_times_merge_like_xprof(tmp_path: Path) -> None:
    early = tpu_capture(devices=2, steps=2, ops_per_step=300, distinct_ops=80, seed=1)
    late = tpu_capture(  # two more devices: new planes, appended from the record's end
        devices=4, steps=2, ops_per_step=300, distinct_ops=120, seed=2, hostname="tpu-vm-1"
    )
    for index, line in enumerate(line for p in early.space.planes for line in p.lines):
        line.duration_ps = 50_000 + index
    for index, line in enumerate(line for p in late.space.planes for line in p.lines):
        # Both directions of MergeLine: before and after the early window's lines.
        line.timestamp_ns += 10**10 if index % 2 else -(10**10)
        line.duration_ps = 100_000 if index % 3 else 1_000
    _renumber_stats(late.space.planes[2], 100)  # stat ids that must be remapped
    unnamed = late.space.planes[1]  # an unnamed metadata entry keeps its id, uncopied
    unnamed.event_metadata[9_999].id = 9_999
    unnamed.lines[0].events[0].metadata_id = 9_999
    late.space.warnings.append("a warning")
    late.space.hostnames.append("tpu-vm-0")  # already there: not added again
    records = [early.space.SerializeToString(), late.space.SerializeToString()]
    path = tmp_path / "windows.xplane.riegeli"
    rw.write_file(path, records)
    merged = _merged(path)
    want = _xprof_merge(records)
    assert merged == want
    assert list(merged.hostnames) == ["tpu-vm-0", "tpu-vm-1"]
    names = [p.name for p in merged.planes]
    assert names[-2:] == ["/device:TPU:3", "/device:TPU:2"]
    device = next(p for p in merged.planes if p.name == "/device:TPU:0")
    # The later window's new op names got new ids, so the events were remapped.
    assert len(device.event_metadata) > len(early.space.planes[1].event_metadata)


def test_a_plane_seen_once_is_copied_as_it_is(tmp_path: Path) -> None:
    space = tpu_capture(devices=1, steps=2, ops_per_step=200).space
    path = tmp_path / "one.xplane.riegeli"
    rw.write_file(path, [space.SerializeToString()])
    assert _merged(path) == space


# -- hostile files ------------------------------------------------------------------------
def _expect_input_error(path: Path, *, merge: bool = False) -> str:
    with pytest.raises(InputError) as caught:
        if merge:
            write_xspace(path, io.BytesIO())
        else:
            list(iter_records(path))
    message = str(caught.value)
    assert message.startswith(str(path))
    assert "\n" not in message
    return message


@pytest.fixture
def sample(tmp_path: Path) -> tuple[Path, bytes]:
    records = rw.chunk_xspace(tpu_capture(devices=2, steps=3, ops_per_step=500).space, 500)
    path = tmp_path / "sample.xplane.riegeli"
    data = rw.write_file(path, [*records, random.Random(3).randbytes(150_000)], per_chunk=2)
    assert len(data) > 3 * rw.BLOCK
    return path, data


def test_truncated_files_are_refused(sample: tuple[Path, bytes], tmp_path: Path) -> None:
    _, data = sample
    cut = tmp_path / "cut.xplane.riegeli"
    for size in (0, 1, 63, 64 + 20, 64 + 45, 5_000, rw.BLOCK + 10, len(data) // 2, len(data) - 1):
        cut.write_bytes(data[:size])
        _expect_input_error(cut)


def test_flipped_header_bytes_are_refused(sample: tuple[Path, bytes], tmp_path: Path) -> None:
    _, data = sample
    bad = tmp_path / "flipped.xplane.riegeli"
    chunk = 64  # the first data chunk's header: every byte, hashes included
    offsets = list(range(chunk, chunk + 40))
    offsets += range(rw.BLOCK, rw.BLOCK + 24)  # a block header: hash and distances
    offsets += [0, 20, 40]  # the signature
    for offset in offsets:
        for mask in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[offset] ^= mask
            bad.write_bytes(flipped)
            _expect_input_error(bad)


def test_a_chunk_claiming_two_to_the_sixtieth_bytes(tmp_path: Path) -> None:
    writer = rw.Writer()
    writer.records([b"record"])
    data = bytearray(writer.getvalue())
    data[64 + 8 : 64 + 16] = (1 << 60).to_bytes(8, "little")
    rw.rehash_chunk_header(data, 64)  # a header consistent with itself: sizes checked
    path = tmp_path / "huge.xplane.riegeli"
    path.write_bytes(data)
    message, peak = _traced(lambda: _expect_input_error(path))
    assert "past the file's end" in message
    assert peak < 1_000_000


def test_a_decompression_bomb_stops_at_the_declared_size(tmp_path: Path) -> None:
    sizes = rw.compress_block(rw.varint(1000), "brotli")
    values = rw.varint(1000) + brotli.compress(bytes(16 << 20), quality=6)
    writer = rw.Writer()
    writer.chunk(b"r", b"b" + rw.varint(len(sizes)) + sizes + values, 1, 1000)
    path = tmp_path / "bomb.xplane.riegeli"
    path.write_bytes(writer.getvalue())
    message, peak = _traced(lambda: _expect_input_error(path))
    assert "declared size" in message
    assert peak < 2_000_000


def test_record_sizes_must_match_the_header(tmp_path: Path) -> None:
    writer = rw.Writer()
    writer.chunk(b"r", rw.simple_chunk_data([b"ab", b"cd"], "none"), 1, 4)
    path = tmp_path / "sizes.xplane.riegeli"
    path.write_bytes(writer.getvalue())
    assert "record sizes do not match the header" in _expect_input_error(path)


def test_decoded_sizes_over_the_bound_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bound.xplane.riegeli"
    rw.write_file(path, [b"x" * 5000])
    with pytest.raises(InputError, match="over the bound of 1000"):
        list(iter_records(path, max_chunk_bytes=1000))
    assert list(iter_records(path, max_chunk_bytes=5000)) == [b"x" * 5000]


def test_random_bytes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "random.xplane.riegeli"
    rng = random.Random(4)
    for trial in range(40):
        noise = rng.randbytes(rng.randrange(0, 150_000))
        path.write_bytes(rw.SIGNATURE + noise if trial % 2 else noise)
        _expect_input_error(path)


@pytest.mark.parametrize(
    ("chunk_type", "data", "expected"),
    [
        (b"t", b"\x00anything", "transposed chunk"),
        (b"q", b"", "unknown chunk type 0x71"),
        (b"r", b"z\x00", "zstd-compressed"),
        (b"r", b"\x07\x00", "unknown compression type 0x07"),
    ],
)
def test_chunks_it_does_not_read_are_named(
    tmp_path: Path, chunk_type: bytes, data: bytes, expected: str
) -> None:
    writer = rw.Writer()
    writer.records([b"fine"])
    writer.chunk(chunk_type, data, 1, 1)
    path = tmp_path / "other.xplane.riegeli"
    path.write_bytes(writer.getvalue())
    assert expected in _expect_input_error(path)


def test_records_that_are_not_xspaces_and_empty_files(tmp_path: Path) -> None:
    path = tmp_path / "junk.xplane.riegeli"
    rw.write_file(path, [b"\xff\xff\xff"])
    assert "record 0 is not a serialized XSpace" in _expect_input_error(path, merge=True)
    path.write_bytes(rw.SIGNATURE)
    assert list(iter_records(path)) == []
    assert "no records" in _expect_input_error(path, merge=True)
    assert "cannot open" in _expect_input_error(tmp_path / "missing.xplane.riegeli")


# -- hashes -------------------------------------------------------------------------------
def test_files_without_hashes_are_refused_naming_the_chunk(tmp_path: Path) -> None:
    # What this writer made before it computed hashes: XProf's server reads such a file
    # as an empty session; here it is refused at its first chunk.
    path = tmp_path / "zeros.xplane.riegeli"
    rw.write_file(path, [b"one", b"two"], hashes=False)
    message = _expect_input_error(path)
    assert "chunk at byte 64: header_hash 0x0000000000000000 is not the hash" in message
    assert "without Riegeli's hashes" in message


def test_a_damaged_chunk_is_refused_before_any_of_its_records(tmp_path: Path) -> None:
    writer = rw.Writer()
    writer.records([b"first chunk"], "none")
    begin, _ = writer.records([b"x" * 100_000, b"second"], "none")  # crosses a block
    data = bytearray(writer.getvalue())
    data[begin + 40 + 50_000] ^= 0x04  # a record byte; sizes and headers intact
    path = tmp_path / "damaged.xplane.riegeli"
    path.write_bytes(data)
    got: list[bytes] = []
    with pytest.raises(InputError) as caught:
        got.extend(iter_records(path))
    assert got == [b"first chunk"]
    assert f"chunk at byte {begin}: data_hash 0x" in str(caught.value)
    assert "is not the hash of its 100" in str(caught.value)


def test_a_damaged_block_header_is_named(sample: tuple[Path, bytes], tmp_path: Path) -> None:
    _, data = sample
    flipped = bytearray(data)
    flipped[rw.BLOCK + 3] ^= 0x10  # its header_hash
    path = tmp_path / "block.xplane.riegeli"
    path.write_bytes(flipped)
    assert f"block header at byte {rw.BLOCK}: header_hash" in _expect_input_error(path)


@pytest.mark.parametrize("pure", [False, True])
def test_both_hash_implementations_read_the_same(
    sample: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch, pure: bool
) -> None:
    from exporter.profiles import highwayhash

    if pure:  # what a build without a compiler verifies with
        monkeypatch.setattr(highwayhash, "_compiled", None)
    path, _ = sample
    records = list(iter_records(path))
    assert len(records) > 5
    flipped = bytearray(path.read_bytes())
    flipped[200] ^= 0x01  # inside the first chunk's data
    path.write_bytes(flipped)
    assert "data_hash" in _expect_input_error(path)


def test_the_cli_refuses_a_file_without_hashes_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from exporter.cli import main

    space = tpu_capture(devices=1, steps=2, ops_per_step=100).space
    path = tmp_path / "tpu-vm-0.xplane.riegeli"
    rw.write_file(path, rw.chunk_xspace(space, 100), hashes=False)
    done = CliRunner().invoke(main, ["flamegraph", str(path), "-o", str(tmp_path / "f")])
    assert done.exit_code == 1
    assert done.output.count("\n") == 1 and "Traceback" not in done.output
    assert f"{path}: not a readable Riegeli/records file: chunk at byte 64: header_hash" in (
        done.output
    )
