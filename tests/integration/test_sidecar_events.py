"""Events from a running sidecar's real components, and a hung Logging API that must not hurt.

The sidecar runs in process with its background loops (lifespan) and an event sink the
test reads. A run of the SDK, a capture of a dead target, Alertmanager calls, pushes to
a Pyroscope that is down with a tiny spool, and a TPU runtime that is not there each
produce their events.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging
from google.cloud.logging import Resource

from exporter import sdk
from exporter.api.app import create_app
from exporter.config import load_settings
from exporter.metrics.telemetry import build_telemetry
from exporter.sidecar import Sidecar
from exporter.sinks.events import ApiEvents, LogEvents
from tests.harness import free_port, wait_until
from tests.logging_api import LoggingApiStandIn
from tests.unit.test_ingest_formats import AGENT_LABELS, push_body

pytestmark = pytest.mark.integration

TOKEN = "events-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PUSH = "/push.v1.PusherService/Push"


class _Lines(io.StringIO):
    """What the log sink wrote, read while the sidecar's threads write."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            return super().write(text)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(line) for line in self.getvalue().splitlines()]


def _alert(name: str, **labels: str) -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "mlprof",
        "groupKey": "{}:{}",
        "alerts": [{"status": "firing", "labels": {"alertname": name, **labels},
                    "annotations": {}, "startsAt": "2026-01-01T00:00:00Z",
                    "fingerprint": "f00d"}],
    }  # fmt: skip


def _settings(tmp: Path, **extra: Any) -> Any:
    return load_settings(
        shared_dir=str(tmp / "shared"),
        store=str(tmp / "store"),
        spool_dir=str(tmp / "spool"),
        auth_token=TOKEN,
        collect_interval_s=0.3,
        **extra,
    )


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    """Drive every emitting component once; yield the events the log sink wrote."""
    tmp = tmp_path_factory.mktemp("events")
    dead_target = f"127.0.0.1:{free_port()}"
    body = push_body(AGENT_LABELS)
    settings = _settings(
        tmp,
        pyroscope_url=f"http://127.0.0.1:{free_port()}",  # nothing listens: pushes fail
        spool_max_bytes=len(body) * 3 // 2,  # room for one: the second evicts the first
        sources=["tpu"],
        tpu_metrics_addr=f"127.0.0.1:{free_port()}",  # no TPU runtime there
        targets=[dead_target],
        capture_timeout_s=5,
    )
    telemetry = build_telemetry()
    lines = _Lines()
    sidecar = Sidecar(settings, telemetry, LogEvents(telemetry.meter, stream=lines))
    with TestClient(create_app(sidecar)) as client:
        with (
            sdk.run("evt-workload", shared_dir=settings.shared_dir, host="evt-host") as run,
            run.step(tokens=8),
        ):
            pass
        # Two agent uploads while Pyroscope is down: spooled, then the spool overflows.
        for _ in range(2):
            headers = {"Content-Type": "application/proto", **AUTH}
            assert client.post(PUSH, content=body, headers=headers).status_code == 200
        assert client.post("/api/v1/alertmanager", json=_alert("NoAction")).status_code == 401
        answer = client.post(
            "/api/v1/alertmanager",
            json=_alert("Quiet", run_id=run.run_id, host="evt-host"),
            headers=AUTH,
        )
        assert answer.status_code == 202
        capture = client.post(
            "/api/v1/captures", json={"targets": [dead_target], "duration_ms": 100}, headers=AUTH
        )
        assert capture.status_code == 202, capture.text

        def all_kinds() -> list[dict[str, Any]] | None:
            found = lines.events()
            kinds = {e["type"] for e in found}
            wanted = {"run_started", "run_ended", "capture_requested", "capture_finished",
                      "alert_received", "profile_push_failed", "spool_overflow",
                      "source_error"}  # fmt: skip
            return found if wanted <= kinds else None

        yield wait_until(all_kinds, timeout=60, what="every kind of event")
        metrics = client.get("/metrics", headers=AUTH).text
        assert 'mlprof_events_total{type="run_started"} 1.0' in metrics
        assert 'mlprof_events_dropped_total{sink="log"} 0.0' in metrics


def _one(events: list[dict[str, Any]], kind: str, **where: Any) -> dict[str, Any]:
    found = [e for e in events if e["type"] == kind and all(e.get(k) == v for k, v in
                                                             where.items())]  # fmt: skip
    assert found, f"no {kind} event with {where} in {[e['type'] for e in events]}"
    return found[0]


def test_run_started_and_ended_from_the_sdks_files(emitted: list[dict[str, Any]]) -> None:
    started = _one(emitted, "run_started", workload="evt-workload", host="evt-host")
    ended = _one(emitted, "run_ended", run_id=started["run_id"])
    assert started["severity"] == ended["severity"] == "INFO"
    assert started["data"]["pid"] > 0
    assert (ended["workload"], ended["host"]) == ("evt-workload", "evt-host")
    assert ended["data"]["steps"] == 1 and ended["data"]["tokens"] == 8
    assert ended["data"]["duration_s"] >= 0


def test_capture_of_a_dead_target_is_requested_then_failed(
    emitted: list[dict[str, Any]],
) -> None:
    requested = _one(emitted, "capture_requested")
    finished = _one(emitted, "capture_finished", session_id=requested["session_id"])
    assert requested["data"]["trigger"] == "manual" and requested["data"]["kind"] == "trace"
    assert finished["severity"] == "ERROR"
    assert finished["data"]["status"] == "failed"
    (target,) = finished["data"]["targets"]
    assert target["status"] in ("unreachable", "failed", "timeout") and target["error"]


def test_alerts_received_with_outcome_and_run(emitted: list[dict[str, Any]]) -> None:
    refused = _one(emitted, "alert_received", severity="WARNING")
    assert refused["data"]["outcome"] == "unauthorized"
    quiet = _one(emitted, "alert_received", host="evt-host")
    assert quiet["data"] | {"fingerprint": None} == {
        "alert": "Quiet", "fingerprint": None, "status": "firing", "outcome": "no_action",
        "reason": "no mlprof_action label or annotation",
    }  # fmt: skip
    assert quiet["run_id"].startswith("evt-workload-")


def test_push_failure_and_spool_overflow(emitted: list[dict[str, Any]]) -> None:
    failed = _one(emitted, "profile_push_failed")
    assert failed["severity"] == "WARNING"
    assert (failed["workload"], failed["run_id"], failed["host"]) == ("trainer", "r1", "h0")
    assert failed["data"]["status"] == "spooled"
    overflow = _one(emitted, "spool_overflow")
    assert overflow["severity"] == "ERROR" and overflow["data"]["dropped"] == 1


def test_source_error_is_reported_once_not_per_collection(
    emitted: list[dict[str, Any]],
) -> None:
    errors = [e for e in emitted if e["type"] == "source_error"]
    assert errors[0]["data"]["source"] == "tpu"
    assert len({e["data"]["reason"] for e in errors}) == len(errors)  # throttled per reason


def test_hung_logging_api_neither_blocks_nor_crashes_the_sidecar(tmp_path: Path) -> None:
    telemetry = build_telemetry()
    with LoggingApiStandIn() as standin:
        standin.hold()

        def client_factory() -> cloud_logging.Client:
            return cloud_logging.Client(
                project="p", credentials=AnonymousCredentials(),
                client_options={"api_endpoint": standin.url}, _use_grpc=False,
            )  # fmt: skip

        events = ApiEvents(
            client_factory, telemetry.meter, queue_size=5, flush_interval_s=0.05, attempts=1,
            resource=Resource(type="global", labels={}), close_timeout_s=0.5,
        )  # fmt: skip
        sidecar = Sidecar(_settings(tmp_path, sources=["jax"]), telemetry, events)
        with TestClient(create_app(sidecar)) as client:
            for n in range(30):
                response = client.post("/api/v1/alertmanager", json=_alert(f"A{n}"),
                                       headers=AUTH)  # fmt: skip
                assert response.status_code == 202
            assert client.get("/healthz").json() == {"status": "ok"}
            metrics = client.get("/metrics", headers=AUTH).text
        # Read before the sidecar stopped (its telemetry is shut down with it).
        found = re.search(r'mlprof_events_dropped_total\{sink="cloud-logging-api"\} (\S+)', metrics)
        assert found and float(found.group(1)) > 0
        assert 'mlprof_events_total{type="alert_received"} 30.0' in metrics
        assert standin.entries == []


def test_a_finished_report_is_a_report_written_event(tmp_path: Path) -> None:
    """The sidecar hangs the event sink on the report worker's one notification point."""
    from exporter.pipeline.worker import ReportEvent

    telemetry = build_telemetry()
    lines = _Lines()
    sidecar = Sidecar(_settings(tmp_path), telemetry, LogEvents(telemetry.meter, stream=lines))
    try:
        event = ReportEvent(
            session_id="s-1", run_id="r-1", workload="w", trigger="alert",
            status="NEEDS_ATTENTION", findings={"P0": 1, "P2": 2},
            baseline_session="s-0", top_regression="jit_step;fusion.2",
        )  # fmt: skip
        for callback in sidecar.reports.on_report:
            callback(event)
    finally:
        sidecar.reports.close()
    written = _one(lines.events(), "report_written", session_id="s-1")
    assert (written["run_id"], written["workload"], written["severity"]) == (
        "r-1", "w", "WARNING",
    )  # fmt: skip
    assert written["data"]["findings"] == {"P0": 1, "P1": 0, "P2": 2}
    assert written["data"]["status"] == "NEEDS_ATTENTION"
