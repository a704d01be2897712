"""The capture engine against real JAX workloads' profiler servers on loopback.

Three demo workloads (CPU JAX, throttled to keep two cores usable) run once for the
module; a sidecar (the real app under uvicorn) knows them through run.json and
MLPROF_TARGETS, pushes flame graphs to a Pyroscope double, and is driven over HTTP
and through the CLI.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from click.testing import CliRunner

from exporter.api.app import create_app
from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRequest
from exporter.capture.session import SessionRecord
from exporter.capture.store import SessionStore
from exporter.capture.targets import ProfilerTarget
from exporter.capture.watcher import SessionWatcher
from exporter.cli import main
from exporter.config import load_settings
from exporter.profiles.xplane import load_capture
from exporter.sidecar import Sidecar
from tests.harness import Proc, free_port, wait_http, wait_until
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.integration

TOKEN = "capture-test-token"
MAX_DURATION_MS = 1500
TINY = ["--batch", "32", "--hidden", "64", "--features", "32"]


@dataclass
class Stack:
    url: str
    tmp: Path
    store: Path
    logdir: Path
    addresses: list[str]  # the three workloads' profiler servers
    dead: str  # a static target nobody listens on
    run_ids: list[str]
    receiver: PyroscopeReceiver
    sidecar: Sidecar

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def post(self, path: str, body: Any, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=30)

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers(), params=params, timeout=30)

    def capture(self, **body: Any) -> dict[str, Any]:
        response = self.post("/api/v1/captures", body)
        assert response.status_code == 202, response.text
        return response.json()  # type: ignore[no-any-return]

    def finished(self, session_id: str, timeout: float = 60) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            record: dict[str, Any] = self.get(f"/api/v1/captures/{session_id}").json()
            return record if record["status"] != "running" else None

        return wait_until(done, timeout=timeout, what=f"session {session_id} to finish")

    def session_dir(self, session_id: str) -> Path:
        return self.store / "plugins" / "profile" / session_id


def _workload(tmp: Path, index: int, port: int) -> Proc:
    shared = tmp / f"shared{index}"
    shared.mkdir()
    # The demo's input-pipeline knob slows each step: small captures, cores left free.
    (shared / "demo-input-delay").write_text("0.05")
    return Proc.python(
        ["-m", "exporter.demo.workload", "--shared-dir", str(shared),
         "--profiler-port", str(port), "--name", f"capture-w{index}", *TINY],
        tmp / f"workload{index}.log",
    )  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("capture")
    ports = [free_port() for _ in range(3)]
    workloads = [_workload(tmp, i, port) for i, port in enumerate(ports)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    dead = f"127.0.0.1:{free_port()}"
    receiver = PyroscopeReceiver().start()
    port = free_port()
    settings = load_settings(
        listen=f"127.0.0.1:{port}",
        shared_dir=str(tmp / "shared0"),  # workload 0 is found through its run.json
        store=str(tmp / "store"),
        capture_logdir=str(tmp / "captures"),
        targets=[*addresses[1:], dead],
        auth_token=TOKEN,
        pyroscope_url=receiver.url,
        spool_dir=str(tmp / "spool"),
        collect_interval_s=0.5,
        discovery_interval_s=0.5,
        capture_max_duration_ms=MAX_DURATION_MS,
        capture_timeout_s=60,
        snapshot_interval_s=1.0,
        snapshot_duration_ms=300,
        snapshot_max_count=2,
    )
    sidecar = Sidecar(settings)
    server = uvicorn.Server(
        uvicorn.Config(create_app(sidecar), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", timeout=30)
        run_ids = [
            wait_until(
                lambda i=i: json.loads((tmp / f"shared{i}" / "run.json").read_text())["run_id"],
                timeout=120,
                what=f"workload {i}'s run.json (log {workloads[i].log})",
            )
            for i in range(3)
        ]
        for i in range(3):  # past JIT compilation: a capture then sees steady steps
            wait_until(lambda i=i: _steps(tmp / f"shared{i}") >= 10, timeout=120,
                       what=f"workload {i} to run 10 steps (log {workloads[i].log})")  # fmt: skip
        stack = Stack(url, tmp, tmp / "store", tmp / "captures", addresses, dead, run_ids,
                      receiver, sidecar)  # fmt: skip
        wait_until(
            lambda: (
                {t["address"] for t in stack.get("/api/v1/targets").json()["targets"]}
                >= {*addresses, dead}
            ),
            timeout=30,
            what="the sidecar to know every target",
        )
        yield stack
    finally:
        server.should_exit = True
        thread.join(30)
        receiver.stop()
        for workload in workloads:
            workload.stop()


def _steps(shared: Path) -> int:
    return sum(f.read_text().count('"kind":"step"') for f in (shared / "steps").glob("*.jsonl"))


def _parse_capture(path: Path) -> list[str]:
    with load_capture(path) as capture:
        return list(capture.plane_names)


def test_targets_are_listed_with_their_reachability(stack: Stack) -> None:
    def probed() -> dict[str, dict[str, Any]] | None:
        found = {t["address"]: t for t in stack.get("/api/v1/targets").json()["targets"]}
        return found if all(t["health"]["reachable"] is not None for t in found.values()) else None

    targets = wait_until(probed, timeout=30, what="every target probed")
    local = targets[stack.addresses[0]]
    assert (local["source"], local["run_id"]) == ("local", stack.run_ids[0])
    assert targets[stack.addresses[1]]["source"] == "static"
    assert all(targets[a]["health"]["reachable"] is True for a in stack.addresses)
    assert targets[stack.dead]["health"]["reachable"] is False
    assert "cannot connect" in targets[stack.dead]["health"]["error"]


def test_three_workloads_captured_concurrently_into_one_session(stack: Stack) -> None:
    started = stack.capture(targets=stack.addresses, duration_ms=500, name="fanout")
    session_id = started["session_id"]
    assert session_id.startswith("fanout-")
    assert started["status"] == "running"
    assert started["status_url"] == f"/api/v1/captures/{session_id}"
    record = stack.finished(session_id)
    assert record["status"] == "done", record
    assert [t["status"] for t in record["targets"]] == ["ok", "ok", "ok"]
    starts = sorted(t["started"] for t in record["targets"])
    finishes = sorted(t["finished"] for t in record["targets"])
    assert starts[-1] < finishes[0], "targets were captured one after another, not at once"
    for target in record["targets"]:
        [name] = target["files"]
        path = stack.session_dir(session_id) / name
        assert path.stat().st_size == target["bytes"] > 0
        assert "/host:CPU" in _parse_capture(path)
    on_disk = json.loads((stack.session_dir(session_id) / "session.json").read_text())
    assert on_disk["status"] == "done" and on_disk["trigger"] == "manual"
    assert not (stack.logdir / "plugins" / "profile" / session_id).exists()  # staging cleared
    listed = stack.get("/api/v1/sessions", trigger="manual").json()["sessions"]
    assert session_id in [s["id"] for s in listed]

    # After the session: flame graphs converted, stored as pprof and pushed (item 6).
    def processed() -> dict[str, Any] | None:
        current: dict[str, Any] = stack.get(f"/api/v1/captures/{session_id}").json()
        return current if current["processed"] else None

    done = wait_until(processed, timeout=120, what=f"session {session_id} processed")
    graphs = [a for a in done["artifacts"] if a["kind"] == "flamegraph"]
    assert {a["host"] for a in graphs} == {t["host"] for t in record["targets"]}
    assert all("error" not in a for a in graphs), graphs
    assert {a["push"]["status"] for a in graphs} == {"ok"}
    for artifact in graphs:
        assert (stack.session_dir(session_id) / artifact["file"]).stat().st_size > 0
    pushed = [s for s in stack.receiver.received if s.labels.get("session_id") == session_id]
    assert len(pushed) == len(graphs)
    assert {s.labels["run_id"] for s in pushed} >= {stack.run_ids[0]}


def test_a_capture_by_hand_takes_several_captures_as_an_alert_does(stack: Stack) -> None:
    """`"captures": 2`: the target's two traces one after another, named by round, so a
    baseline taken by hand has replicates of its own (as MLPROF_ALERT_CAPTURES gives an
    alert's session)."""
    started = stack.capture(targets=[stack.addresses[0]], duration_ms=600, captures=2)
    assert started["options"]["captures"] == 2
    record = stack.finished(started["session_id"])
    assert record["status"] == "done", record
    [target] = record["targets"]
    assert target["status"] == "ok", target
    stem = target["files"][0].split(".r1.")[0]
    assert target["files"] == [f"{stem}.r1.xplane.pb", f"{stem}.r2.xplane.pb"]
    for name in target["files"]:
        assert "/host:CPU" in _parse_capture(stack.session_dir(started["session_id"]) / name)


def test_a_second_capture_on_a_busy_target_is_reported_busy(stack: Stack) -> None:
    target = stack.addresses[1]
    first = stack.capture(targets=[target], duration_ms=5000)  # clamped to the maximum
    assert first["options"]["duration_ms"] == MAX_DURATION_MS
    assert first["clamped"]["duration_ms"] == {"requested": 5000, "max": MAX_DURATION_MS}
    second = stack.capture(targets=[target], duration_ms=300)
    [busy] = second["targets"]
    assert busy["status"] == "busy"
    assert f"busy with session {first['session_id']}" in busy["error"]
    assert stack.finished(second["session_id"])["status"] == "failed"
    assert stack.finished(first["session_id"])["status"] == "done"


def test_a_server_busy_with_someone_elses_session_is_reported_busy(stack: Stack) -> None:
    from xprof.convert import _pywrap_profiler_plugin

    target = stack.addresses[2]
    outside_dir = stack.tmp / "outside"

    stop = threading.Event()

    def outside_capture() -> None:  # e.g. XProf's own capture page, again and again
        while not stop.is_set():
            # A try may lose the server to one of ours; then it simply runs again.
            with contextlib.suppress(Exception):
                _pywrap_profiler_plugin.trace(target, str(outside_dir), "", True, 3000, 1,
                                              {"session_id": "outside"})  # fmt: skip

    def busy_record() -> dict[str, Any]:  # empty (falsy) until the server was busy
        record = stack.finished(stack.capture(targets=[target], duration_ms=300)["session_id"])
        return record if record["targets"][0]["status"] == "busy" else {}

    thread = threading.Thread(target=outside_capture)
    thread.start()
    try:  # until a capture of ours meets the outside session (no guess at when it starts)
        record = wait_until(busy_record, timeout=120, what="a capture to find the server busy")
    finally:
        stop.set()
        thread.join(60)
    [result] = record["targets"]
    assert result["status"] == "busy", result
    assert "another profiling session is active" in result["error"]
    assert record["status"] == "failed"


def test_an_unreachable_target_makes_the_session_partial(stack: Stack) -> None:
    record = stack.finished(
        stack.capture(targets=[stack.addresses[1], stack.dead], duration_ms=300)["session_id"]
    )
    assert record["status"] == "partial"
    results = {t["address"]: t for t in record["targets"]}
    assert results[stack.addresses[1]]["status"] == "ok"
    assert results[stack.dead]["status"] == "unreachable"
    assert f"cannot connect to {stack.dead}" in results[stack.dead]["error"]
    health = {t["address"]: t["health"] for t in stack.get("/api/v1/targets").json()["targets"]}
    assert health[stack.dead]["reachable"] is False


def test_capture_into_a_memory_store(stack: Stack) -> None:
    store = SessionStore(f"memory://capture-test-{time.monotonic_ns()}")
    logdir = stack.tmp / "memory-staging"
    engine = CaptureEngine(store, logdir, CaptureLimits(timeout_s=60))
    target = ProfilerTarget(stack.addresses[0], "w0", stack.run_ids[0], "static")
    try:
        submitted = engine.submit(CaptureRequest(duration_ms=300, requester="test"), [target])
        record = engine.wait(submitted.id, timeout=60)
    finally:
        engine.close()
    assert record is not None and record.status == "done", record
    assert record.run_id == stack.run_ids[0]
    [name] = record.targets[0].files
    assert store.files(record.id)[name] > 0
    assert store.read_record(record.id) == record
    with store.local_file(record.id, name) as path:
        assert "/host:CPU" in _parse_capture(path)
    assert not (logdir / "plugins" / "profile" / record.id).exists()


class FlakyImportStore(SessionStore):
    """A real memory:// store refusing the first ``failures`` imports (e.g. a gs:// 503)."""

    def __init__(self, failures: int) -> None:
        super().__init__(f"memory://flaky-import-{time.monotonic_ns()}")
        self.failures = failures

    def import_file(self, session_id: str, source: Path, *, below: Path | None = None) -> int:
        if self.failures:
            self.failures -= 1
            raise OSError("503 Service Unavailable")
        return super().import_file(session_id, source, below=below)


def test_a_capture_the_store_refused_is_kept_and_imported_later(stack: Stack) -> None:
    store = FlakyImportStore(failures=2)  # the engine's import and the watcher's first retry
    logdir = stack.tmp / "flaky-staging"
    engine = CaptureEngine(store, logdir, CaptureLimits(timeout_s=60))
    completed: list[SessionRecord] = []
    engine.on_complete.append(completed.append)
    target = ProfilerTarget(stack.addresses[0], "w0", stack.run_ids[0], "static")
    try:
        submitted = engine.submit(CaptureRequest(duration_ms=300, requester="test"), [target])
        record = engine.wait(submitted.id, timeout=60)
    finally:
        engine.close()
    assert record is not None and record.status == "failed", record
    [result] = record.targets
    [name] = result.unimported
    assert "503 Service Unavailable" in result.error and "is retried" in result.error
    staging = logdir / "plugins" / "profile" / record.id
    assert (staging / name).stat().st_size > 0  # the only copy is still there
    assert completed == []  # nothing to convert until the file is in the store

    watcher = SessionWatcher(store, logdir)
    handed: list[SessionRecord] = []
    watcher.on_complete.append(handed.append)
    watcher.poll()  # the store fails once more: kept again, nothing handed over
    assert (staging / name).is_file() and handed == []
    watcher.poll()
    imported = store.read_record(record.id)
    assert imported is not None and imported.status == "done", imported
    assert imported.targets[0].files == [name] and imported.targets[0].unimported == []
    with store.local_file(record.id, name) as path:
        assert "/host:CPU" in _parse_capture(path)
    assert not staging.exists()
    assert [r.id for r in handed] == [record.id]


PROGRAMMATIC = """
import sys, jax.numpy as jnp
from exporter import sdk
with sdk.run("programmatic-demo", shared_dir=sys.argv[1]) as run:
    with run.profile("warmup"):
        x = jnp.ones((128, 128))
        for _ in range(5):
            x = (x @ x / 128).block_until_ready()
    print(run.run_id)
"""


def test_programmatic_capture_is_picked_up_by_the_watcher(stack: Stack) -> None:
    script = stack.tmp / "programmatic.py"
    script.write_text(PROGRAMMATIC)
    proc = Proc(
        [sys.executable, str(script), str(stack.tmp / "shared-programmatic")],
        stack.tmp / "programmatic.log",
        env={"MLPROF_CAPTURE_LOGDIR": str(stack.logdir)},
    )
    assert proc.popen.wait(120) == 0, proc.output()
    run_id = proc.output().strip().splitlines()[-1]

    def stored() -> dict[str, Any] | None:
        found = stack.get("/api/v1/sessions", trigger="programmatic").json()["sessions"]
        mine = [s for s in found if s["run_id"] == run_id and s["processed"]]
        return mine[0] if mine else None

    record = wait_until(stored, timeout=90, what="the programmatic session in the store")
    assert record["id"].startswith("warmup-") and record["status"] == "done"
    [target] = record["targets"]
    assert any(f.endswith(".xplane.pb") for f in target["files"])
    assert (stack.session_dir(record["id"]) / "session.json").is_file()
    assert not (stack.logdir / "plugins" / "profile" / record["id"]).exists()
    graphs = [a for a in record["artifacts"] if a["kind"] == "flamegraph"]
    assert graphs and {a["push"]["status"] for a in graphs} == {"ok"}
    pushed = [s for s in stack.receiver.received if s.labels.get("session_id") == record["id"]]
    assert pushed and {s.labels["trigger"] for s in pushed} == {"programmatic"}
    assert {s.labels["service_name"] for s in pushed} == {"programmatic-demo"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "../etc"}, "session name '../etc': expected"),
        ({"name": "a/b"}, "session name 'a/b': expected"),
        ({"name": ".."}, "session name '..': expected"),
        ({"name": "x" * 200}, "expected 1-128 characters"),
        ({"duration_ms": 0}, "duration_ms: Input should be greater than or equal to 1"),
        ({"duration_ms": -5}, "duration_ms: Input should be greater than or equal to 1"),
        ({"duration_ms": 10**9}, "duration_ms: Input should be less than or equal to 3600000"),
        ({"duration_ms": "soon"}, "duration_ms: Input should be a valid integer"),
        ({"host_tracer_level": 7}, "host_tracer_level: Input should be less than or equal to 3"),
        ({"kind": "movie"}, "kind: Input should be 'trace' or 'snapshot'"),
        ({"captures": 0}, "captures: Input should be greater than or equal to 1"),
        ({"captures": 17}, "captures: Input should be less than or equal to 16"),
        ({"kind": "snapshot", "captures": 3}, "captures: a snapshot is one window"),
        ({"targets": ["10.9.9.9:9999"]}, "'10.9.9.9:9999' is not a known profiler target"),
        ({"run_id": "no-such-run"}, "is not a known profiler target of run 'no-such-run'"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_bad_capture_requests_get_4xx_naming_the_field(
    stack: Stack, body: dict[str, Any], message: str
) -> None:
    before = set(stack.sidecar.captures.store.session_ids())
    response = stack.post("/api/v1/captures", {"targets": [stack.addresses[1]]} | body)
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]
    assert set(stack.sidecar.captures.store.session_ids()) == before


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP response with a Content-Length body, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data or len(data) < _response_size(data):
        more = sock.recv(4096)
        if not more:
            break
        data += more
    return data


def _response_size(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(data)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_is_refused_before_it_is_all_sent(stack: Stack, framing: str) -> None:
    host, _, port = stack.url.removeprefix("http://").partition(":")
    head = (
        f"POST /api/v1/captures HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        if framing == "content-length":  # announces 1 GB and sends none of it
            sock.sendall(f"{head}Content-Length: {10**9}\r\n\r\n".encode())
        else:  # 70 KiB so far, and the body has not ended
            chunk = b" " * 70_000
            sock.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        answer = _read_response(sock)  # the server must answer now: the rest never comes
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request body over 65536 bytes" in answer


def test_auth_and_session_lookups(stack: Stack) -> None:
    body = {"targets": [stack.addresses[1]], "duration_ms": 300}
    assert stack.post("/api/v1/captures", body, token=None).status_code == 401
    assert stack.post("/api/v1/captures", body, token="wrong").status_code == 403
    assert httpx.get(f"{stack.url}/api/v1/sessions", timeout=10).status_code == 401
    assert stack.get("/api/v1/captures/no-such-session").status_code == 404
    bad = stack.get("/api/v1/captures/..evil")
    assert bad.status_code == 400 and "session name" in bad.json()["detail"]
    assert stack.post("/api/v1/captures", "[1]").status_code == 422


def test_snapshot_ring_keeps_windows_and_a_snapshot_stores_the_newest(stack: Stack) -> None:
    target = stack.addresses[2]
    started = stack.post("/api/v1/snapshots/start", {"targets": [target]}).json()["snapshots"]
    assert [(s["address"], s["mode"]) for s in started] == [(target, "ring")]
    try:
        wait_until(
            lambda: stack.get("/api/v1/snapshots").json()["snapshots"][0]["windows"] >= 1,
            timeout=60,
            what="a ring window",
        )
        record = stack.finished(stack.capture(targets=[target], kind="snapshot")["session_id"])
    finally:
        stopped = stack.post("/api/v1/snapshots/stop", {}).json()["stopped"]
    assert stopped == [target]
    assert record["status"] == "done", record
    assert record["kind"] == "snapshot"
    [result] = record["targets"]
    assert result["mode"] == "ring"
    [name] = result["files"]
    assert "/host:CPU" in _parse_capture(stack.session_dir(record["id"]) / name)
    assert stack.get("/api/v1/snapshots").json()["snapshots"] == []
    assert not list((stack.logdir / ".ring" / "plugins" / "profile").glob("*/*.xplane.pb"))


def test_cli_capture_sessions_and_targets(stack: Stack) -> None:
    runner = CliRunner()
    env = {"MLPROF_AUTH_TOKEN": TOKEN}
    base = ["--url", stack.url]
    result = runner.invoke(
        main, ["capture", *base, "-t", stack.addresses[1], "-d", "300", "--name", "cli"], env=env
    )
    assert result.exit_code == 0, result.output
    assert "session cli-" in result.output and ": done" in result.output
    assert stack.addresses[1] in result.output

    partial = runner.invoke(main, ["capture", *base, "-t", stack.dead, "-d", "300"], env=env)
    assert partial.exit_code == 1
    assert "failed" in partial.output and "unreachable" in partial.output

    unknown = runner.invoke(main, ["capture", *base, "-t", "10.1.1.1"], env=env)
    assert unknown.exit_code == 1
    assert "'10.1.1.1' is not a known profiler target" in unknown.output

    listed = runner.invoke(main, ["sessions", *base, "--json"], env=env)
    assert listed.exit_code == 0
    assert any(s["id"].startswith("cli-") for s in json.loads(listed.output)["sessions"])

    targets = runner.invoke(main, ["targets", *base], env=env)
    assert (
        targets.exit_code == 0 and stack.dead in targets.output and "unreachable" in targets.output
    )

    denied = runner.invoke(main, ["sessions", *base], env={"MLPROF_AUTH_TOKEN": "nope"})
    assert denied.exit_code == 2 and "wrong bearer token" in denied.output


def test_continuous_snapshot_without_a_device_trace_is_a_failure_with_the_reason(
    stack: Stack,
) -> None:
    from exporter.capture.snapshots import SnapshotService

    store = SessionStore(f"memory://continuous-{time.monotonic_ns()}")
    engine = CaptureEngine(store, stack.tmp / "continuous", CaptureLimits(timeout_s=60))
    snapshots = SnapshotService(engine, mode="continuous")
    target = ProfilerTarget(stack.addresses[0], "w0", stack.run_ids[0], "static", "cpu")
    try:
        [started] = snapshots.start([target])
        assert started["mode"] == "continuous" and "error" not in started
        submitted = engine.submit(CaptureRequest(kind="snapshot", trigger="snapshot"), [target])
        record = engine.wait(submitted.id, timeout=60)
        assert record is not None and record.status == "failed"
        [result] = record.targets
        assert result.mode == "continuous"
        assert "get_snapshot succeeded but wrote nothing" in result.error
    finally:
        assert snapshots.stop() == [target.address]
    # Continuous profiling stopped: the server takes ordinary captures again.
    after = engine.wait(engine.submit(CaptureRequest(duration_ms=300), [target]).id, 60)
    engine.close()
    assert after is not None and after.status == "done", after


def test_capture_counter_is_exported(stack: Stack) -> None:
    text = httpx.get(f"{stack.url}/metrics", headers=stack.headers(), timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("mlprof_captures_total{")]
    assert any('status="done"' in line and 'trigger="manual"' in line for line in lines), lines
    assert any('status="partial"' in line for line in lines), lines


def test_cli_snapshot_start_status_stop(stack: Stack) -> None:
    runner = CliRunner()
    env = {"MLPROF_AUTH_TOKEN": TOKEN}
    base = ["--url", stack.url]
    target = stack.addresses[1]
    started = runner.invoke(main, ["snapshot", "start", *base, "-t", target], env=env)
    assert started.exit_code == 0, started.output
    assert target in started.output and "ring" in started.output
    status = runner.invoke(main, ["snapshot", "status", *base, "--json"], env=env)
    assert [row["address"] for row in json.loads(status.output)] == [target]
    stopped = runner.invoke(main, ["snapshot", "stop", *base], env=env)
    assert stopped.exit_code == 0 and f"stopped: {target}" in stopped.output
    empty = runner.invoke(main, ["snapshot", "status", *base], env=env)
    assert "no targets kept for snapshots" in empty.output
