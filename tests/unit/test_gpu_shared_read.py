"""One read of a GPU stream line for the device flame graph and the kernel facts (issue
33): the kernel reader is the capture's ``stream_tap`` while the graph reads the lines,
and gives the same facts as its own read (both decoders, lines in many windows, hostile
stats); stat columns of two readers merge without giving a stat id two columns; a
plane's metadata is framed once per capture, within a bound; an analysis without a
session record does not import the session model (pydantic).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from exporter.analysis.facts.capture import gather_facts
from exporter.analysis.facts.gpu_kernels import gpu_kernel_facts, kernel_tap, read_kernels
from exporter.profiles import event_stats, xspace
from exporter.profiles.event_stats import merge_columns
from exporter.profiles.pprof import to_pprof
from exporter.profiles.xplane import device_flamegraph
from exporter.profiles.xspace import parse_xspace, use_decoder
from exporter.proto import xplane_pb2
from exporter.testing.synthetic_gpu import gpu_capture, write_gpu_capture
from tests.unit.test_event_stats import _hostile_gpu_space

ROOT = Path(__file__).resolve().parents[2]


def _separate(data: bytes) -> tuple[Any, bytes, int]:
    """Facts and graph each from its own read, and the events the reads counted."""
    capture = parse_xspace(data, "gpu")
    graph = device_flamegraph(capture)
    facts = gpu_kernel_facts([read_kernels(capture)], "gpu", top=1000)
    assert graph is not None
    return facts, to_pprof(graph).SerializeToString(deterministic=True), capture.events_read


def _shared(data: bytes) -> tuple[Any, bytes, int]:
    capture = parse_xspace(data, "gpu")
    capture.stream_tap = tap = kernel_tap(capture)
    graph = device_flamegraph(capture)
    capture.stream_tap = None
    facts = gpu_kernel_facts([read_kernels(capture, (), tap)], "gpu", top=1000)
    assert graph is not None
    return facts, to_pprof(graph).SerializeToString(deterministic=True), capture.events_read


def _stream_events(data: bytes) -> int:
    space = xplane_pb2.XSpace()
    space.ParseFromString(data)
    return sum(len(line.events) for plane in space.planes if plane.name.startswith("/device:GPU")
               for line in plane.lines)  # fmt: skip


@pytest.mark.parametrize("hostile", [False, True])
@pytest.mark.parametrize("decoder", ["python", "compiled"])
@pytest.mark.parametrize("window", [None, 300])
def test_the_tapped_read_gives_what_separate_reads_give(
    hostile: bool, decoder: str, window: int | None
) -> None:
    space = _hostile_gpu_space() if hostile else gpu_capture(steps=3, devices=2).space
    data = space.SerializeToString()
    with use_decoder(decoder), mock.patch.object(xspace, "LINE_WINDOW", window or (1 << 24)):
        facts, graph, read_twice = _separate(data)
        shared_facts, shared_graph, read_once = _shared(data)
    assert (shared_facts, shared_graph) == (facts, graph)
    assert facts["available"] and facts["kernel_count"]
    if decoder == "compiled":  # the compiled core counts what it reads
        assert read_twice - read_once == _stream_events(data)


def test_an_analysis_reads_each_gpu_stream_line_once(tmp_path: Path) -> None:
    """Before: the device flame graph and the kernel facts each read every stream line
    (a 20 MB line of 250 k kernels scanned twice)."""
    path = tmp_path / "gpu.xplane.pb"
    write_gpu_capture(path, steps=3, kernels_per_step=50, devices=2)
    reads: Counter[tuple[str, int]] = Counter()
    real = event_stats._compiled

    def counted(core: Any, plane: Any, index: int, *rest: Any) -> Any:
        reads[plane.name, index] += 1
        return real(core, plane, index, *rest)

    with use_decoder("compiled"), mock.patch.object(event_stats, "_compiled", counted):
        facts = gather_facts([path], xprof=False).to_json()
    gpu = {key: n for key, n in reads.items() if key[0].startswith("/device:GPU")}
    assert len(gpu) == 4  # two stream lines on each of two GPUs
    assert set(gpu.values()) == {1}, gpu
    assert facts["gpu_kernels"]["kernel_count"] == 3 * 50 * 2


def test_stat_columns_merge_without_giving_an_id_two_columns() -> None:
    graph = {10: 0, 11: 1, 12: 2, 13: 2}  # module, op, scope (tf_op or name_scope)
    # details, module, op, correlation, copy (memcpy or memset): module and op shared.
    merged = merge_columns(graph, 3, {20: 0, 10: 1, 11: 2, 21: 3, 22: 4, 23: 4}, 5)
    assert merged == ({10: 0, 11: 1, 12: 2, 13: 2, 20: 3, 21: 4, 22: 5, 23: 5}, 6,
                      [3, 0, 1, 4, 5])  # fmt: skip
    # A column of the other's without ids reads a new, empty column (not column 0).
    assert merge_columns(graph, 3, {11: 2}, 4) == (graph, 6, [3, 4, 1, 5])
    # The other's column holds one of a shared column's ids only: no merged read.
    assert merge_columns(graph, 3, {12: 0}, 1) is None
    assert merge_columns(graph, 3, {12: 0, 13: 0, 14: 0}, 1) is None
    assert merge_columns({}, 1, {i: i for i in range(64)}, 64) is None  # past the bound


def _metadata_plane(space: xplane_pb2.XSpace, name: str, metadata_bytes: int) -> None:
    plane = space.planes.add(id=len(space.planes) + 1, name=name)
    for i in range(1, metadata_bytes // 1000 + 1):
        plane.event_metadata[i].id = i
        plane.event_metadata[i].name = f"op_{i}_" + "x" * 1000
    plane.lines.add(id=1, name="line").events.add(metadata_id=1, offset_ps=0, duration_ps=5)


def test_a_planes_metadata_is_framed_once_within_a_bound() -> None:
    """Before: every ``Capture.plane`` framed the plane's metadata fields again (14
    times per analysis). Now a plane's metadata up to 1 MiB is kept; a larger one (a
    TPU plane's) is framed again, so it is not held."""
    space = xplane_pb2.XSpace()
    _metadata_plane(space, "small", 50_000)
    _metadata_plane(space, "large", 2_000_000)
    capture = parse_xspace(space.SerializeToString(), "x")
    real, reads = capture.read, []

    def counting(start: int, length: int) -> bytes:
        reads.append(start)
        return real(start, length)

    capture.read = counting
    for ref in capture.planes:
        first = capture.plane(ref)
        reads.clear()
        again = capture.plane(ref)
        assert bool(reads) == (ref.name == "large"), ref.name
        assert again.event_metadata == first.event_metadata
        assert again.lines[0] == first.lines[0] and len(again.lines) == 1


def test_an_analysis_without_a_session_record_does_not_import_pydantic(tmp_path: Path) -> None:
    """hosts.py imported the session record's model (pydantic, the store, fsspec) at
    import: 0.25 s of CPU in every analysis, most of a 500 k-kernel GPU capture's."""
    path = tmp_path / "gpu.xplane.pb"
    write_gpu_capture(path, steps=2, kernels_per_step=10)
    code = (
        "import sys, json; from pathlib import Path\n"
        "from exporter.analysis.facts.capture import gather_facts\n"
        f"facts = gather_facts([Path({str(path)!r})], xprof=False).to_json()\n"
        "print(json.dumps([facts['gpu_kernels']['kernel_count'], 'pydantic' in sys.modules]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)  # fmt: skip
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [20, False]
