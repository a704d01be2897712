"""A run whose sessions hold both XProf captures and torch.profiler traces.

A torch_xla workload can be captured by the sidecar (XSpace) and traced by
torch.profiler in one run. One side cannot merge the two (their frames are XLA's ops
and PyTorch's operators): a ``run:<id>`` side reads the kind most of its sessions hold
(the newest session's on a tie) and names the sessions it skipped.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter import schema
from exporter.analysis.sides.load import SideContext, expand_replicates, load_side
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.cli import main
from exporter.errors import InputError
from exporter.pipeline.torch_watcher import TorchTraceWatcher
from exporter.testing.synthetic import write_tpu_capture
from tests import kineto_traces as kt

T0 = 1.79e9
IDENTITY = {"run_id": "run-3", "workload": "trainer", "host": "gpu-a", "pid": 9,
            "trigger": "programmatic", "name": "train"}  # fmt: skip


def _traces(tmp_path: Path, store: SessionStore, count: int) -> list[str]:
    directory = tmp_path / "shared" / schema.TORCH_TRACES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    watcher = TorchTraceWatcher(tmp_path / "shared", store, clock=lambda: 0.0)
    ids = []
    for n in range(count):
        steps = [*kt.training_step(1, 0.0, 1), *kt.training_step(2, 200, 11)]
        kt.write(directory / f"t-{n}.pt.trace.json", steps)
        (directory / f"t-{n}.json").write_text(json.dumps({**IDENTITY, "time": T0 + n}))
        (result,) = watcher.poll()
        assert result.session_id is not None, result.error
        ids.append(result.session_id)
    return ids


def _capture(store: SessionStore, session_id: str, at: float) -> str:
    directory = Path(store.session_dir(session_id))
    directory.mkdir(parents=True)
    write_tpu_capture(directory / "tpu-0.xplane.pb", devices=1, steps=4, ops_per_step=20,
                      distinct_ops=5)  # fmt: skip
    target = TargetResult(address="tpu-0:8466", host="tpu-0", run_id="run-3", status="ok",
                          files=["tpu-0.xplane.pb"])  # fmt: skip
    store.write_record(SessionRecord(id=session_id, status="done", run_id="run-3",
                                     created=datetime.fromtimestamp(at, UTC),
                                     targets=[target]))  # fmt: skip
    return session_id


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(str(tmp_path / "store"))


def test_a_run_mostly_traced_reads_its_traces_and_names_the_capture_it_skipped(
    tmp_path: Path, store: SessionStore
) -> None:
    # Before: analyze read every file as XSpace and failed on the first trace.
    traces = _traces(tmp_path, store, 3)
    capture = _capture(store, "alert-capture", T0 + 100)  # the newest, yet one of four
    root = str(store.root)
    analyzed = CliRunner().invoke(
        main, ["analyze", "run:run-3", "--store", root, "--no-xprof", "--format", "json"]
    )
    assert analyzed.exit_code == 0, analyzed.output
    report = json.loads(analyzed.output)
    assert report["facts"]["capture_format"] == "torch_trace"
    assert capture in report["input"]["skipped"] and "XProf captures" in report["input"]["skipped"]
    context = SideContext(store=root)
    side = load_side("run:run-3", None, context)
    assert all(f.endswith(".pt.trace.json") for f in side.files), side.files
    assert any(capture in note and "skipped" in note for note in side.notes), side.notes
    assert expand_replicates("run:run-3~3", context) == traces
    compared = CliRunner().invoke(
        main, ["compare", "run:run-3", "run:run-3~2", "--store", root, "--format", "json"]
    )
    assert compared.exit_code == 0, compared.output


def test_a_tie_reads_the_newest_sessions_kind_and_too_few_says_what_was_skipped(
    tmp_path: Path, store: SessionStore
) -> None:
    traces = _traces(tmp_path, store, 2)
    captures = [_capture(store, f"x-{n}", T0 + 100 + n) for n in range(2)]
    context = SideContext(store=str(store.root))
    assert expand_replicates("run:run-3~2", context) == captures
    side = load_side("run:run-3", None, context)
    assert all(f.endswith(".xplane.pb") for f in side.files), side.files
    assert any(all(t in note for t in traces) for note in side.notes), side.notes
    analyzed = CliRunner().invoke(
        main, ["analyze", "run:run-3~2", "--store", str(store.root), "--no-xprof",
               "--format", "json"]
    )  # fmt: skip
    assert analyzed.exit_code == 0, analyzed.output
    with pytest.raises(InputError, match=r"torch\.profiler traces") as said:
        expand_replicates("run:run-3~3", context)
    assert "\n" not in str(said.value)
