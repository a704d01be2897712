"""Files a workload or a bucket wrote, read through one guard (issues 30 item 2, 35, 31.8).

The shared directory is the workload's to write, a session store anyone's who may write
its bucket. Each test plants what the attacks did — a FIFO with no writer, a huge file,
a link to a file outside, a record claiming another session's id, a mark nested 100,000
deep, a report of tens of MiB — and drives the door that reads it: the report worker,
the CLI, the HTTP API, the MCP tools. Hangs are bounded by structure (a FIFO is fed
whenever a reader has it open, so a reader that opens it sees the planted payload), huge
reads by an address-space limit (a whole read raises MemoryError), never by a timer.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from exporter import schema
from exporter.analysis.sides.baselines import BaselineStore
from exporter.api.app import create_app
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import MAX_MARK_BYTES, MAX_REPORT_BYTES, SessionStore
from exporter.capture.watcher import SessionWatcher
from exporter.cli import main
from exporter.pipeline.worker import ERROR_FILE, ReportWorker, workload_from_shared_dir
from exporter.profiles.capture_files import find_captures
from exporter.sidecar import Sidecar
from exporter.testing.synthetic import write_tpu_capture
from tests.sidecar_app import settings_in
from tests.unit.test_planted_files import feeding_fifo, memory_bounded

RUN = "r1"
PLANTED = "planted"
CAPTURE = "vm_9999.xplane.pb"
HUGE = 1 << 30  # a sparse GiB: read whole, it fails under memory_bounded()


def _plant(kind: str, path: Path, outside: Path, payload: bytes) -> None:
    """Put a FIFO, a sparse huge file ending in ``payload``, or a link to a file holding
    ``payload`` outside, at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        target = outside / f"target-{path.name}"
        target.write_bytes(payload)
        path.symlink_to(target)
    else:
        with path.open("wb") as out:
            out.truncate(HUGE)
            out.seek(HUGE)
            out.write(b"\n" + payload)


def _read(kind: str, path: Path, payload: bytes, func: Callable[[], object]) -> object:
    """``func()`` with the plant's hazard armed: a FIFO is fed, a huge read is capped."""
    if kind == "fifo":
        return feeding_fifo(func, path, payload)
    if kind == "huge":
        with memory_bounded(256 << 20):
            return func()
    return func()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    return directory


def _record(session_id: str, **extra: object) -> SessionRecord:
    fields: dict[str, object] = {
        "id": session_id,
        "status": "done",
        "run_id": RUN,
        "targets": [TargetResult(address="vm:9999", host="vm", status="ok", files=[CAPTURE])],
    }
    return SessionRecord.model_validate(fields | extra)


def _memory_line(time: float, device: str) -> bytes:
    line = {"kind": "memory", "run_id": RUN, "time": time, "devices": [{"id": device}]}
    return json.dumps(line).encode() + b"\n"


# -- the shared directory: steps/ and runs/ -------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_the_report_worker_reads_step_logs_as_bounded_tails_of_regular_files(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    """A FIFO in steps/ wedged every later report (202 pending for ever), a 1 GiB log was
    read whole (sidecar 2.1 GB), a link was followed. Now: a bounded tail of each
    regular file; the run's memory samples still come from the genuine log."""
    shared = tmp_path / "shared"
    steps = shared / schema.STEPS_DIR
    steps.mkdir(parents=True)
    (steps / f"good{schema.STEP_LOG_SUFFIX}").write_bytes(_memory_line(1.0, "genuine"))
    planted = steps / f"zz{schema.STEP_LOG_SUFFIX}"
    payload = _memory_line(2.0, PLANTED)
    _plant(kind, planted, outside, payload)
    worker = ReportWorker(SessionStore(tmp_path / "store"), shared_dir=shared)

    samples = _read(kind, planted, payload, lambda: worker._memory_samples(_record("s1")))

    # A huge regular log is the workload's own: its newest line (in the tail) counts.
    expected = PLANTED if kind == "huge" else "genuine"
    assert samples == [{"id": expected}]


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_a_runs_identity_is_read_regular_and_bounded_by_the_worker(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    shared = tmp_path / "shared"
    path = shared / schema.RUNS_DIR / f"{RUN}.json"
    payload = json.dumps({"run_id": RUN, "name": PLANTED}).encode()
    _plant(kind, path, outside, payload)
    workload_of = workload_from_shared_dir(shared)

    assert _read(kind, path, payload, lambda: workload_of(_record("s1"))) is None


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_the_cli_names_a_baselines_workload_without_reading_a_planted_run_file(
    tmp_path: Path, outside: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mlprof baseline set`` read runs/<id>.json with read_text: it followed a link and
    blocked on a FIFO. Now it reads it as the sidecar does (the same function)."""
    shared, store = tmp_path / "shared", SessionStore(tmp_path / "store")
    store.write_record(_record("s1"))
    path = shared / schema.RUNS_DIR / f"{RUN}.json"
    payload = json.dumps({"run_id": RUN, "name": PLANTED}).encode()
    _plant(kind, path, outside, payload)
    monkeypatch.setenv("MLPROF_SHARED_DIR", str(shared))
    args = ["baseline", "set", "s1", "--store", str(tmp_path / "store")]

    result = _read(kind, path, payload, lambda: CliRunner().invoke(main, args))

    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "its workload is unknown" in result.output  # type: ignore[attr-defined]
    assert not (Path(store.root) / "baselines" / f"{PLANTED}.json").exists()


# -- a store session: captures that are links or FIFOs ----------------------------------


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_find_captures_refuses_links_and_fifos_in_a_session(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    session = tmp_path / "store" / "plugins" / "profile" / "s1"
    write_tpu_capture(session / "real.xplane.pb")
    _plant(kind, session / CAPTURE, outside, b"\x0a\x00")
    (outside / "inner").mkdir()
    write_tpu_capture(outside / "inner" / "elsewhere.xplane.pb")
    (session / "linked-dir").symlink_to(outside / "inner")

    assert find_captures(session) == [session / "real.xplane.pb"]


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_the_mcp_tools_read_no_capture_that_is_a_link_or_a_fifo(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    """MCP's tools followed a capture linked out of the store (the API refused it)."""
    from exporter.errors import InputError
    from exporter.mcp_server import ProfileTools

    store = SessionStore(tmp_path / "store")
    store.write_record(_record("s1"))
    write_tpu_capture(outside / "secret.xplane.pb")
    session = Path(store.session_dir("s1"))
    if kind == "link":
        (session / CAPTURE).symlink_to(outside / "secret.xplane.pb")
    else:
        os.mkfifo(session / CAPTURE)
    tools = ProfileTools(str(tmp_path / "store"))

    with pytest.raises(InputError, match="no XProf captures"):
        tools.hosts("s1")


def test_a_fifo_under_a_captures_name_is_an_error_artifact_not_a_wedged_conversion(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path / "store")
    store.write_record(_record("s1"))
    os.mkfifo(Path(store.session_dir("s1")) / CAPTURE)

    with pytest.raises(OSError, match="not a regular file"), store.local_file("s1", CAPTURE):
        pass


# -- store records: ids, size, set aside once -------------------------------------------


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "local":
        yield SessionStore(tmp_path / "store")
        return
    import fsspec

    url = f"memory://untrusted-{os.getpid()}-{threading.get_ident()}-{id(request)}"
    yield SessionStore(url)
    fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


def _put(store: SessionStore, session_id: str, name: str, data: bytes) -> None:
    directory = store.session_dir(session_id)
    store.fs.makedirs(directory, exist_ok=True)
    store.fs.pipe_file(f"{directory}/{name}", data)


def test_an_orphan_record_claiming_another_sessions_id_overwrites_nothing(
    store: SessionStore, tmp_path: Path
) -> None:
    """``zz-orphan/session.json`` said id base-1: the orphan pass wrote it over base-1's
    record (failed, the attacker's run, its files gone)."""
    store.write_record(_record("base-1"))
    forged = _record("base-1", status="running", run_id="attacker-run", targets=[])
    _put(store, "zz-orphan", "session.json", forged.model_dump_json().encode())
    watcher = SessionWatcher(store, tmp_path / "logdir")

    watcher.poll()

    kept = store.read_record("base-1")
    assert kept is not None and kept.status == "done" and kept.run_id == RUN
    assert kept.targets[0].files == [CAPTURE]
    assert store.read_record("zz-orphan") is None
    assert store.refused["id_mismatch"] >= 1


def test_a_record_with_an_invalid_id_is_set_aside_once_and_the_rest_go_on(
    store: SessionStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``{"id": "../../baselines/x"}`` made every poll fail (ValueError): no session was
    handed over, none imported, while /readyz said ready."""
    bad = _record("x", status="running").model_dump(mode="json") | {"id": "../../baselines/x"}
    _put(store, "aa-badid", "session.json", json.dumps(bad).encode())
    store.write_record(_record("s1"))
    watcher = SessionWatcher(store, tmp_path / "logdir")
    handed: list[str] = []
    watcher.on_complete.append(lambda record: handed.append(record.id))

    with caplog.at_level(logging.WARNING):
        states = [watcher.poll()[0] for _ in range(3)]

    assert states == ["ok"] * 3
    assert handed == ["s1"]
    said = [r for r in caplog.records if "aa-badid" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert store.refused["id_mismatch"] == 1  # once, however often it is read


@pytest.mark.parametrize(
    "body",
    # 30,000 deep: within the mark's size bound, so the parser meets the nesting itself.
    [b"[" * 30_000 + b"]" * 30_000, b"[1, 2]", b'{"session_id": ', b"\xff\xfe{}"],
    ids=["deep", "array", "unterminated", "not-utf8"],
)
def test_a_bad_baseline_mark_is_no_mark_never_an_exception(
    store: SessionStore, body: bytes
) -> None:
    """A mark nested 100,000 deep raised RecursionError: GET /api/v1/baselines 500,
    retention's keep() killed every capture thread, an alert's report lost."""
    store.write_record(_record("s1", workload="trainer"))
    marks = BaselineStore(store)
    store.fs.makedirs(marks.root, exist_ok=True)
    store.fs.pipe_file(f"{marks.root}/trainer.json", body)

    assert marks.get("trainer") is None
    assert marks.marks() == []
    assert marks.pinned() == frozenset()
    assert store.refused["invalid"] >= 1


def test_a_baseline_mark_past_its_bound_is_refused_unread(store: SessionStore) -> None:
    marks = BaselineStore(store)
    store.fs.makedirs(marks.root, exist_ok=True)
    huge = json.dumps({"session_id": "s1", "pad": "x" * MAX_MARK_BYTES}).encode()
    store.fs.pipe_file(f"{marks.root}/trainer.json", huge)

    assert marks.get("trainer") is None
    assert store.refused["too_large"] == 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "s1", "alert": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        b'{"id": "s1", "name": "\\ud800"}',
        b"[1, 2]",
        b"\xff\xfe",
    ],
    ids=["deep", "lone-surrogate", "array", "not-utf8"],
)
def test_a_bad_record_is_set_aside_once_never_an_exception(
    store: SessionStore, tmp_path: Path, body: bytes
) -> None:
    _put(store, "s1", "session.json", body)
    store.write_record(_record("s2"))
    watcher = SessionWatcher(store, tmp_path / "logdir")

    assert [watcher.poll()[0] for _ in range(2)] == ["ok", "ok"]
    assert store.read_record("s1") is None
    assert [r.id for r in store.records()] == ["s2"]
    assert store.refused["invalid"] >= 1


def test_a_record_past_its_bound_is_set_aside(store: SessionStore) -> None:
    record = _record("s1").model_dump(mode="json") | {"pad": "x" * (5 << 20)}
    _put(store, "s1", "session.json", json.dumps(record).encode())

    assert store.read_record("s1") is None
    assert store.refused["too_large"] == 1


def test_the_cli_copies_only_what_a_command_reads_from_a_remote_session(
    tmp_path: Path,
) -> None:
    """A 1 GiB junk.bin beside a 61 KB capture was downloaded into TMPDIR (1,005 MiB)."""
    import fsspec

    url = f"memory://cli-copy-{os.getpid()}"
    store = SessionStore(url)
    try:
        store.write_record(_record("s1"))
        write_tpu_capture(tmp_path / CAPTURE)
        _put(store, "s1", CAPTURE, (tmp_path / CAPTURE).read_bytes())
        _put(store, "s1", "junk.bin", b"\0" * (1 << 20))
        _put(store, "s1", "analysis.json", b"x" * (MAX_REPORT_BYTES + 1))

        copy = store.local_copy("s1")

        assert copy is not None
        assert sorted(p.name for p in copy.iterdir()) == ["session.json", CAPTURE]
        assert store.refused["too_large"] == 1  # the oversized report, said once
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


# -- the HTTP API: reports, analysis errors, baselines -----------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, SessionStore]]:
    settings = settings_in(tmp_path, reports=False)
    sidecar = Sidecar(settings)
    client = TestClient(create_app(sidecar), base_url="http://127.0.0.1")
    yield client, sidecar.captures.store
    client.close()


def test_a_report_is_streamed_and_refused_past_its_bound(
    api: tuple[TestClient, SessionStore],
) -> None:
    """A 400 MB analysis.json took the sidecar from 132 MiB to 1.35 GB per request."""
    client, store = api
    store.write_record(_record("s1"))
    store.write_record(_record("s2"))
    report = {"status": "OPTIMAL", "facts": {"pad": "y" * (3 << 20)}}
    _put(store, "s1", "analysis.json", json.dumps(report).encode())
    path = Path(store.session_dir("s2")) / "analysis.json"
    with path.open("wb") as out:  # sparse: larger than the bound, no disk spent
        out.truncate(MAX_REPORT_BYTES + 1)

    served = client.get("/api/v1/sessions/s1/report")
    with memory_bounded(256 << 20):
        refused = client.get("/api/v1/sessions/s2/report")

    assert served.status_code == 200 and served.json() == report
    assert refused.status_code == 500
    assert "larger than" in refused.json()["detail"] or "over" in refused.json()["detail"]
    assert store.refused["too_large"] == 1


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b'{"error": "unterminated', b"\xff\xfe\x00", b"[" * 100_000, b'{"error": 7}'],
    ids=["array", "unterminated", "not-utf8", "deep", "not-a-string"],
)
def test_a_bad_analysis_error_file_still_says_the_analysis_failed(
    api: tuple[TestClient, SessionStore], body: bytes
) -> None:
    client, store = api
    store.write_record(_record("s1"))
    _put(store, "s1", ERROR_FILE, body)

    answer = client.get("/api/v1/sessions/s1/report")

    assert answer.status_code == 500
    assert answer.json()["detail"].startswith("the analysis failed: ")


def test_a_deep_baseline_mark_does_not_fail_the_baselines_endpoint(
    api: tuple[TestClient, SessionStore],
) -> None:
    client, store = api
    marks = BaselineStore(store)
    store.fs.makedirs(marks.root, exist_ok=True)
    store.fs.pipe_file(f"{marks.root}/trainer.json", b"[" * 100_000 + b"]" * 100_000)
    store.write_record(_record("s1"))
    marks.set("other", "s1")

    answer = client.get("/api/v1/baselines")

    assert answer.status_code == 200
    assert [m["workload"] for m in answer.json()["baselines"]] == ["other"]


# -- a remote store that cannot be reached, or does not answer --------------------------


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (a hung bucket)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_gs_store_that_cannot_be_reached_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without network, ``--store gs://...`` took 52.6 s and printed 53 lines with two
    tracebacks, then said "no such ... session". Now: one line naming the cause."""
    port = _closed_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")

    result = CliRunner().invoke(main, ["analyze", "s1", "--store", "gs://bucket/x"])

    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"cannot reach 127.0.0.1:{port}" in lines[0]
    assert "STORAGE_EMULATOR_HOST" in lines[0]
    assert "Traceback" not in result.output
    # A command's listing says so too (strict); the sidecar's loops see an empty store.
    store = SessionStore("gs://bucket/x")
    assert store.session_ids() == []
    with pytest.raises(OSError, match=f"cannot reach 127.0.0.1:{port}"):
        store.records(strict=True)


@pytest.mark.parametrize(
    "command",
    [
        ["sessions", "--json"],
        ["analyze", "run:r1", "--no-xprof"],
        ["compare", "run:r1~2", "run:r2"],
        ["compare", "--base", "run:r1", "--head", "s1"],
    ],
)
def test_a_command_on_runs_of_an_unreachable_store_names_it(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's sessions, or the store's, listed from a store that does not answer: one
    line naming it (the listing said "no captures of run ..." or "0 of 0 sessions")."""
    port = _closed_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")

    result = CliRunner().invoke(main, [*command, "--store", "gs://bucket/x"])

    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"cannot reach 127.0.0.1:{port}" in lines[0], lines[0]


def test_a_store_that_does_not_answer_is_bounded_and_shown_by_readyz(
    tmp_path: Path, silent_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an outage GET /api/v1/baselines hung > 30 s and /readyz said "ok"."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", silent_endpoint)
    settings = settings_in(tmp_path, store="gs://bucket/hung", reports=False)
    sidecar = Sidecar(settings)
    store = sidecar.captures.store
    store.fs.timeout_s = 0.5  # the bound under test, small (STORE_CALL_TIMEOUT_S is 15 s)
    probe = next(t for t in sidecar.tasks if t.name == "store")

    state, detail = probe.func()
    with TestClient(create_app(sidecar), base_url="http://127.0.0.1") as client:
        baselines = client.get("/api/v1/baselines")

    assert state == "error"
    assert "did not answer" in detail and "gs://bucket/hung" in detail
    assert baselines.status_code == 503
    assert "does not answer" in baselines.json()["detail"]
    # A record's write (on the path of POST /api/v1/captures: 67.5 s on a 503) too.
    with pytest.raises(OSError, match="did not answer"):
        store.write_record(_record("s1"))


# -- procs/, memory/, requests/ and a store session's own files (these doors held) -------


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_a_planted_process_record_in_procs_names_no_run(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    from exporter.metrics.run_pids import RunPids

    shared = tmp_path / "shared"
    path = shared / schema.PROCS_DIR / "h-7.json"
    payload = json.dumps({"pid": 7, "run_id": PLANTED, "name": PLANTED, "start_unix": 1.0})
    _plant(kind, path, outside, payload.encode())
    pids = RunPids(shared, started=lambda pid: None)

    assert _read(kind, path, payload.encode(), lambda: pids.identity(7)) is None


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_the_api_reads_no_planted_memory_profile_identity(
    api: tuple[TestClient, SessionStore], tmp_path: Path, outside: Path, kind: str
) -> None:
    client, _ = api
    memory = tmp_path / "shared" / schema.MEMORY_DIR
    request_id = "1700000000-0a1b2c3d"
    path = memory / f"p1{schema.MEMORY_META_SUFFIX}"
    payload = json.dumps({"request_id": request_id}).encode()
    _plant(kind, path, outside, payload)
    (memory / f"p1{schema.MEMORY_PROFILE_SUFFIX}").write_bytes(b"\x1f\x8b")

    answer = _read(kind, path, payload, lambda: client.get(f"/api/v1/memory-profiles/{request_id}"))

    assert answer.status_code == 200  # type: ignore[attr-defined]
    assert answer.json()["profiles"] == []  # type: ignore[attr-defined]


def test_a_linked_requests_dir_gets_no_request_written_through_it(
    api: tuple[TestClient, SessionStore], tmp_path: Path, outside: Path
) -> None:
    client, _ = api
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    (shared / schema.REQUESTS_DIR).symlink_to(outside, target_is_directory=True)

    answer = client.post("/api/v1/memory-profiles")

    assert answer.status_code >= 400
    assert sorted(p.name for p in outside.iterdir()) == []


@pytest.mark.parametrize("name", ["session.json", "analysis.json"])
@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_a_planted_file_in_a_local_store_session_is_set_aside_by_the_api(
    api: tuple[TestClient, SessionStore], outside: Path, kind: str, name: str
) -> None:
    client, store = api
    store.write_record(_record("s1"))
    path = Path(store.session_dir("s1")) / name
    path.unlink(missing_ok=True)
    payload = b'{"status": "OPTIMAL", "forged_marker": true}'
    _plant(kind, path, outside, payload)

    answer = _read(kind, path, payload, lambda: client.get("/api/v1/sessions/s1/report"))

    # No record: no such session (404). A report that is a link or a FIFO is no file of
    # the session (listed as none: no report yet); a huge one is refused (500), counted.
    assert answer.status_code == (500 if (name, kind) == ("analysis.json", "huge") else 404)  # type: ignore[attr-defined]
    assert b"forged_marker" not in answer.content  # type: ignore[attr-defined]
    counted = name == "session.json" or kind == "huge"
    assert sum(store.refused.values()) == (1 if counted else 0)


def test_refused_store_objects_are_exported_by_reason(tmp_path: Path) -> None:
    sidecar = Sidecar(settings_in(tmp_path, reports=False))
    store = sidecar.captures.store
    store.write_record(_record("base-1"))
    forged = _record("base-1", status="running")
    _put(store, "zz-orphan", "session.json", forged.model_dump_json().encode())

    assert store.read_record("zz-orphan") is None
    exposition = sidecar.exposition.get().decode()

    assert 'mlprof_store_objects_refused_total{reason="id_mismatch"} 1.0' in exposition
    assert 'mlprof_store_objects_refused_total{reason="too_large"} 0.0' in exposition


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_sessions_memory_side_reads_no_linked_or_fifo_profile(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    """``compare --kind memory`` of a session followed a *.pprof.gz link out of it."""
    from exporter.analysis.sides.load import load_side
    from exporter.errors import InputError

    session = tmp_path / "store" / "plugins" / "profile" / "s1"
    session.mkdir(parents=True)
    _plant(kind, session / "h.pprof.gz", outside, b"\x1f\x8b not a profile")

    with pytest.raises(InputError, match="no device-memory profiles"):
        load_side(str(session), "memory")
