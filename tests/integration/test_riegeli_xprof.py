"""Chunked captures (``.xplane.riegeli``) from the test writer are files XProf reads.

XProf's own server (``tests/xprof_server.py``) serves one logdir holding the same
synthetic TPU capture as ``.xplane.pb`` and as ``.xplane.riegeli`` in each shape the
writer (``tests/riegeli_writer.py``) makes: several brotli chunks with lines split across
records, uncompressed chunks spanning blocks with padding chunks between them, and
whole padded files appended one after another (what ``SaveXSpaceChunk`` does per call).
Each Riegeli run must give the trace viewer's events and op_profile's totals of the
``.xplane.pb`` run, and ``mlprof flamegraph`` the same folded graph and total.

XProf reads Riegeli with a recovery callback that skips what fails its checks: a file
whose hashes are wrong (zeros, as the writer once wrote them) reads as an empty session
there (0 trace events, op_profile ``rawTime`` 0), so this test is what holds the
writer's hashes, and so the reader's verification of them, to the Riegeli library's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from exporter.cli import main
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import tpu_capture
from tests import riegeli_writer as rw
from tests.xprof_server import XProfServer, xprof_server

pytestmark = pytest.mark.integration

HOST = "tpu-vm-0"
# A fixed start: the capture is built twice and must come out the same.
SHAPE = {
    "devices": 2,
    "steps": 4,
    "ops_per_step": 400,
    "distinct_ops": 80,
    "start_ns": 1_700_000_000 * 10**9,
}


def _several_chunks(records: list[bytes]) -> bytes:
    writer = rw.Writer()
    for start in range(0, len(records), 3):
        writer.records(records[start : start + 3], "brotli")
    writer.pad_to_block()
    return writer.getvalue()


def _padding_between_big_chunks(records: list[bytes]) -> bytes:
    writer = rw.Writer()
    half = len(records) // 2
    writer.records(records[:half], "none")  # one chunk across several blocks
    writer.chunk(b"p", bytes(1000))
    writer.records(records[half:], "none")
    writer.pad_to_block()
    return writer.getvalue()


def _appended_files(records: list[bytes]) -> bytes:
    out = bytearray()
    for record in records:  # SaveXSpaceChunk: a whole padded file per call
        writer = rw.Writer()
        writer.records([record], "brotli")
        writer.pad_to_block()
        out += writer.getvalue()
    return bytes(out)


SHAPES: dict[str, Callable[[list[bytes]], bytes]] = {
    "several_chunks": _several_chunks,
    "padding_between_big_chunks": _padding_between_big_chunks,
    "appended_files": _appended_files,
}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("riegeli-xprof")
    space = tpu_capture(**SHAPE).space
    records = rw.chunk_xspace(space, 300)
    assert len(records) > 15  # planes cut into pieces, lines split across records
    for run, write in {"plain": None, **SHAPES}.items():
        folder = root / "logdir" / "plugins" / "profile" / run
        folder.mkdir(parents=True)
        if write is None:
            (folder / f"{HOST}.xplane.pb").write_bytes(space.SerializeToString())
            continue
        data = write(records)
        assert len(data) % rw.BLOCK == 0  # padded to the block, as XProf's writer pads
        if run == "padding_between_big_chunks":
            assert len(data) > rw.BLOCK  # chunks interrupted by block headers
        (folder / f"{HOST}.xplane.riegeli").write_bytes(data)
    return root


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[XProfServer]:
    with xprof_server(logdir / "logdir", logdir / "server") as running:
        yield running


def _trace_events(server: XProfServer, run: str) -> tuple[int, Counter[tuple[Any, ...]]]:
    answer = server.data(run, "trace_viewer@", HOST)
    events = answer["traceEvents"]
    complete = Counter(
        (e.get("pid"), e.get("name"), e.get("ts"), e.get("dur"))
        for e in events
        if e.get("ph") == "X"
    )
    assert answer["returnedEventsSize"] == len(complete)
    return len(complete), complete


def _op_profile(server: XProfServer, run: str) -> dict[str, Any]:
    answer = server.data(run, "op_profile", HOST)
    totals: dict[str, Any] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        metrics = node.get("metrics", {})
        totals[path] = (metrics.get("rawTime"), metrics.get("rawFlops"))
        for child in node.get("children", []):
            walk(child, f"{path}/{child.get('name')}")

    for view in ("byProgram", "byProgramExcludeIdle"):
        walk(answer[view], view)
    return totals


def _flamegraph(folder: Path, out: Path) -> tuple[list[str], int]:
    done = CliRunner().invoke(main, ["flamegraph", str(folder), "-o", str(out)])
    assert done.exit_code == 0, done.output
    total = re.search(r"= (\d+) nanoseconds", done.output)
    assert total, done.output
    return sorted(out.read_text().splitlines()), int(total.group(1))


def test_xprof_reads_the_plain_capture(server: XProfServer) -> None:
    assert set(server.get("runs")) == {"plain", *SHAPES}
    count, _ = _trace_events(server, "plain")
    assert count > 5000
    assert _op_profile(server, "plain")["byProgramExcludeIdle"][0] > 0


@pytest.mark.parametrize("run", SHAPES)
def test_xprof_reads_the_chunked_capture_as_the_plain_one(
    server: XProfServer, logdir: Path, run: str
) -> None:
    want_count, want_events = _trace_events(server, "plain")
    got_count, got_events = _trace_events(server, run)
    # Before the writer computed Riegeli's hashes: 0 events here, rawTime 0 below.
    assert got_count == want_count
    assert got_events == want_events
    assert _op_profile(server, run) == _op_profile(server, "plain")
    profile = logdir / "logdir" / "plugins" / "profile"
    folded, total = _flamegraph(profile / run, logdir / f"{run}.folded")
    assert (folded, total) == _flamegraph(profile / "plain", logdir / "plain.folded")
    # The three readers agree on the device time: op_profile's picoseconds, ours in ns.
    raw_time_ps = _op_profile(server, run)["byProgramExcludeIdle"][0]
    assert total * 1000 == raw_time_ps


def test_the_chunked_files_hold_the_capture(logdir: Path) -> None:
    # The shapes are what they say: records come back whole from every file.
    from exporter.profiles.riegeli import iter_records

    space = tpu_capture(**SHAPE).space
    records = rw.chunk_xspace(space, 300)
    for run in SHAPES:
        path = logdir / "logdir" / "plugins" / "profile" / run / f"{HOST}.xplane.riegeli"
        assert list(iter_records(path)) == records
    assert xplane_pb2.XSpace.FromString(records[0]).hostnames == space.hostnames
