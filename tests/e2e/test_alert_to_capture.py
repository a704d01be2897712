"""Alert → capture, every part real.

Debian's Prometheus and Alertmanager on loopback, loaded with the shipped rules (their
thresholds and ``for:`` shortened by a test override, not by editing them) and the
shipped Alertmanager example config (URL and token substituted); the sidecar with its
capture engine; the JAX demo workload with its profiler server; the test Pyroscope
receiver (the environment is shared by the e2e folder: tests/e2e/conftest.py; the TPU
host it adds is another host of the same run). The test captures a baseline at full
speed, slows the workload's input pipeline and waits for the chain: alert firing →
webhook → capture session with the host's ``.xplane.pb`` → flame graph at the receiver
→ the session's analysis report, compared against the baseline. It prints the latency
from alert firing to capture start and to the report being written.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import E2E_OVERRIDES, TOKEN, Stack, prom_get
from tests.harness import wait_until

pytestmark = pytest.mark.e2e

ALERT_NAME = "MLWorkloadDutyCycleLow"


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


def test_slow_input_fires_alert_that_captures_and_pushes_a_flame_graph(
    alert_loop: dict[str, Any],
) -> None:
    """The loop runs in the session's ``alert_loop`` fixture (tests/e2e/conftest.py), once
    for every test of the environment; its assertions are in :func:`run_loop`."""
    assert alert_loop["session_id"]
    assert alert_loop["pushed"] >= 1


def run_loop(stack: Stack) -> dict[str, Any]:
    wait_until(lambda: scrape_target_up(stack), timeout=60, what="Prometheus scraping the sidecar")
    # Full speed first: the duty cycle is known and high, nothing fires.
    run = wait_until(
        lambda: json.loads((stack.shared / "run.json").read_text()),
        timeout=120,
        what="the workload's run.json",
    )
    wait_until(
        lambda: query(
            stack, f'accelerator_duty_cycle{{run_id="{run["run_id"]}", source="sdk"}} > 0.3'
        ),
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
    captured = parse_time(target["finished"])  # the profiler answered: the window is over
    print(
        f"alert→report: ALERT-TO-REPORT LATENCY {(written - fired).total_seconds():.2f}s "
        f"(firing to analysis.json written, of which the {E2E_OVERRIDES.name} capture window "
        f"and group_wait end {(captured - fired).total_seconds():.2f}s after firing; "
        f"CAPTURE-TO-REPORT {(written - captured).total_seconds():.2f}s; the analysis "
        f"itself took {report['analysis_seconds']:.2f}s: {report.get('timings')})"
    )

    return {"session_id": session_id, "pushed": len(series), "run": run, "report": report}


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
    # The step view (the default comparison) leads, and names the input as the host
    # view does.
    assert next(iter(baseline["comparisons"])) == "step", list(baseline["comparisons"])
    top = baseline["comparisons"]["step"]["regressions"][0]
    assert top["name"] == "input_pipeline" and top["regression"], top
    # The host view ranks the same frame first. Its own verdict is not asked: one capture
    # a side, and under stress-ng the host view's between-capture noise once held it
    # below a verdict while the step view (the one the report leads with) gave it.
    assert baseline["comparisons"]["host"]["regressions"][0]["name"] == "input_pipeline"
    return report
