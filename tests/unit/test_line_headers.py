"""A long line's header is read once per capture: its fields follow the events, so each
read scans the whole line, and an analysis of a GPU capture asked for the headers of its
20 MB stream lines 20 times (0.05 s of its 0.49 s of facts on 500 k kernels)."""

from __future__ import annotations

from exporter.profiles.xspace import Capture, line_header, line_headers, parse_xspace, use_decoder
from exporter.proto import xplane_pb2


def _space() -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/device:GPU:0")
    long = plane.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=5)
    for i in range(20_000):  # about 200 kB: past the bound, remembered
        long.events.add(metadata_id=1, offset_ps=i * 10, duration_ps=5)
    long.duration_ps = 123  # written after the events, as protobuf orders fields
    plane.lines.add(id=8, name="short", timestamp_ns=6).events.add(metadata_id=1)
    return space


def _counted(data: bytes) -> tuple[Capture, list[tuple[int, int]]]:
    """A capture whose reads (offset, length) are recorded."""
    capture = parse_xspace(data, "x")
    reads: list[tuple[int, int]] = []
    read = capture.read

    def counting(start: int, length: int) -> bytes:
        reads.append((start, length))
        return read(start, length)

    capture.read = counting
    return capture, reads


def test_a_long_lines_header_is_read_once_per_capture() -> None:
    data = _space().SerializeToString()
    for decoder in ("compiled", "python"):
        with use_decoder(decoder):
            other = parse_xspace(data, "x")
            fresh = line_headers(other, other.plane(other.planes[0]))
            capture, reads = _counted(data)
            plane = capture.plane(capture.planes[0])
            (long_start, long_end), short = plane.lines.span(0), plane.lines.span(1)
            first = line_headers(capture, plane)
            again = line_headers(capture, capture.plane(capture.planes[0]))
            assert line_header(capture, plane, 0) == first[0]
            assert first == again == fresh
            assert first[0].duration_ps == 123 and first[0].name == "Stream #7(Compute)"
            inside = sum(n for at, n in reads if long_start <= at < long_end)
            assert long_end - long_start > 1 << 16
            assert inside == long_end - long_start, decoder  # once, not three times
            assert sum(n for at, n in reads if at == short[0]) == 2 * (short[1] - short[0])
