"""The sidecar's HTTP surface under attack and in a new user's hands (issue 11).

One ``mlprof serve``-equivalent (uvicorn in a thread) on temp dirs, loopback, no token:
the default mode, the one DNS rebinding and browsers can reach. A TCP listener stands
for the workload's profiler server; captures are written by a file-writing client.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from exporter import __version__
from exporter.api.app import create_app
from exporter.cli import main
from exporter.sidecar import Sidecar
from tests.harness import wait_until
from tests.sidecar_app import (
    ProfilerListener,
    ServedSidecar,
    release_fifo,
    settings_in,
    write_live_run,
)

pytestmark = pytest.mark.integration

WEBHOOK = "/api/v1/alertmanager"
CAPTURES = "/api/v1/captures"


@dataclass
class Api:
    served: ServedSidecar
    shared: Path
    store: Path
    profiler: ProfilerListener

    @property
    def url(self) -> str:
        return self.served.url

    def post(self, path: str, content: bytes, **headers: str) -> httpx.Response:
        headers = {"Content-Type": "application/json", **headers}
        return httpx.post(self.url + path, content=content, headers=headers, timeout=10)

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("api")
    # A shared dir that does not exist yet: the sidecar creates it and waits for data.
    settings = settings_in(tmp, shared_dir=str(tmp / "not" / "there" / "shared"))
    profiler = ProfilerListener()
    try:
        with ServedSidecar(settings) as served:
            yield Api(served, Path(settings.shared_dir), tmp / "store", profiler)
    finally:
        profiler.close()


def _ended(api: Api, session_id: str, what: str) -> dict[str, Any]:
    """The session's record once it is no longer running."""
    found: dict[str, Any] = wait_until(
        lambda: (r := httpx.get(f"{api.url}{CAPTURES}/{session_id}", timeout=5).json())
        and r["status"] != "running" and r,
        timeout=60, what=f"{what} to end",
    )  # fmt: skip
    return found


# -- first seconds -------------------------------------------------------------------------


def test_failure_counters_exist_at_zero_from_the_start(api: Api) -> None:
    samples = api.samples()
    assert samples[("mlprof_alerts_received_total", (("outcome", "failed"),))] == 0
    assert samples[("mlprof_alerts_received_total", (("outcome", "malformed"),))] == 0
    key = ("mlprof_captures_total", (("status", "failed"), ("trigger", "alert")))
    assert samples[key] == 0


def test_readyz_says_waiting_until_a_workload_writes(api: Api) -> None:
    def components() -> dict[str, Any]:
        body = httpx.get(f"{api.url}/readyz", timeout=5).json()
        return body["components"] if body["ready"] else {}

    first = wait_until(components, timeout=30, what="the sidecar to be ready")
    body = httpx.get(f"{api.url}/readyz", timeout=5).json()
    # The dev install builds the compiled decode core (tests/unit/test_decoder.py).
    assert (body["version"], body["decoder"]) == (__version__, "compiled")
    assert first["step_log"]["state"] == "waiting", first["step_log"]
    assert "no workload" in first["step_log"]["detail"]
    assert first["source.jax"]["state"] == "waiting"  # JAX on CPU writes no memory lines
    line = {"kind": "step", "run_id": "r0", "workload": "w", "host": "vm", "step": 1,
            "start": 1.0, "duration": 0.1, "wait": 0.0}  # fmt: skip
    (api.shared / "steps").mkdir(parents=True, exist_ok=True)
    (api.shared / "steps" / "vm-1.jsonl").write_text(json.dumps(line) + "\n")
    wait_until(lambda: components().get("step_log", {}).get("state") == "ok", timeout=30,
               what="step_log ok once a step log was read")  # fmt: skip


def test_docs_load_their_assets_from_the_sidecar(api: Api) -> None:
    page = httpx.get(f"{api.url}/docs", timeout=5).text
    assert "cdn." not in page and "https://" not in page.split("<body>")[0]
    js = next(part.split('"')[0] for part in page.split('src="')[1:] if ".js" in part)
    asset = httpx.get(api.url + js, timeout=5)
    assert asset.status_code == 200 and "SwaggerUIBundle" in asset.text


# -- A.4 DNS rebinding -----------------------------------------------------------------------


def test_a_rebound_host_name_cannot_start_a_capture(api: Api) -> None:
    body = json.dumps({"duration_ms": 100}).encode()
    rebound = api.post(CAPTURES, body, Host="attacker.example", Origin="http://attacker.example")
    assert rebound.status_code == 400, rebound.text
    for path in ("/metrics", "/api/v1/sessions"):  # reads too: no data leaves either
        got = httpx.get(api.url + path, headers={"Host": "attacker.example:80"}, timeout=5)
        assert got.status_code == 400
    own = api.post(CAPTURES, body, Host=api.url.removeprefix("http://"))
    assert own.status_code in (202, 422), own.text  # not refused for its Host


def test_allowed_hosts_setting_names_the_hosts_answered(tmp_path: Path) -> None:
    settings = settings_in(tmp_path, allowed_hosts="mlprof.internal,*.svc.example")
    app = create_app(Sidecar(settings))
    for host, status in (("mlprof.internal", 200), ("a.svc.example", 200), ("127.0.0.1", 400)):
        with TestClient(app, base_url=f"http://{host}") as client:
            assert client.get("/healthz").status_code == status, host


# -- A.5 hostile JSON ------------------------------------------------------------------------


def _alert(labels: dict[str, str]) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "X", **labels}, "annotations": {},
            "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "f1"}  # fmt: skip


HOSTILE = {
    "nested-1500": b'{"alerts": ' + b"[" * 1500 + b"]" * 1500 + b"}",
    "nested-5000": b"[" * 5000 + b"]" * 5000,
    "int-5000-digits": b'{"alerts": [], "truncatedAlerts": ' + b"1" * 5000 + b"}",
    "lone-surrogate": json.dumps(
        {"version": "4", "alerts": [_alert({"run_id": "\ud800", "mlprof_action": "capture"})]}
    ).encode(),
    "surrogate-key": b'{"alerts": [], "\\udfff": 1}',
}


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("path", [WEBHOOK, CAPTURES])
def test_hostile_json_gets_400_with_a_message(api: Api, path: str, body: bytes) -> None:
    response = api.post(path, body)
    assert response.status_code == 400, (response.status_code, response.text[:300])
    detail = response.json()["detail"]
    assert any(word in detail for word in ("deeper", "not usable", "not valid Unicode")), detail


def test_a_surrogate_in_a_capture_name_is_400(api: Api) -> None:
    response = api.post(CAPTURES, b'{"name": "a\\ud800b"}')
    assert response.status_code == 400, response.text


# -- B. run identity, C. snapshots found by trigger, tables ---------------------------------


def test_an_empty_target_list_says_so(tmp_path: Path) -> None:
    with ServedSidecar(settings_in(tmp_path)) as served:
        result = CliRunner().invoke(main, ["targets", "--url", served.url])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("no profiler targets known to the sidecar")


def test_a_session_names_the_live_run_that_owns_the_server(api: Api) -> None:
    port = api.profiler.port
    # The README example ran on this port, then ended; run.json still names it.
    write_live_run(api.shared, "llama-8b-1", "llama-8b", port, pid=101, ended_unix=1.0)
    (api.shared / "run.json").write_text((api.shared / "runs" / "llama-8b-1.json").read_text())
    write_live_run(api.shared, "demo-mlp-2", "demo-mlp", port, pid=102)

    targets = CliRunner().invoke(main, ["targets", "--url", api.url])
    assert targets.exit_code == 0, targets.output
    header, *rows = targets.output.strip().splitlines()
    assert header.split() == ["ADDRESS", "HOST", "RUN", "SOURCE", "STATE"]
    assert [row.split()[2] for row in rows] == ["demo-mlp-2"]  # the ended run is no target

    started = httpx.post(f"{api.url}{CAPTURES}", json={"run_id": "demo-mlp-2",
                         "kind": "snapshot", "duration_ms": 50}, timeout=10)  # fmt: skip
    assert started.status_code == 202, started.text
    session_id = started.json()["session_id"]
    record = _ended(api, session_id, "the snapshot session")
    assert record["status"] == "done", record
    assert (record["run_id"], record["workload"]) == ("demo-mlp-2", "demo-mlp")
    assert record["trigger"] == "snapshot"
    stored = json.loads(
        (api.store / "plugins" / "profile" / session_id / "session.json").read_text()
    )
    assert stored["workload"] == "demo-mlp"

    listed = CliRunner().invoke(main, ["sessions", "--trigger", "snapshot", "--url", api.url])
    assert listed.exit_code == 0, listed.output
    lines = [line for line in listed.output.splitlines() if line.strip()]
    assert lines[0].split()[:3] == ["SESSION", "STATUS", "TRIGGER"]
    assert lines[1].split()[:3] == [session_id, "done", "snapshot"]


# -- A.3 special files in the shared directory ---------------------------------------------


def test_fifos_in_the_shared_dir_wedge_nothing(api: Api) -> None:
    fifos = [api.shared / "runs" / "r9.json", api.shared / "steps" / "x.jsonl"]
    (api.shared / "runs").mkdir(parents=True, exist_ok=True)
    for fifo in fifos:
        os.mkfifo(fifo)
    line = {"kind": "step", "run_id": "r9", "workload": "w", "host": "vm", "step": 1,
            "start": 1.0, "duration": 0.1, "wait": 0.0}  # fmt: skip
    (api.shared / "steps" / "vm-9.jsonl").write_text(json.dumps(line) + "\n")
    try:
        wait_until(lambda: 'run_id="r9"' in httpx.get(f"{api.url}/metrics", timeout=5).text,
                   timeout=30, what="the run beside the FIFOs to be tailed")  # fmt: skip
        for _ in range(50):  # 43 scrapes used to exhaust every worker thread
            assert httpx.get(f"{api.url}/metrics", timeout=5).status_code == 200
        assert httpx.get(f"{api.url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{api.url}/api/v1/targets", timeout=5).status_code == 200
        errors = api.samples()[("mlprof_step_log_errors_total", (("reason", "not_regular_file"),))]
        assert errors == 1
    finally:
        for fifo in fifos:
            release_fifo(fifo)
            fifo.unlink()


def test_a_stalled_loop_makes_readyz_not_ready(tmp_path: Path) -> None:
    """A loop wedged in a call shows as stalled: /readyz 503, /healthz still answers."""
    sidecar = Sidecar(settings_in(tmp_path))
    task = next(t for t in sidecar.tasks if t.name == "step_log")
    calls, release = [], threading.Event()
    original = task.func

    def first_ok_then_wedged() -> Any:
        calls.append(1)
        if len(calls) > 1:
            release.wait(30)
        return original()

    task.func = first_ok_then_wedged
    task.status.stalled_after_s = 0.5  # shipped: three intervals, at least 30 s
    try:
        with TestClient(create_app(sidecar), base_url="http://127.0.0.1") as client:
            wait_until(lambda: len(calls) > 1, timeout=30, what="the second, wedged call")
            answer = wait_until(
                lambda: (r := client.get("/readyz")).status_code == 503 and r.json(),
                timeout=30, what="/readyz to report the stalled loop",
            )  # fmt: skip
            assert answer["components"]["step_log"]["state"] == "stalled"
            assert client.get("/healthz").status_code == 200
            release.set()
    finally:
        release.set()


def test_the_mcp_capture_tool_asks_for_several_captures(api: Api) -> None:
    """MCP's ``capture`` takes ``captures`` as the API and ``mlprof capture --captures``
    do: the session holds that many traces of the target (before, the tool sent none and
    a baseline taken through it had no replicates)."""
    from exporter.mcp_server import ProfileTools

    port = api.profiler.port
    write_live_run(api.shared, "mcp-reps-1", "mcp-reps", port, pid=103)
    address = f"127.0.0.1:{port}"
    wait_until(
        lambda: address in httpx.get(f"{api.url}/api/v1/targets", timeout=5).text,
        timeout=30, what="the profiler listener among the targets",
    )  # fmt: skip
    tools = ProfileTools(str(api.store), api_url=api.url)
    started = tools.capture(duration_ms=50, targets=[address], captures=2)
    record = _ended(api, started["session_id"], "the MCP capture session")
    assert record["status"] == "done", record
    assert record["options"]["captures"] == 2, record["options"]
    assert sum(len(t["files"]) for t in record["targets"]) == 2, record["targets"]
