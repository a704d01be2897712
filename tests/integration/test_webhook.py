"""The Alertmanager webhook against a real sidecar, capture engine and JAX profiler server.

One demo workload (with its profiler server, a process) and one sidecar (the real app
under uvicorn, in this process, as in test_capture.py), both on loopback, shared by the
tests of this module; alerts are posted the way Alertmanager posts them. A listener on
127.0.0.2 stands for a foreign address named in payloads: it must never see a
connection.

The sidecar's alert policy runs on a clock the tests move past the cooldown (a test
that needs a capture to start skips it) instead of sleeping through a real one: the
cooldown is long (``COOLDOWN_S``), so a burst can never outlast it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from exporter.api.app import create_app
from exporter.config import load_settings
from exporter.sidecar import Sidecar
from tests.harness import Proc, free_port, wait_http, wait_until

pytestmark = pytest.mark.integration

TOKEN = "webhook-test-token"
# Never waited for: the policy's clock is moved past it (AlertClock).
COOLDOWN_S = 600.0
MAX_BODY = 1024 * 1024
WEBHOOK = "/api/v1/alertmanager"


class ForeignListener:
    """A TCP listener on 127.0.0.2 that counts the connections it gets (should be none)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.2", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.2:{self.sock.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


class AlertClock:
    """The alert policy's clock: monotonic time plus whatever the tests skipped."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def skip(self, seconds: float) -> None:
        self.skipped += seconds


@dataclass
class Loop:
    url: str
    store: Path
    shared: Path
    run_id: str
    host: str
    foreign: ForeignListener
    server: threading.Thread
    profiler_port: int
    clock: AlertClock
    last_capture: float = 0.0
    fingerprints: list[str] = field(default_factory=list)

    def post(self, body: Any, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(self.url + WEBHOOK, content=content, headers=headers, timeout=60)

    def session(self, session_id: str) -> dict[str, Any] | None:
        path = self.store / "plugins" / "profile" / session_id / "session.json"
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, json.JSONDecodeError):
            return None  # not written yet, or caught mid-write

    def sessions(self) -> list[str]:
        root = self.store / "plugins" / "profile"
        return sorted(p.name for p in root.iterdir()) if root.is_dir() else []

    def wait_cooldown(self) -> None:
        """Before a test that needs a capture to start: the captures already started end
        (the global limit is 1; a busy machine stretches them), and the run's cooldown
        passes on the policy's clock (no sleep)."""
        wait_until(
            lambda: all(
                (r := self.session(s)) and r["status"] != "running" for s in self.sessions()
            ),
            timeout=90,
            what="the captures already started to end",
        )
        remaining = self.last_capture + COOLDOWN_S + 0.5 - self.clock()
        if remaining > 0:
            self.clock.skip(remaining)

    def wait_counted(self, outcome: str, at_least: float) -> None:
        wait_until(
            lambda: self.alerts_received().get(outcome, 0) >= at_least,
            timeout=30,
            what=f"mlprof_alerts_received_total{{outcome={outcome!r}}} >= {at_least}",
        )

    def alerts_received(self) -> dict[str, float]:
        text = httpx.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ).text
        return {
            s.labels["outcome"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "mlprof_alerts_received_total"
        }


def alert(
    fingerprint: str,
    status: str = "firing",
    name: str = "MLWorkloadDutyCycleLow",
    annotations: dict[str, str] | None = None,
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, "severity": "warning", **labels},
        "annotations": {"summary": "Accelerator duty cycle is low.", **(annotations or {})},
        "startsAt": "2026-11-29T07:00:00.5Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example/graph?g0.expr=x",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "receiver": "mlprof",
        "status": "firing",
        "alerts": list(alerts),
        "groupLabels": {"alertname": "MLWorkloadDutyCycleLow"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example:9093",
        "version": "4",
        "groupKey": '{}:{alertname="MLWorkloadDutyCycleLow"}',
        "truncatedAlerts": 0,
    }


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    tmp = tmp_path_factory.mktemp("webhook")
    shared, store = tmp / "shared", tmp / "store"
    port, profiler_port = free_port(), free_port()
    settings = load_settings(
        listen=f"127.0.0.1:{port}",
        shared_dir=str(shared),
        store=str(store),
        auth_token=TOKEN,
        collect_interval_s=0.5,
        alert_cooldown_s=COOLDOWN_S,
        alert_max_concurrent=1,
        alert_max_body_bytes=MAX_BODY,
        discovery_interval_s=1,
        # A second known target (the same server under another name, of no known run):
        # lets one alert wait on the global limit while another capture runs.
        targets=[f"localhost:{profiler_port}"],
    )
    # The demo's input-pipeline knob slows each step (as in test_capture.py): a capture
    # then holds a few hundred steps, not thousands, and the workload leaves the cores
    # to the sidecar and the rest of the suite. No test here reads the workload's speed.
    shared.mkdir(parents=True)
    (shared / "demo-input-delay").write_text("0.05")
    workload = Proc.python(
        ["-m", "exporter.demo.workload", "--shared-dir", str(shared),
         "--profiler-port", str(profiler_port),
         "--batch", "64", "--features", "64", "--hidden", "128"],
        tmp / "workload.log",
    )  # fmt: skip
    clock = AlertClock()
    sidecar = Sidecar(settings, alert_clock=clock)
    server = uvicorn.Server(
        uvicorn.Config(create_app(sidecar), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    foreign = ForeignListener()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", timeout=60)
        run = wait_until(
            lambda: json.loads((shared / "run.json").read_text()),
            timeout=120,
            what=f"the workload's run.json (log: {workload.log})",
        )
        yield Loop(
            url, store, shared, run["run_id"], run["host"], foreign, thread, profiler_port, clock
        )
    finally:
        foreign.close()
        server.should_exit = True
        thread.join(30)
        workload.stop()


def test_token_is_required_and_compared(loop: Loop) -> None:
    body = payload(alert("auth1", run_id=loop.run_id, mlprof_action="capture"))
    missing = loop.post(body, token=None)
    assert missing.status_code == 401
    assert "bearer token" in missing.json()["detail"]
    assert missing.headers["www-authenticate"] == "Bearer"
    assert loop.post(body, token="not-the-token").status_code == 403
    assert loop.post(body, token=TOKEN[:-1]).status_code == 403
    loop.wait_counted("unauthorized", 3)
    assert loop.sessions() == []


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"alerts": [', 400, "not valid JSON"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b"[1, 2]", 422, "got a JSON list"),
        (b'{"version": "4"}', 422, "alerts: Field required"),
        (
            json.dumps(payload({"labels": {"alertname": "X"}})).encode(),
            422,
            "alerts[0].status: Field required",
        ),
        (
            json.dumps(payload({"status": "pending", "labels": {}})).encode(),
            422,
            "alerts[0].status: Input should be 'firing' or 'resolved'",
        ),
        (
            json.dumps(payload({"status": "firing", "labels": {"a": 1}})).encode(),
            422,
            "alerts[0].labels.a: Input should be a valid string",
        ),
    ],
)
def test_bad_bodies_are_refused_naming_what_is_wrong(
    loop: Loop, body: bytes, status: int, message: str
) -> None:
    response = loop.post(body)
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]


def test_oversized_bodies_get_413(loop: Loop) -> None:
    big = json.dumps(payload(alert("big", run_id=loop.run_id, pad="x" * MAX_BODY))).encode()
    declared = loop.post(big)
    assert declared.status_code == 413
    assert "MLPROF_ALERT_MAX_BODY_BYTES" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    streamed = httpx.post(
        loop.url + WEBHOOK,
        content=chunks(),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    assert streamed.status_code == 413
    loop.wait_counted("too_large", 2)
    assert httpx.get(f"{loop.url}/healthz", timeout=10).status_code == 200


def test_unknown_hosts_foreign_addresses_and_non_actions_start_nothing(loop: Loop) -> None:
    foreign = loop.foreign.address
    body = payload(
        alert("u1", host="no-such-host.example", mlprof_action="capture"),
        alert("u2", instance=foreign, mlprof_action="capture"),
        alert("u3", run_id="run-that-does-not-exist", mlprof_action="capture"),
        alert("u4", host=foreign.partition(":")[0], mlprof_action="snapshot"),
        alert("u5", status="resolved", run_id=loop.run_id, mlprof_action="capture"),
        alert("u6", run_id=loop.run_id),
        alert("u7", run_id=loop.run_id, mlprof_action="reboot"),
        alert("u8", run_id=loop.run_id, mlprof_action="capture", mlprof_duration_ms="soon"),
    )
    response = loop.post(body)
    assert response.status_code == 202
    answer = response.json()
    assert answer["sessions"] == []
    outcomes = {a["fingerprint"]: (a["outcome"], a.get("reason", "")) for a in answer["alerts"]}
    assert outcomes["u1"] == (
        "no_target",
        "no known profiler target matches host='no-such-host.example'",
    )
    assert outcomes["u2"] == ("no_target", "no known profiler target matches host='127.0.0.2'")
    assert outcomes["u3"][0] == outcomes["u4"][0] == "no_target"
    assert outcomes["u5"] == ("resolved", "alert is resolved")
    assert outcomes["u6"] == ("no_action", "no mlprof_action label or annotation")
    assert outcomes["u7"][0] == "no_action" and "'reboot'" in outcomes["u7"][1]
    assert outcomes["u8"][0] == "invalid" and "mlprof_duration_ms='soon'" in outcomes["u8"][1]
    assert loop.sessions() == []
    assert loop.foreign.connections == 0


def test_firing_alert_captures_the_known_target_and_records_the_alert(loop: Loop) -> None:
    foreign = loop.foreign.address
    labels = {
        "run_id": loop.run_id,
        "instance": foreign,  # the scraped address is not the run's: the run decides
        "mlprof_action": "capture",
        "mlprof_duration_ms": "800",
        "profiler_address": foreign,  # never dialled
    }

    def started() -> dict[str, Any] | None:
        # The sidecar discovers the workload's profiler server from run.json; until it
        # does, the alert resolves to no target and is not remembered, so re-posting works.
        answer: dict[str, Any] = loop.post(payload(alert("fire1", **labels))).json()
        return answer if answer["sessions"] else None

    answer = wait_until(started, timeout=60, interval=0.5, what="a capture started by an alert")
    loop.last_capture = loop.clock()
    [session_id] = answer["sessions"]
    [outcome] = answer["alerts"]
    assert outcome["outcome"] == "started"
    assert foreign not in outcome["targets"]

    record = wait_until(
        lambda: (r := loop.session(session_id)) and r["status"] != "running" and r,
        timeout=60,
        what=f"session {session_id} to finish",
    )
    assert record["status"] == "done", record
    assert (record["trigger"], record["requester"], record["kind"]) == (
        "alert",
        "alertmanager",
        "trace",
    )
    assert record["alert"]["name"] == "MLWorkloadDutyCycleLow"
    assert record["alert"]["fingerprint"] == "fire1"
    assert record["alert"]["labels"]["run_id"] == loop.run_id
    assert record["alert"]["startsAt"].startswith("2026-11-29T07:00:00.5")
    [target] = record["targets"]
    assert target["status"] == "ok"
    xplanes = list((loop.store / "plugins" / "profile" / session_id).glob("*.xplane.pb"))
    assert xplanes and xplanes[0].stat().st_size > 0
    assert loop.foreign.connections == 0
    # The run is in its cooldown now: another alert of it starts nothing until the
    # policy's clock has passed it (Loop.wait_cooldown, in the tests below).
    cooled = loop.post(payload(alert("fire2", **labels))).json()["alerts"][0]
    assert cooled["outcome"] == "cooldown", cooled
    assert cooled["reason"].endswith(f"(cooldown {COOLDOWN_S:g}s)"), cooled


def test_same_alert_a_hundred_times_starts_one_capture(loop: Loop) -> None:
    loop.wait_cooldown()
    before = set(loop.sessions())
    body = payload(alert("same1", run_id=loop.run_id, host=loop.host, mlprof_action="capture"))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: loop.post(body), range(100)))
    loop.last_capture = loop.clock()
    assert {a.status_code for a in answers} == {202}
    outcomes = [a.json()["alerts"][0]["outcome"] for a in answers]
    assert outcomes.count("started") == 1
    assert outcomes.count("duplicate") == 99
    assert len(set(loop.sessions()) - before) == 1


def test_global_limit_holds_alerts_while_a_capture_runs(loop: Loop) -> None:
    loop.wait_cooldown()
    first = alert("lim1", run_id=loop.run_id, mlprof_action="capture", mlprof_duration_ms="3000")
    second = alert("lim2", host="localhost", mlprof_action="snapshot")
    answer = loop.post(payload(first, second)).json()
    loop.last_capture = loop.clock()
    started, waiting = answer["alerts"]
    assert started["outcome"] == "started"
    assert waiting["outcome"] == "limit"
    assert waiting["reason"] == "1 alert-triggered captures running (limit 1)"
    wait_until(
        lambda: (r := loop.session(started["session_id"])) and r["status"] != "running",
        timeout=60,
        what="the first capture to finish",
    )
    # Alertmanager re-sends at its group interval; the held alert was not remembered.
    again = loop.post(payload(second)).json()["alerts"][0]
    assert again["outcome"] == "started", again
    assert again["targets"] == [f"localhost:{loop.profiler_port}"]
    record = wait_until(
        lambda: (r := loop.session(again["session_id"])) and r["status"] != "running" and r,
        timeout=60,
        what="the held alert's capture to finish",
    )
    assert record["kind"] == "snapshot"
    assert record["alert"]["fingerprint"] == "lim2"


def test_burst_of_a_thousand_alerts_is_answered_with_bounded_captures(loop: Loop) -> None:
    loop.wait_cooldown()
    before = set(loop.sessions())
    counts_before = loop.alerts_received()
    hosts = [loop.host, "ghost-1", "ghost-2", loop.foreign.address.partition(":")[0]]
    alerts = [
        alert(f"burst{i}", run_id=loop.run_id, host=hosts[i % 4], mlprof_action="capture")
        for i in range(1000)
    ]
    # 50 concurrent calls of 10 alerts, then one call carrying 500.
    bodies = [payload(*alerts[i : i + 10]) for i in range(0, 500, 10)]
    bodies.append(payload(*alerts[500:]))
    began = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(loop.post, bodies))
    took = time.monotonic() - began
    loop.last_capture = loop.clock()
    assert [a.status_code for a in answers] == [202] * len(bodies)
    outcomes = [o["outcome"] for a in answers for o in a.json()["alerts"]]
    assert len(outcomes) == 1000
    print(f"\n1000 alerts in {len(bodies)} calls answered in {took:.2f}s: {Counter(outcomes)}")
    # Max concurrent 1 and one run in cooldown: one capture per cooldown period of the
    # burst (a loaded CI machine can take longer than one period to answer 1000 alerts).
    assert outcomes.count("started") <= 1 + int(took // COOLDOWN_S)
    assert outcomes.count("no_target") == 750
    assert set(outcomes) <= {"started", "cooldown", "limit", "no_target"}
    assert len(set(loop.sessions()) - before) <= 1 + int(took // COOLDOWN_S)
    assert httpx.get(f"{loop.url}/healthz", timeout=10).json() == {"status": "ok"}
    assert loop.server.is_alive()
    # /metrics is rendered ahead of scrapes (up to a collect interval old): wait for it.
    wait_until(
        lambda: sum(loop.alerts_received().values()) - sum(counts_before.values()) == 1000,
        timeout=30,
        what="mlprof_alerts_received_total to count the 1000 alerts",
    )
    assert loop.foreign.connections == 0
    for session_id in {s for a in answers for s in a.json()["sessions"]}:
        wait_until(
            lambda: (r := loop.session(session_id)) and r["status"] == "done",  # noqa: B023
            timeout=60,
            what=f"the burst's capture {session_id} to complete",
        )


def test_loopback_without_token_accepts_alertmanager(tmp_path: Path) -> None:
    settings = load_settings(
        listen="127.0.0.1:9", shared_dir=str(tmp_path / "shared"), store=str(tmp_path / "store")
    )
    client = TestClient(create_app(Sidecar(settings)), base_url="http://127.0.0.1")
    body = payload(alert("nt1", host="nowhere", mlprof_action="capture"))
    response = client.post(WEBHOOK, json=body)
    assert response.status_code == 202
    assert response.json()["alerts"][0]["outcome"] == "no_target"
