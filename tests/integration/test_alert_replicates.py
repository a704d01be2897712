"""An alert takes several captures and its report compares them as replicates.

A real JAX CPU workload (the demo loop, with its profiler server) and a real
``mlprof serve`` with ``MLPROF_ALERT_CAPTURES=3``: two manual captures of the run are
its baseline, then an Alertmanager alert starts a session of three captures, taken one
after another by the real profiler client, and the report's comparison with the
baseline holds three replicates on the head side (two on the base side: the baseline
and the run's other session) with the noise between captures measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Proc, free_port, wait_http, wait_until

pytestmark = pytest.mark.integration

CAPTURES = 3


@dataclass
class Loop:
    url: str
    store: Path
    run_id: str

    def post(self, path: str, body: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=60)

    def finished(self, session_id: str) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            record: dict[str, Any] = httpx.get(
                f"{self.url}/api/v1/captures/{session_id}", timeout=10
            ).json()
            return record if record["status"] != "running" else None

        return wait_until(done, timeout=120, interval=0.5, what=f"session {session_id} to end")


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    tmp = tmp_path_factory.mktemp("alert-replicates")
    shared, store = tmp / "shared", tmp / "store"
    port, profiler_port = free_port(), free_port()
    env = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(shared),
        "MLPROF_STORE": str(store),
        "MLPROF_COLLECT_INTERVAL_S": "0.5",
        "MLPROF_DISCOVERY_INTERVAL_S": "1",
        "MLPROF_ALERT_CAPTURES": str(CAPTURES),
        "MLPROF_REPORT_XPROF": "false",  # the comparison is what this test reads
        "MLPROF_SOURCES": "jax",
    }
    # The demo's input-pipeline knob (as in test_webhook.py): a few steps a second, and
    # the cores left to the sidecar's analyses.
    shared.mkdir(parents=True)
    (shared / "demo-input-delay").write_text("0.05")
    workload = Proc.python(
        ["-m", "exporter.demo.workload", "--shared-dir", str(shared),
         "--profiler-port", str(profiler_port),
         "--batch", "64", "--features", "64", "--hidden", "128"],
        tmp / "workload.log",
        env=env,
    )  # fmt: skip
    sidecar = Proc.python(["-m", "exporter.cli", "serve"], tmp / "sidecar.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", timeout=60)
        run = wait_until(
            lambda: json.loads((shared / "run.json").read_text()),
            timeout=120,
            what=f"the workload's run.json (log: {workload.log})",
        )
        # Captured before its first steps, a baseline has no step to compare.
        wait_until(lambda: _steps(url) >= 20, timeout=120, what="the workload's first steps")
        yield Loop(url, store, run["run_id"])
    finally:
        workload.stop()
        code = sidecar.stop()
        print(f"sidecar exit {code}; log tail:\n{sidecar.log.read_text()[-3000:]}")


def _steps(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "train_steps_total"
    )


def test_an_alert_takes_three_captures_and_its_report_compares_them_as_replicates(
    loop: Loop,
) -> None:
    def captured() -> str | None:
        # Until the sidecar discovers the workload's server, the run has no target (400).
        answer = loop.post("/api/v1/captures", {"run_id": loop.run_id, "duration_ms": 1500})
        return str(answer.json()["session_id"]) if answer.status_code == 202 else None

    baselines = []
    for _ in range(2):  # the baseline and the run's other session: two base replicates
        session_id = wait_until(captured, timeout=60, interval=0.5, what="a manual capture")
        assert loop.finished(session_id)["status"] == "done"
        baselines.append(session_id)

    body = {
        "version": "4",
        "status": "firing",
        "receiver": "mlprof",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "MLWorkloadStepTimeRegression", "run_id": loop.run_id,
                       "mlprof_action": "capture", "mlprof_duration_ms": "3000"},
            "startsAt": "2026-12-04T23:00:00Z",
            "fingerprint": "replicates",
        }],
    }  # fmt: skip
    answer = loop.post("/api/v1/alertmanager", body).json()
    [session_id] = answer["sessions"]
    record = loop.finished(session_id)
    assert record["status"] == "done", record
    assert record["options"]["captures"] == CAPTURES
    [target] = record["targets"]
    stem = target["files"][0].split(".r1.")[0]
    assert target["files"] == [f"{stem}.r{i}.xplane.pb" for i in range(1, CAPTURES + 1)]
    sizes = [(loop.store / "plugins" / "profile" / session_id / n).stat().st_size
             for n in target["files"]]  # fmt: skip
    assert all(size > 0 for size in sizes)

    def reported() -> dict[str, Any] | None:
        got = httpx.get(f"{loop.url}/api/v1/sessions/{session_id}/report", timeout=10)
        return got.json() if got.status_code == 200 else None  # 202 while it is made

    report = wait_until(reported, timeout=300, interval=1, what=f"the report of {session_id}")
    baseline = report["baseline"]
    assert baseline["session"] == baselines[-1], baseline
    comparison = next(iter(baseline["comparisons"].values()))
    between = comparison["noise"]["between_runs"]
    assert between["replicates"] == [2, CAPTURES], between
    assert between["measured"] is True, comparison["notes"]
    assert comparison["head"]["replicates"] == CAPTURES
    assert comparison["base"]["replicates"] == 2
    assert comparison["min_detectable"]["between_run_noise"] == "measured"
    assert comparison["step_verdict"]["replicates"] == [2, CAPTURES]
