"""The sidecar takes torch.profiler traces from the shared dir into its store as sessions.

The watcher's own rules (identity, settling, state across restarts) and what a workload
may plant under ``torch_traces/``: a FIFO, a link to a file outside, a huge sparse file,
the directory itself a link, an identity that is a FIFO. None wedges or crashes the
poll; hazards are armed as in ``test_untrusted_files.py`` (a FIFO is fed whenever a
reader opens it, a huge read is capped in address space), never bounded by a timer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter import schema
from exporter.capture.session import SessionRecord
from exporter.capture.store import SessionStore
from exporter.cli import main
from exporter.pipeline.processing import SessionProcessor, bounded_flamegraphs
from exporter.pipeline.torch_watcher import TorchTraceWatcher
from exporter.profiles.torch_trace import trace_flamegraphs
from tests import kineto_traces as kt
from tests.unit.test_planted_files import feeding_fifo, memory_bounded

HUGE = 1 << 30  # a sparse GiB: copied or read whole, it fails under memory_bounded()


class Clock:
    """Injected time: the settle rule is tested without waiting."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    directory = tmp_path / "shared"
    (directory / schema.TORCH_TRACES_DIR).mkdir(parents=True)
    return directory


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "store")


def _trace(shared: Path, name: str, identity: dict[str, object] | None = None) -> Path:
    directory = shared / schema.TORCH_TRACES_DIR
    path = kt.write(directory / name, [*kt.training_step(1, 0.0, 1), *kt.training_step(2, 200, 11)])
    if identity is not None:
        stem = name.removesuffix(".pt.trace.json")
        (directory / f"{stem}.json").write_text(json.dumps(identity))
    return path


def _watcher(
    shared: Path, store: SessionStore, seen: list[SessionRecord], now: float = 0.0
) -> TorchTraceWatcher:
    return TorchTraceWatcher(shared, store, [seen.append], clock=Clock(now))


IDENTITY = {"run_id": "run-3", "workload": "trainer", "host": "gpu-a", "pid": 9,
            "time": 1.79e9, "trigger": "programmatic", "name": "train"}  # fmt: skip


def test_an_sdk_trace_becomes_a_done_session_and_is_handed_to_the_hooks(
    shared: Path, store: SessionStore
) -> None:
    # Before: nothing read torch_traces/; a trace there never reached the store.
    _trace(shared, "train-gpu-a-9-1790000000000-1.pt.trace.json", IDENTITY)
    seen: list[SessionRecord] = []
    (result,) = _watcher(shared, store, seen).poll()
    assert result.error == "" and result.session_id is not None
    record = store.read_record(result.session_id)
    assert record is not None and [r.id for r in seen] == [record.id]
    assert (record.status, record.trigger, record.run_id, record.workload) == (
        "done", "programmatic", "run-3", "trainer",
    )  # fmt: skip
    (target,) = record.targets
    assert (target.host, target.status, target.files) == (
        "gpu-a", "ok", ["train-gpu-a-9-1790000000000-1.pt.trace.json"],
    )  # fmt: skip
    assert set(store.files(record.id)) >= set(target.files)
    # Trace and identity left the shared dir: taken once.
    assert list((shared / schema.TORCH_TRACES_DIR).iterdir()) == []
    assert _watcher(shared, store, seen).poll() == []


def test_the_stored_trace_converts_into_device_and_host_graphs(
    shared: Path, store: SessionStore
) -> None:
    _trace(shared, "t-1.pt.trace.json", IDENTITY)
    seen: list[SessionRecord] = []
    (result,) = _watcher(shared, store, seen).poll()
    assert result.session_id is not None
    pushed: list[tuple[str, dict[str, str]]] = []
    processor = SessionProcessor(
        store, trace_flamegraphs, push=lambda graph, labels: pushed.append((graph.unit, labels))
    )
    record = processor.process(result.session_id)
    assert record is not None
    sources = sorted(a["profile_source"] for a in record.artifacts)
    assert sources == ["torch_device", "torch_host"]
    assert {a["file"] for a in record.artifacts} == {
        "t-1.torch_device.pb.gz",
        "t-1.torch_host.pb.gz",
    }
    assert sorted(labels["profile_source"] for _, labels in pushed) == sources
    assert {labels["service_name"] for _, labels in pushed} == {"trainer"}


def test_a_trace_without_identity_waits_until_it_stops_changing(
    shared: Path, store: SessionStore
) -> None:
    """tensorboard_trace_handler writes in place: taken once unchanged and settled."""
    (shared / schema.RUN_FILE).write_text(json.dumps({"run_id": "run-5", "name": "w", "host": "h"}))
    path = _trace(shared, "h_77.1790000000000000000.pt.trace.json")
    mtime = path.stat().st_mtime
    seen: list[SessionRecord] = []
    watcher = _watcher(shared, store, seen, now=mtime + 60)
    assert watcher.poll() == []  # first sight: it may still be written
    with path.open("ab") as out:  # Kineto still writing
        out.write(b" ")
    os.utime(path, (mtime, mtime))
    assert watcher.poll() == []  # grew since the previous poll
    watcher.clock = Clock(mtime + 1)  # unchanged now, but only a second old
    assert watcher.poll() == []
    watcher.clock = Clock(mtime + 60)
    (result,) = watcher.poll()
    record = store.read_record(str(result.session_id))
    assert record is not None
    # No identity: the shared dir's run names it; the host is the worker's name.
    assert (record.run_id, record.workload, record.requester) == (
        "run-5", "w", "tensorboard_trace_handler",
    )  # fmt: skip
    assert record.targets[0].host == "h"


def test_taken_traces_are_remembered_across_restarts(shared: Path, store: SessionStore) -> None:
    bad = shared / schema.TORCH_TRACES_DIR / "bad.pt.trace.json"
    bad.symlink_to(shared / "elsewhere.json")
    seen: list[SessionRecord] = []
    (result,) = _watcher(shared, store, seen).poll()
    assert "symbolic link" in result.error
    again = _watcher(shared, store, seen)  # a restarted sidecar
    assert again.poll() == []
    assert "symbolic link" in again.failed["bad.pt.trace.json"]


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_a_planted_trace_is_refused_without_being_read(
    kind: str, shared: Path, store: SessionStore, tmp_path: Path
) -> None:
    directory = shared / schema.TORCH_TRACES_DIR
    path = directory / "planted.pt.trace.json"
    outside = tmp_path / "outside.json"
    payload = json.dumps(kt.document(kt.training_step(1, 0.0, 1))).encode()
    outside.write_bytes(payload)
    _trace(shared, "good.pt.trace.json", IDENTITY)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(outside)
    else:
        with path.open("wb") as out:
            out.truncate(HUGE)
            out.seek(HUGE)
            out.write(payload)
    seen: list[SessionRecord] = []
    watcher = _watcher(shared, store, seen)
    if kind == "fifo":
        results = feeding_fifo(watcher.poll, path, payload)
    elif kind == "huge":
        with memory_bounded(256 << 20):
            results = watcher.poll()
    else:
        results = watcher.poll()
    by_name = {r.name: r for r in results}
    assert by_name["good.pt.trace.json"].session_id is not None  # the others go on
    refused = by_name["planted.pt.trace.json"]
    assert refused.session_id is None
    expected = {"fifo": "not a regular file", "link": "symbolic link", "huge": "bound"}[kind]
    assert expected in refused.error
    assert len(seen) == 1 and outside.read_bytes() == payload  # nothing outside touched
    assert path.exists() or path.is_symlink()  # left for the user to see, not deleted


def test_a_linked_traces_directory_is_not_read(
    shared: Path, store: SessionStore, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kt.write(elsewhere / "x.pt.trace.json", kt.training_step(1, 0.0, 1))
    (shared / schema.TORCH_TRACES_DIR).rmdir()
    (shared / schema.TORCH_TRACES_DIR).symlink_to(elsewhere)
    seen: list[SessionRecord] = []
    watcher = _watcher(shared, store, seen, now=1e12)
    assert watcher.poll() == [] and watcher.poll() == []
    assert watcher.refused is not None and "symbolic link" in watcher.refused
    assert (elsewhere / "x.pt.trace.json").exists() and store.session_ids() == []


def test_an_identity_that_is_a_fifo_is_no_identity(shared: Path, store: SessionStore) -> None:
    path = _trace(shared, "f.pt.trace.json")
    fifo = shared / schema.TORCH_TRACES_DIR / "f.json"
    os.mkfifo(fifo)
    seen: list[SessionRecord] = []
    watcher = _watcher(shared, store, seen, now=path.stat().st_mtime + 60)
    assert feeding_fifo(watcher.poll, fifo, json.dumps(IDENTITY).encode()) == []
    (result,) = feeding_fifo(watcher.poll, fifo, json.dumps(IDENTITY).encode())
    record = store.read_record(str(result.session_id))
    assert record is not None and record.run_id is None  # the FIFO's identity was not read


def test_a_trace_session_in_a_remote_store_is_analysed_from_its_copy(shared: Path) -> None:
    # Before: the CLI's copy of a remote session left the trace behind (not a file any
    # command read), and the analysis found "no XProf captures".
    import fsspec

    url = f"memory://torch-watcher-{os.getpid()}"
    store = SessionStore(url)
    try:
        _trace(shared, "r-1.pt.trace.json", IDENTITY)
        (result,) = _watcher(shared, store, []).poll()
        assert result.session_id is not None
        done = CliRunner().invoke(
            main,
            ["analyze", result.session_id, "--store", url, "--no-xprof", "--format", "json"],
        )
        assert done.exit_code == 0, done.output
        facts = json.loads(done.output)["facts"]
        assert facts["capture_format"] == "torch_trace" and facts["steps"]["count"] == 2
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"', "not valid JSON"),
        (b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", "nests deeper"),
    ],
)
def test_a_hostile_trace_is_a_one_line_artifact_not_a_crash(
    shared: Path, store: SessionStore, data: bytes, said: str
) -> None:
    """Half a trace, or one nested past every bound, converted in the real bounded child."""
    path = shared / schema.TORCH_TRACES_DIR / "bad.pt.trace.json"
    path.write_bytes(data)
    (shared / schema.TORCH_TRACES_DIR / "bad.json").write_text(json.dumps(IDENTITY))
    (result,) = _watcher(shared, store, []).poll()
    assert result.session_id is not None
    processor = SessionProcessor(store, bounded_flamegraphs(120, 1024), push=None)
    record = processor.process(result.session_id)
    assert record is not None and record.processed is not None
    (artifact,) = record.artifacts
    error = artifact["error"]
    assert said in error and "\n" not in error and "Traceback" not in error


def test_a_name_written_again_after_it_was_taken_is_a_new_session(
    shared: Path, store: SessionStore
) -> None:
    """export_chrome_trace to one fixed name each epoch: each trace is its own session,
    even within one second (the clock here never moves)."""
    watcher = _watcher(shared, store, [])
    ids = []
    for _ in range(2):
        _trace(shared, "epoch.pt.trace.json", IDENTITY)
        (result,) = watcher.poll()
        ids.append(result.session_id)
    assert len(set(ids)) == 2 and sorted(store.session_ids()) == sorted(ids)


def test_a_runs_trace_sessions_are_read_by_run_specs(shared: Path, store: SessionStore) -> None:
    # Before: run:<id> read only XProf captures ("no captures of run ...").
    watcher = _watcher(shared, store, [])
    for n in range(3):
        _trace(shared, f"t-{n}.pt.trace.json", IDENTITY)
        assert watcher.poll()[0].session_id is not None
    root = str(store.root)
    analyzed = CliRunner().invoke(
        main, ["analyze", "run:run-3", "--store", root, "--no-xprof", "--format", "json"]
    )
    assert analyzed.exit_code == 0, analyzed.output
    facts = json.loads(analyzed.output)["facts"]
    assert facts["capture_format"] == "torch_trace" and len(facts["hosts"]) == 3
    compared = CliRunner().invoke(
        main, ["compare", "run:run-3", "run:run-3~2", "--store", root, "--format", "json"]
    )
    assert compared.exit_code == 0, compared.output
    comparison = json.loads(compared.output)
    assert comparison["base"]["steps"] == 6 and comparison["head"]["replicates"] == 2
