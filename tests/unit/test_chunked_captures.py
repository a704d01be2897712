"""XProf's chunked captures (.xplane.riegeli) read like the one XSpace they merge into.

The same synthetic TPU capture is written as one ``.xplane.pb`` and as a Riegeli file of
XSpace chunks (cut as XProf's ``DestructiveChunkXSpace`` cuts them), and every way into
the product gives the same answer for both: the flame graph CLI, a session directory
holding only the chunked file, the analysis report and a comparison of one against the
other. A damaged chunked file is refused in one line, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.cli import main
from exporter.errors import InputError
from exporter.profiles.capture_files import find_captures, is_capture_name
from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture
from exporter.testing.synthetic import tpu_capture
from tests import riegeli_writer as rw

SHAPE = {"devices": 2, "steps": 6, "ops_per_step": 400, "distinct_ops": 80}


def _leaves(graph: object) -> dict[tuple[str, ...], int]:
    return {
        tuple(f.name for f in (*ancestors, node)): node.self_value
        for ancestors, node in graph.paths()  # type: ignore[attr-defined]
        if node.self_value
    }


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """(the .xplane.pb, the same capture as .xplane.riegeli), each in its own session."""
    space = tpu_capture(**SHAPE).space
    plain = tmp_path / "plain" / "tpu-vm-0.xplane.pb"
    chunked = tmp_path / "chunked" / "tpu-vm-0.xplane.riegeli"
    plain.parent.mkdir()
    chunked.parent.mkdir()
    plain.write_bytes(space.SerializeToString())
    records = rw.chunk_xspace(space, 500)
    assert len(records) > 10  # planes cut into pieces, lines split across records
    rw.write_file(chunked, records, per_chunk=3)
    return plain, chunked


def test_the_graphs_are_the_ones_of_the_plain_capture(pair: tuple[Path, Path]) -> None:
    plain, chunked = pair
    with load_capture(plain) as a, load_capture(chunked) as b:
        assert _leaves(device_flamegraph(b)) == _leaves(device_flamegraph(a))
        assert _leaves(host_flamegraph(b)) == _leaves(host_flamegraph(a))
        assert b.time_range() == a.time_range()


def test_sessions_find_chunked_captures(pair: tuple[Path, Path]) -> None:
    plain, chunked = pair
    assert is_capture_name(chunked.name) and is_capture_name(plain.name)
    assert find_captures(chunked.parent) == [chunked]
    folded = {}
    for path in (plain.parent, chunked.parent):  # a session directory
        done = CliRunner().invoke(main, ["flamegraph", str(path)])
        assert done.exit_code == 0, done.output
        folded[path] = sorted(done.output.splitlines())
    assert folded[plain.parent] == folded[chunked.parent]


def test_the_report_and_the_comparison_agree(pair: tuple[Path, Path]) -> None:
    plain, chunked = pair
    reports = []
    for path in (plain, chunked.parent):
        done = CliRunner().invoke(main, ["analyze", str(path), "--no-xprof", "--format", "json"])
        assert done.exit_code == 0, done.output
        reports.append(json.loads(done.output[done.output.index("{") :]))
    a, b = (r["facts"] for r in reports)
    assert a["steps"] == b["steps"] and a["breakdown"] == b["breakdown"]
    assert a["top_ops"] == b["top_ops"]
    compared = CliRunner().invoke(main, ["compare", str(plain), str(chunked), "--format", "json"])
    assert compared.exit_code == 0, compared.output
    verdict = json.loads(compared.output[compared.output.index("{") :])["step_verdict"]
    assert verdict["verdict"] == "unchanged" and verdict["change_pct"] == 0, verdict


def test_a_damaged_chunked_capture_is_refused_naming_it(pair: tuple[Path, Path]) -> None:
    _, chunked = pair
    data = chunked.read_bytes()
    chunked.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"tpu-vm-0\.xplane\.riegeli"):
        load_capture(chunked)
    done = CliRunner().invoke(main, ["flamegraph", str(chunked)])
    assert done.exit_code == 1
    assert "Traceback" not in done.output
    assert len(done.output.strip().splitlines()) == 1, done.output
