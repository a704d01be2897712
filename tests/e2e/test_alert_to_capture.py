"""Alert → capture, every part real.

Debian's Prometheus and Alertmanager on loopback, loaded with the shipped rules (their
thresholds and ``for:`` shortened by a test override, not by editing them) and the
shipped Alertmanager example config (URL and token substituted); the sidecar with its
capture engine; the JAX demo workload with its profiler server; the test Pyroscope
receiver. The test captures a baseline at full speed, slows the workload's input
pipeline and waits for the chain: alert firing → webhook → capture session with the
host's ``.xplane.pb`` → flame graph at the receiver → the session's analysis report,
compared against the baseline. It prints the latency from alert firing to capture start
and to the report being written.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from alerts.render import load_overrides, render_alertmanager_config, render_rules
from tests.harness import ROOT, Proc, free_port, wait_http, wait_until
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.e2e

TOKEN = "e2e-alert-token"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
ALERT_NAME = "MLWorkloadDutyCycleLow"
E2E_OVERRIDES = ROOT / "alerts" / "overrides" / "e2e.yaml"


def binary(path: str) -> str:
    found = shutil.which(path)
    if found is None:
        raise AssertionError(
            f"{path} not found: install Debian's prometheus and prometheus-alertmanager"
        )
    return found


@dataclass
class Stack:
    tmp: Path
    shared: Path
    store: Path
    sidecar_url: str
    prometheus_url: str
    alertmanager_url: str
    receiver: PyroscopeReceiver
    procs: dict[str, Proc]

    def logs(self) -> str:
        return "\n".join(
            f"--- {name} (pid {p.pid}, alive {p.alive()}):\n{p.output()[-2500:]}"
            for name, p in self.procs.items()
        )


def render_test_rules(path: Path) -> None:
    """The shipped rules with thresholds and ``for:`` shortened by the e2e override file."""
    path.write_text(render_rules(load_overrides(E2E_OVERRIDES)), encoding="utf-8")


def prometheus_config(sidecar: str, alertmanager: str, rules: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {
                "job_name": "mlprof",
                "scrape_interval": "1s",
                "authorization": {"credentials": TOKEN},
                "static_configs": [{"targets": [sidecar]}],
            }
        ],
    }


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    prometheus, alertmanager = binary(PROMETHEUS), binary(ALERTMANAGER)
    shared, store = tmp_path / "shared", tmp_path / "store"
    sidecar_port, profiler_port = free_port(), free_port()
    prom_port, am_port = free_port(), free_port()
    sidecar_addr = f"127.0.0.1:{sidecar_port}"
    procs: dict[str, Proc] = {}
    receiver = PyroscopeReceiver().start()
    try:
        env = {
            "MLPROF_LISTEN": sidecar_addr,
            "MLPROF_SHARED_DIR": str(shared),
            "MLPROF_STORE": str(store),
            "MLPROF_AUTH_TOKEN": TOKEN,
            "MLPROF_COLLECT_INTERVAL_S": "1",
            "MLPROF_DUTY_CYCLE_WINDOW_S": "5",
            "MLPROF_DISCOVERY_INTERVAL_S": "1",
            "MLPROF_PYROSCOPE_URL": receiver.url,
            "JAX_PLATFORMS": "cpu",
        }
        procs["workload"] = Proc.python(
            ["-m", "exporter.demo.workload", "--shared-dir", str(shared),
             "--profiler-port", str(profiler_port),
             "--batch", "64", "--features", "64", "--hidden", "128"],
            tmp_path / "workload.log",
            env=env,
        )  # fmt: skip
        procs["sidecar"] = Proc.python(
            ["-m", "exporter.cli", "serve"], tmp_path / "sidecar.log", env=env
        )

        am_config = render_alertmanager_config(f"http://{sidecar_addr}/api/v1/alertmanager", TOKEN)
        (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
        procs["alertmanager"] = Proc(
            [alertmanager,
             f"--config.file={tmp_path / 'alertmanager.yml'}",
             f"--storage.path={tmp_path / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{am_port}",
             "--cluster.listen-address=",
             "--log.level=info"],
            tmp_path / "alertmanager.log",
        )  # fmt: skip

        rules = tmp_path / "rules.yml"
        render_test_rules(rules)
        config = prometheus_config(sidecar_addr, f"127.0.0.1:{am_port}", rules)
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        procs["prometheus"] = Proc(
            [prometheus,
             f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}",
             "--rules.alert.resend-delay=1s",
             "--log.level=info"],
            tmp_path / "prometheus.log",
        )  # fmt: skip
        stack = Stack(
            tmp_path,
            shared,
            store,
            f"http://{sidecar_addr}",
            f"http://127.0.0.1:{prom_port}",
            f"http://127.0.0.1:{am_port}",
            receiver,
            procs,
        )
        try:
            wait_http(f"{stack.alertmanager_url}/-/ready", timeout=30)
            wait_http(f"{stack.prometheus_url}/-/ready", timeout=30)
            wait_http(f"{stack.sidecar_url}/healthz", timeout=60)
        except AssertionError:
            print(stack.logs())
            raise
        yield stack
        print(stack.logs())
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()
        receiver.stop()


def prom_get(stack: Stack, path: str, **params: str) -> Any:
    response = httpx.get(f"{stack.prometheus_url}{path}", params=params, timeout=10)
    response.raise_for_status()
    return response.json()["data"]


def scrape_target_up(stack: Stack) -> bool:
    targets = prom_get(stack, "/api/v1/targets")["activeTargets"]
    return any(t["health"] == "up" for t in targets)


def query(stack: Stack, expr: str) -> list[dict[str, Any]]:
    return prom_get(stack, "/api/v1/query", query=expr)["result"]  # type: ignore[no-any-return]


def firing_alert(stack: Stack) -> dict[str, Any] | None:
    for found in prom_get(stack, "/api/v1/alerts")["alerts"]:
        if found["labels"].get("alertname") == ALERT_NAME and found["state"] == "firing":
            return found  # type: ignore[no-any-return]
    return None


def alert_sessions(stack: Stack) -> list[dict[str, Any]]:
    root = stack.store / "plugins" / "profile"
    found = []
    for path in sorted(root.glob("*/session.json")) if root.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue  # caught mid-write
        if record.get("trigger") == "alert":
            found.append(record)
    return found


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_slow_input_fires_alert_that_captures_and_pushes_a_flame_graph(stack: Stack) -> None:
    try:
        run_loop(stack)
    except AssertionError:
        print(stack.logs())
        raise


def run_loop(stack: Stack) -> None:
    wait_until(lambda: scrape_target_up(stack), timeout=60, what="Prometheus scraping the sidecar")
    # Full speed first: the duty cycle is known and high, nothing fires.
    run = wait_until(
        lambda: json.loads((stack.shared / "run.json").read_text()),
        timeout=120,
        what="the workload's run.json",
    )
    wait_until(
        lambda: query(stack, f'accelerator_duty_cycle{{run_id="{run["run_id"]}"}} > 0.3'),
        timeout=120,
        what="a high duty cycle at full speed in Prometheus",
    )
    assert firing_alert(stack) is None
    assert alert_sessions(stack) == []
    baseline_id = capture_baseline(stack)

    slowed_at = time.time()
    # 0.5 s of input wait per step keeps the duty cycle far below the threshold even when
    # a loaded CI machine slows the step itself, so the alert fires once, without flapping;
    # the alert's 4 s capture (e2e override) still holds several steps to compare.
    (stack.shared / "demo-input-delay").write_text("0.5")

    alert = wait_until(lambda: firing_alert(stack), timeout=120, what=f"{ALERT_NAME} firing")
    assert alert["labels"]["run_id"] == run["run_id"]
    assert alert["labels"]["mlprof_action"] in ("capture", "snapshot")

    sessions = wait_until(
        lambda: alert_sessions(stack), timeout=60, what="a capture session started by the alert"
    )
    session_id = sessions[0]["id"]
    record = wait_until(
        lambda: next(
            (
                s
                for s in alert_sessions(stack)
                if s["id"] == session_id and s["status"] != "running"
            ),
            None,
        ),
        timeout=90,
        what=f"session {session_id} to finish",
    )
    assert record["status"] == "done", record
    assert record["requester"] == "alertmanager"
    assert record["alert"]["name"] == ALERT_NAME
    assert record["alert"]["labels"]["run_id"] == run["run_id"]
    assert record["alert"]["fingerprint"]
    [target] = record["targets"]
    assert (target["status"], target["host"]) == ("ok", run["host"]), target
    xplanes = [f for f in target["files"] if f.endswith(".xplane.pb")]
    assert xplanes, target
    session_dir = stack.store / "plugins" / "profile" / session_id
    assert all((session_dir / f).stat().st_size > 0 for f in xplanes)

    def pushed() -> list[Any]:
        return [
            s
            for s in list(stack.receiver.received)
            if session_id in (s.labels.get("session_id"), s.labels.get("__session_id__"))
        ]

    series = wait_until(pushed, timeout=90, what=f"a flame graph of {session_id} at Pyroscope")
    labels = series[0].labels
    assert (labels["run_id"], labels["host"], labels["trigger"]) == (
        run["run_id"],
        run["host"],
        "alert",
    )
    assert sum(sum(s.value) for s in series[0].profile.sample) > 0

    def started_alerts() -> float:
        text = httpx.get(
            f"{stack.sidecar_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "mlprof_alerts_received_total"
            and sample.labels.get("outcome") == "started"
        )

    wait_until(lambda: started_alerts() >= 1, timeout=30, what="alerts counted as started")

    report = check_report(stack, session_id, baseline_id)

    fired = parse_time(record["alert"]["startsAt"])
    started = parse_time(target["started"])  # the profiler client dialled the host
    created = parse_time(record["created"])
    slowed = datetime.fromtimestamp(slowed_at, UTC)
    print(
        f"\nalert→capture: input slowed {slowed.isoformat()}; {ALERT_NAME} fired "
        f"{fired.isoformat()} (pending since {alert['activeAt']}; "
        f"{(fired - slowed).total_seconds():.1f}s after the slowdown, rule window "
        f"and for: from {E2E_OVERRIDES.name}); session {session_id} created "
        f"{(created - fired).total_seconds():.2f}s after firing; "
        f"ALERT-TO-CAPTURE LATENCY {(started - fired).total_seconds():.2f}s "
        "(firing to capture start, Alertmanager group_wait 1s included; "
        f"session created to capture start {(started - created).total_seconds() * 1000:.0f} ms)"
    )
    written = parse_time(report["written_at"])
    print(
        f"alert→report: ALERT-TO-REPORT LATENCY {(written - fired).total_seconds():.2f}s "
        f"(firing to analysis.json written; the analysis itself took "
        f"{report['analysis_seconds']:.2f}s)"
    )


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def capture_baseline(stack: Stack) -> str:
    """A manual capture at full speed: the baseline the alert's capture is compared to."""
    answer = httpx.post(
        f"{stack.sidecar_url}/api/v1/captures", json={"duration_ms": 1500}, headers=auth(),
        timeout=30,
    )  # fmt: skip
    assert answer.status_code == 202, answer.text
    session_id: str = answer.json()["session_id"]
    wait_until(
        lambda: (
            httpx.get(
                f"{stack.sidecar_url}/api/v1/captures/{session_id}", headers=auth(), timeout=10
            ).json()["status"]
            in ("done", "partial")
        ),
        timeout=60,
        what=f"baseline session {session_id}",
    )
    return session_id


def check_report(stack: Stack, session_id: str, baseline_id: str) -> dict[str, Any]:
    """The alert session's report: input wait found, and the frame that grew named."""

    def written() -> dict[str, Any] | None:
        answer = httpx.get(
            f"{stack.sidecar_url}/api/v1/sessions/{session_id}/report", headers=auth(), timeout=10
        )
        assert answer.status_code in (200, 202), answer.text
        return answer.json() if answer.status_code == 200 else None  # type: ignore[no-any-return]

    report: dict[str, Any] = wait_until(
        written, timeout=240, interval=0.5, what=f"the report of {session_id}"
    )
    assert report["status"] == "NEEDS_ATTENTION", report["summary"]
    wait = next(f for f in report["findings"] if f["rule"] == "InputWaitRule")
    share = wait["evidence"]["input_pct"]
    assert wait["priority"] in ("P0", "P1") and share >= 50, wait
    assert f"{share:.1f}%" in wait["title"]  # the measured share is quoted
    baseline = report["baseline"]
    assert baseline["session"] == baseline_id, baseline
    first = report["findings"][0]
    assert first["rule"] == "BaselineRegressionRule", report["findings"]
    assert first["frame"].split(";")[-1] == "input_pipeline", first
    top = baseline["comparisons"]["host"]["regressions"][0]
    assert top["name"] == "input_pipeline" and top["regression"], top
    return report
