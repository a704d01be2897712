"""Files a workload plants in the shared dir: links, FIFOs, /dev/zero (issue 22, attack 3).

The workload (or anyone who can write the shared directory) controls every name there.
Each test plants what the attack did — a symbolic link to a victim outside, a FIFO with
no writer, a link to ``/dev/zero``, a NUL byte — on real files, and asserts that the
victim is untouched, that nothing outside was read, and that the rest still works.

Hangs are bounded by structure, not by a timer: a FIFO is fed (a run record, then
EOF) whenever some reader has opened it, so a reader that opens FIFOs reads that
record and the test sees it; a reader that skips FIFOs never does. Reads of
``/dev/zero`` run under an address-space limit, so one that never ends fails with
MemoryError instead of exhausting the machine.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import resource
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from exporter import regular_files, schema
from exporter.analysis.sides.load import SideContext, load_side
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.capture.targets import LocalRunDiscovery
from exporter.capture.watcher import SessionWatcher
from exporter.errors import InputError
from exporter.metrics.run_pids import RunPids
from exporter.metrics.runs import RunEvents
from exporter.profiles import torch_memory
from exporter.profiles.flamegraph import FlameGraph
from exporter.proto import profile_pb2
from exporter.regular_files import NotRegularFileError, read_regular
from tests import torch_snapshots as ts

T = TypeVar("T")
VICTIM = b"the victim's own bytes\n"


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, message: str = "", /, **fields: Any) -> None:
        self.events.append((kind, fields))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the shared dir, holding a victim file."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "victim").write_bytes(VICTIM)
    return directory


def feeding_fifo(func: Callable[[], T], fifo: Path, payload: bytes) -> T:
    """Run ``func``; whenever a reader has ``fifo`` open, feed it ``payload`` then EOF.

    Opening a FIFO's write end without blocking succeeds only while a reader has it
    open (or waits in open()), so a reader that opens the FIFO is answered with
    ``payload`` and returns; a reader that skips FIFOs finishes without it.
    """
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(_outcome(func)), daemon=True)
    thread.start()
    while thread.is_alive():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno not in (errno.ENXIO, errno.ENOENT):  # no reader yet; moved away
                raise
        else:
            with contextlib.suppress(OSError):
                os.write(fd, payload)
            os.close(fd)
        thread.join(0.005)
    ((ok, value),) = box
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _outcome(func: Callable[[], T]) -> tuple[bool, Any]:
    try:
        return True, func()
    except BaseException as exc:
        return False, exc


@contextlib.contextmanager
def memory_bounded(extra: int = 768 << 20) -> Iterator[None]:
    """Cap this process's address space a little above its size (a read of /dev/zero
    that never ends raises MemoryError instead of filling the machine)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status").read_text()
    size = next(
        int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:")
    )
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _no_links(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_symlink()]


def _run_record(run_id: str = "r1", **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "name": "w",
        "host": "h0",
        "pid": 7,
        "start_unix": time.time(),
    } | extra


# -- 1. writes through a workload's links ------------------------------------------------


def _stage(logdir: Path, session_id: str) -> Path:
    directory = logdir / "plugins" / "profile" / session_id
    directory.mkdir(parents=True)
    (directory / "vm.xplane.pb").write_bytes(b"\x0a\x00" * 50)
    record = SessionRecord(
        id=session_id,
        status="done",
        trigger="programmatic",
        requester="sdk",
        run_id="r1",
        targets=[TargetResult(address="local", host="vm", status="ok", files=["vm.xplane.pb"])],
    )
    (directory / "session.json").write_text(record.model_dump_json())
    return directory


def test_imported_sessions_hold_copies_of_regular_files_never_planted_links(
    tmp_path: Path, outside: Path
) -> None:
    """A staged ``summary.html -> victim`` (and a pprof name) used to be moved into the
    store as a link, and the report and flame graph written through it."""
    (outside / "victim2").write_bytes(VICTIM)
    staged = _stage(tmp_path / "logdir", "warmup-1")
    (staged / "summary.html").symlink_to(outside / "victim")
    (staged / "vm.xprof_device.pb.gz").symlink_to(outside / "victim2")
    os.mkfifo(staged / "pipe.xplane.pb")
    store = SessionStore(tmp_path / "store")
    watcher = SessionWatcher(store, tmp_path / "logdir")

    watcher.poll()
    session = tmp_path / "store" / "plugins" / "profile" / "warmup-1"
    assert (session / "vm.xplane.pb").read_bytes() == b"\x0a\x00" * 50
    assert _no_links(tmp_path / "store") == []
    assert sorted(store.files("warmup-1")) == ["session.json", "vm.xplane.pb"]
    assert not staged.exists()  # the staging dir is gone: the links themselves, not targets
    # The derived files the sidecar then writes under those fixed names.
    store.write_file("warmup-1", "summary.html", b"<html>report</html>")
    store.write_file("warmup-1", "vm.xprof_device.pb.gz", b"pprof")
    assert (outside / "victim").read_bytes() == VICTIM
    assert (outside / "victim2").read_bytes() == VICTIM
    assert (session / "summary.html").read_bytes() == b"<html>report</html>"


def test_store_writes_replace_a_link_in_a_session_never_write_through_it(
    tmp_path: Path, outside: Path
) -> None:
    """A store the workload can write (e.g. inside the shared dir): a link under a
    derived file's name, the record's name or a temporary name is replaced."""
    store = SessionStore(tmp_path / "store")
    record = SessionRecord(id="s1", status="done", targets=[])
    store.write_record(record)
    session = tmp_path / "store" / "plugins" / "profile" / "s1"
    for name in ("summary.html", "report.json", "session.json"):
        (session / name).unlink(missing_ok=True)
        (session / name).symlink_to(outside / "victim")
    store.write_file("s1", "summary.html", b"<html/>")
    store.write_file("s1", "report.json", b"{}")
    store.write_record(record)
    assert (outside / "victim").read_bytes() == VICTIM
    assert _no_links(session) == []
    assert store.read_record("s1") == record


def test_announced_runs_are_saved_beside_and_renamed_never_through_a_link(
    tmp_path: Path, outside: Path
) -> None:
    """``sidecar/.runs-announced.json.tmp -> victim`` used to receive the state."""
    sidecar = tmp_path / "sidecar"
    sidecar.mkdir()
    (sidecar / ".runs-announced.json.tmp").symlink_to(outside / "victim")
    (sidecar / "runs-announced.json").symlink_to(outside / "victim")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r1.json").write_text(json.dumps(_run_record()))
    emit = Recorder()
    events = RunEvents(tmp_path, emit)  # the link is refused: a bad state, set aside
    assert events.poll() == 1
    assert (outside / "victim").read_bytes() == VICTIM
    state = sidecar / "runs-announced.json"
    assert not state.is_symlink() and json.loads(state.read_bytes()) == {"announced": ["r1.json"]}
    assert RunEvents(tmp_path, emit).poll() == 0  # remembered across a restart


def test_a_linked_sidecar_dir_gets_no_state_written_into_it(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "sidecar").symlink_to(outside)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r1.json").write_text(json.dumps(_run_record()))
    emit = Recorder()
    assert RunEvents(tmp_path, emit).poll() == 1  # announced; the state is not saved
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_replace_file_removes_a_planted_fifo_and_refuses_a_linked_directory(
    tmp_path: Path, outside: Path
) -> None:
    target = tmp_path / "state.json"
    tmp = tmp_path / f".state.json.{os.getpid()}-{threading.get_ident()}.tmp"
    os.mkfifo(tmp)  # opened for writing, it would block until a reader came
    regular_files.replace_file(target, b"{}")
    assert target.read_bytes() == b"{}" and not tmp.exists()
    tmp.symlink_to(outside / "victim")
    regular_files.replace_file(target, b"[]")
    assert target.read_bytes() == b"[]" and (outside / "victim").read_bytes() == VICTIM
    (tmp_path / "linked").symlink_to(outside)
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        regular_files.replace_file(tmp_path / "linked" / "victim", b"x")
    assert (outside / "victim").read_bytes() == VICTIM


# -- 4. unbounded reads of workload files -------------------------------------------------


def test_a_run_file_linked_to_dev_zero_is_skipped(tmp_path: Path) -> None:
    """st_size is 0 and read_bytes() never ends: an OOM at every start, before."""
    runs = tmp_path / "runs"
    runs.mkdir()
    emit = Recorder()
    events = RunEvents(tmp_path, emit)
    events.poll()  # a sidecar already running: new files are read whatever their mtime
    (runs / "zero.json").symlink_to("/dev/zero")
    (runs / "r1.json").write_text(json.dumps(_run_record()))
    with memory_bounded():
        assert events.poll() == 2
    assert [f["run_id"] for _, f in emit.events] == ["r1"]


def test_a_fifo_in_runs_is_skipped_not_read(tmp_path: Path) -> None:
    """A FIFO in runs/ stalled run_events for good (its open() waited for a writer)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    os.mkfifo(runs / "a.json")
    (runs / "b.json").write_text(json.dumps(_run_record("b")))
    emit = Recorder()
    events = RunEvents(tmp_path, emit)
    fed = json.dumps(_run_record("from-the-fifo")).encode()
    assert feeding_fifo(events.poll, runs / "a.json", fed) == 2
    assert [f["run_id"] for _, f in emit.events] == ["b"]


def test_a_run_ending_whose_run_file_is_a_fifo_is_announced_without_reading_it(
    tmp_path: Path,
) -> None:
    """The step log's ``end`` line reads runs/<id>.json on the tailer's thread: a FIFO
    there froze every workload's training metrics."""
    runs = tmp_path / "runs"
    runs.mkdir()
    os.mkfifo(runs / "r1.json")
    emit = Recorder()
    events = RunEvents(tmp_path, emit)
    identity = {"run_id": "r1", "workload": "w", "host": "h0"}
    fed = json.dumps(_run_record(start_unix=100.0)).encode()
    feeding_fifo(lambda: events.ended(identity, {"time": 160.0}, 5, 10), runs / "r1.json", fed)
    ((kind, fields),) = emit.events
    assert kind == "run_ended" and fields["steps"] == 5
    assert fields["duration_s"] is None  # the FIFO's "start_unix" was never read


@pytest.mark.parametrize("plant", ["deep", "fifo", "dev_zero"])
def test_a_bad_announced_runs_state_is_set_aside_and_the_sidecar_starts(
    tmp_path: Path, plant: str
) -> None:
    """Deep nesting raised RecursionError (exit 1 at every start), a FIFO hung the start,
    /dev/zero filled memory."""
    sidecar = tmp_path / "sidecar"
    sidecar.mkdir()
    state = sidecar / "runs-announced.json"
    if plant == "deep":
        state.write_text('{"announced": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif plant == "fifo":
        os.mkfifo(state)
    else:
        state.symlink_to("/dev/zero")
    fed = json.dumps({"announced": ["from-the-fifo.json"]}).encode()
    with memory_bounded():
        if plant == "fifo":
            events = feeding_fifo(lambda: RunEvents(tmp_path, Recorder()), state, fed)
        else:
            events = RunEvents(tmp_path, Recorder())
    assert events.state_discarded
    assert (sidecar / "runs-announced.json.bad").exists() or (
        sidecar / "runs-announced.json.bad"
    ).is_symlink()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "from-the-fifo.json").write_text(json.dumps(_run_record()))
    assert events.poll() == 1  # nothing from the planted file was taken as announced


def test_a_nul_byte_in_one_records_host_does_not_stop_discovery(tmp_path: Path) -> None:
    """os.stat() raised ValueError on it, outside the per-file handling: no later run
    was discovered."""
    procs, steps = tmp_path / "procs", tmp_path / "steps"
    procs.mkdir()
    steps.mkdir()
    bad = _run_record("bad", host="h\x00x", pid=11, profiler_port=9001)
    good = _run_record("good", host="h0", pid=12, profiler_port=9002)
    (procs / "a-11.json").write_text(json.dumps(bad))
    (procs / "h0-12.json").write_text(json.dumps(good))
    (steps / "h0-12.jsonl").touch()
    found = LocalRunDiscovery(tmp_path).discover()
    assert [(t.address, t.run_id) for t in found] == [("127.0.0.1:9002", "good")]


def test_run_records_linked_elsewhere_are_not_read(tmp_path: Path, outside: Path) -> None:
    (outside / "record.json").write_text(json.dumps(_run_record("outside", pid=4242)))
    (outside / "dir").mkdir()
    (outside / "dir" / "r.json").write_text(json.dumps(_run_record("outside-dir", pid=4343)))
    procs = tmp_path / "procs"
    procs.mkdir()
    (procs / "h0-4242.json").symlink_to(outside / "record.json")
    (tmp_path / "runs").symlink_to(outside / "dir")  # a linked directory too
    pids = RunPids(tmp_path, started=lambda pid: 0.0)
    assert pids.identity(4242) is None and pids.identity(4343) is None


def test_read_regular_refuses_links_and_linked_directories_under_the_root(
    tmp_path: Path, outside: Path
) -> None:
    (tmp_path / "link").symlink_to(outside / "victim")
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        read_regular(tmp_path / "link")
    assert read_regular(tmp_path / "link", follow_symlinks=True) == VICTIM  # opt in
    (tmp_path / "dir").symlink_to(outside)
    assert read_regular(tmp_path / "dir" / "victim") == VICTIM  # only the last component
    with pytest.raises(NotRegularFileError, match="symbolic link, not a directory"):
        read_regular(tmp_path / "dir" / "victim", below=tmp_path)


# -- 5. reads outside the shared dir ----------------------------------------------------


def test_a_linked_session_directory_is_not_imported(tmp_path: Path, outside: Path) -> None:
    """Its outside files were moved into the store (and so removed from outside)."""
    elsewhere = _stage(outside, "s-out")
    logdir = tmp_path / "logdir"
    (logdir / "plugins" / "profile").mkdir(parents=True)
    (logdir / "plugins" / "profile" / "s-linked").symlink_to(elsewhere)
    store = SessionStore(tmp_path / "store")
    watcher = SessionWatcher(store, logdir)
    watcher.poll()
    watcher.poll()
    assert store.session_ids() == []
    assert sorted(p.name for p in elsewhere.iterdir()) == ["session.json", "vm.xplane.pb"]


def test_a_linked_plugins_directory_is_not_imported_from(tmp_path: Path, outside: Path) -> None:
    _stage(outside, "s-out")
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    (logdir / "plugins").symlink_to(outside / "plugins")
    store = SessionStore(tmp_path / "store")
    SessionWatcher(store, logdir).poll()
    assert store.session_ids() == []
    assert (outside / "plugins" / "profile" / "s-out" / "vm.xplane.pb").exists()


def _memory_profile(directory: Path, stem: str, run_id: str, frame: str) -> Path:
    """A device-memory pprof with one frame named ``frame``, and its identity file."""
    profile = profile_pb2.Profile(
        string_table=["", "allocations", "count", "space", "bytes", frame, "a.py", "device", "tpu0"]
    )
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    profile.function.add(id=1, name=5, filename=6)
    profile.location.add(id=1, line=[profile_pb2.Line(function_id=1, line=3)])
    sample = profile.sample.add(location_id=[1], value=[1, 1024])
    sample.label.add(key=7, str=8)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}{schema.MEMORY_PROFILE_SUFFIX}"
    path.write_bytes(gzip.compress(profile.SerializeToString()))
    (directory / f"{stem}{schema.MEMORY_META_SUFFIX}").write_text(json.dumps({"run_id": run_id}))
    return path


def test_run_memory_sides_read_no_linked_profile(tmp_path: Path, outside: Path) -> None:
    """``compare run:r1 ... kind=memory`` returned an outside frame name."""
    shared = tmp_path / "shared"
    memory = shared / schema.MEMORY_DIR
    _memory_profile(memory, "h-1", "r1", "inside_frame")
    secret = _memory_profile(outside, "secret", "r1", "outside_secret_frame")
    (memory / f"h-2{schema.MEMORY_PROFILE_SUFFIX}").symlink_to(secret)
    (memory / f"h-2{schema.MEMORY_META_SUFFIX}").write_text(json.dumps({"run_id": "r1"}))
    side = load_side("run:r1", "memory", SideContext(shared_dir=shared))
    names = _names(side.whole)
    assert "inside_frame" in names and "outside_secret_frame" not in names
    assert side.files == [str(memory / f"h-1{schema.MEMORY_PROFILE_SUFFIX}")]


def test_a_linked_memory_directory_is_refused_for_run_sides(tmp_path: Path, outside: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    _memory_profile(outside / "mem", "h-1", "r1", "outside_secret_frame")
    (shared / schema.MEMORY_DIR).symlink_to(outside / "mem")
    with pytest.raises(InputError, match="symbolic link"):
        load_side("run:r1", "memory", SideContext(shared_dir=shared))


def _names(graph: FlameGraph) -> list[str]:
    out: list[str] = []
    stack = list(graph.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node.name)
        stack.extend(node.children.values())
    return out


def test_a_snapshot_swapped_for_a_link_after_the_check_is_not_read(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher checked for a link, then the child opened the path following links:
    4 of 12 swaps published an outside snapshot. Now the file is opened once, without
    following, and the child converts that descriptor."""
    secret = ts.write(outside / "secret.pickle", ts.random_snapshot(5, blocks=40))
    own = ts.training_snapshot()
    path = ts.write(tmp_path / "h-1.pickle", own)
    real_run = subprocess.run

    def swap_then_run(*args: Any, **kwargs: Any) -> Any:
        path.unlink()
        path.symlink_to(secret)  # the swap lands between the check and the child's read
        return real_run(*args, **kwargs)

    monkeypatch.setattr("exporter.sandbox.subprocess.run", swap_then_run)  # every child's start
    pprof = torch_memory.torch_memory_pprof(path)
    assert pprof == torch_memory.snapshot_profile(own, str(path)).SerializeToString()
    monkeypatch.setattr("exporter.sandbox.subprocess.run", real_run)
    with pytest.raises(InputError, match="symbolic link"):
        torch_memory.load_torch_memory_profile(path)  # the link itself, now in place


def test_a_ring_snapshot_copies_no_link_and_writes_through_none(
    tmp_path: Path, outside: Path
) -> None:
    """The ring's windows and the staging dir are in the logdir the workload writes:
    ``shutil.copyfile`` followed a link in both (read an outside file into the capture,
    wrote the capture through a link at its name)."""
    from exporter.capture.engine import CaptureEngine, CaptureLimits
    from exporter.capture.snapshots import SnapshotService, _Kept
    from exporter.capture.targets import ProfilerTarget

    (outside / "victim2").write_bytes(VICTIM)
    logdir = tmp_path / "logdir"
    engine = CaptureEngine(SessionStore(tmp_path / "store"), logdir, CaptureLimits())
    try:
        snapshots = SnapshotService(engine, mode="ring")
        target = ProfilerTarget("127.0.0.1:1", "vm", "r1", "static", "cpu")
        window = snapshots.ring_logdir / "plugins" / "profile" / "w1"
        window.mkdir(parents=True)
        (window / "vm_1.xplane.pb").write_bytes(b"window capture")
        (window / "vm_1.secret.pb").symlink_to(outside / "victim")
        staging = logdir / "plugins" / "profile" / "s1"
        staging.mkdir(parents=True)
        (staging / "vm_1.xplane.pb").symlink_to(outside / "victim2")
        snapshots._kept[target.address] = _Kept(target, "ring", windows=[window])
        outcome = snapshots.take(target, staging)
    finally:
        engine.close()
    assert outcome is not None and outcome.files == [staging / "vm_1.xplane.pb"]
    assert (staging / "vm_1.xplane.pb").read_bytes() == b"window capture"
    assert not (staging / "vm_1.xplane.pb").is_symlink()
    assert not (staging / "vm_1.secret.pb").exists()
    assert (outside / "victim2").read_bytes() == VICTIM


def test_a_step_log_linked_elsewhere_is_refused_once_not_read(
    tmp_path: Path, outside: Path
) -> None:
    from tests.unit.test_steplog import Sidecar as Tailing
    from tests.unit.test_steplog import step_line

    (outside / "steps.jsonl").write_text(step_line(0) + step_line(1) + step_line(2))
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "h-1.jsonl").symlink_to(outside / "steps.jsonl")
    car = Tailing(tmp_path)
    car.tailer.poll()
    car.tailer.poll()
    assert car.value("train_steps_total") is None
    assert car.errors == ["not_regular_file"]


def test_a_pushed_capture_names_its_service_without_reading_a_fifo_or_outside(
    tmp_path: Path, outside: Path
) -> None:
    """The session processor's thread looked the run's name up in runs/<run_id>.json
    with read_text(): a FIFO there stopped every later conversion."""
    from exporter.config import load_settings
    from exporter.pipeline.service import CaptureService

    shared = tmp_path / "shared"
    (shared / "runs").mkdir(parents=True)
    os.mkfifo(shared / "runs" / "fifo-run.json")
    (shared / "runs" / "linked.json").symlink_to(outside / "record.json")
    (outside / "record.json").write_text(json.dumps({"name": "outside-name"}))
    (shared / "runs" / "ok.json").write_text(json.dumps({"name": "trainer"}))
    settings = load_settings(
        shared_dir=str(shared), store=str(tmp_path / "store"), spool_dir=str(tmp_path / "spool")
    )
    service = CaptureService.from_settings(settings)
    try:
        name = service.processor.service_name
        fed = json.dumps({"name": "from-the-fifo"}).encode()
        assert feeding_fifo(lambda: name("fifo-run"), shared / "runs" / "fifo-run.json", fed) == (
            "mlprof"
        )
        assert name("linked") == "mlprof"
        assert name("../outside/record") == "mlprof"
        assert name("ok") == "trainer"
    finally:
        service.close()


def test_a_run_file_linked_elsewhere_gives_no_backend_to_the_metrics(
    tmp_path: Path, outside: Path
) -> None:
    from prometheus_client import generate_latest

    from tests.unit.test_steplog import Sidecar as Tailing
    from tests.unit.test_steplog import step_line

    (outside / "r1.json").write_text(json.dumps({"system": {"backend": "tpu"}}))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r1.json").symlink_to(outside / "r1.json")
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "h-1.jsonl").write_text(step_line(0) + step_line(1))
    car = Tailing(tmp_path, clock=1005.0)
    car.tailer.poll()
    car.metrics.refresh_runs()
    rendered = generate_latest(car.telemetry.registry)
    assert b'accelerator="unknown"' in rendered and b'accelerator="tpu"' not in rendered


def test_files_kept_for_a_retry_get_their_record_without_writing_through_a_link(
    tmp_path: Path, outside: Path
) -> None:
    """The engine's staging dir is in the logdir the workload writes: the record kept
    for the watcher's retry went to ``.session.json.tmp``, following a link there."""
    from exporter.capture.engine import CaptureEngine, CaptureLimits

    (outside / "victim2").write_bytes(VICTIM)
    engine = CaptureEngine(SessionStore(tmp_path / "store"), tmp_path / "logdir", CaptureLimits())
    try:
        staging = engine.staging_dir("s1")
        staging.mkdir(parents=True)
        (staging / "vm_1.xplane.pb").write_bytes(b"capture")
        (staging / ".session.json.tmp").symlink_to(outside / "victim")
        (staging / "session.json").symlink_to(outside / "victim2")
        target = TargetResult(
            address="vm:1", host="vm", status="failed", unimported=["vm_1.xplane.pb"]
        )
        engine._leave_for_retry(SessionRecord(id="s1", status="failed", targets=[target]), staging)
    finally:
        engine.close()
    assert (outside / "victim").read_bytes() == VICTIM
    assert (outside / "victim2").read_bytes() == VICTIM
    kept = SessionRecord.model_validate_json((staging / "session.json").read_bytes())
    assert kept.targets[0].files == ["vm_1.xplane.pb"] and kept.status == "done"


def test_a_staging_dir_under_a_linked_plugins_dir_is_not_removed(
    tmp_path: Path, outside: Path
) -> None:
    from exporter.capture import engine

    kept = outside / "plugins" / "profile" / "s1"
    kept.mkdir(parents=True)
    (kept / "theirs").write_bytes(VICTIM)
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    (logdir / "plugins").symlink_to(outside / "plugins")
    engine.remove_staging(logdir / "plugins" / "profile" / "s1", logdir)
    assert (kept / "theirs").read_bytes() == VICTIM
    real = logdir.parent / "real-logdir"
    (real / "plugins" / "profile" / "s2").mkdir(parents=True)
    engine.remove_staging(real / "plugins" / "profile" / "s2", real)
    assert not (real / "plugins" / "profile" / "s2").exists()
