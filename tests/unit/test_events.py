"""Run events in their three forms: JSON lines, Cloud Logging structured, Logging API.

The structured form is parsed back field by field; the API form goes through
google-cloud-logging's own client (HTTP transport, anonymous credentials) to a local
stand-in of ``entries:write`` that checks entries as the API does.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging
from google.cloud.logging import Resource

from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.sinks.events import (
    EVENT_TYPES,
    ApiEvents,
    LogEvents,
    StructuredEvents,
    Throttle,
    report_written,
)
from tests.logging_api import LoggingApiStandIn

PROJECT = "mlprof-test"
IDENTITY = {"run_id": "r1", "workload": "trainer", "host": "h0"}
# One emission per event type, as the emitting modules call it (message, severity, data).
EXAMPLES: dict[str, dict[str, Any]] = {
    "run_started": {"pid": 7, "profiler_port": 9999},
    "run_ended": {"steps": 120, "tokens": 491_520, "duration_s": 61.5},
    "capture_requested": {"session_id": "s1", "kind": "trace", "trigger": "alert",
                          "targets": ["127.0.0.1:9999"], "alert": "MLWorkloadDutyCycleLow"},
    "capture_finished": {"session_id": "s1", "severity": "ERROR", "status": "failed",
                         "targets": [{"address": "127.0.0.1:9999", "status": "unreachable"}]},
    "alert_received": {"outcome": "cooldown", "reason": "r1 was captured 3s ago"},
    "report_written": {"session_id": "s1", "severity": "WARNING", "status": "NEEDS_ATTENTION",
                       "findings": {"P0": 1, "P1": 0, "P2": 2}},
    "profile_push_failed": {"status": "spooled", "reason": "HTTP 503: down"},
    "spool_overflow": {"dropped": 3},
    "source_error": {"source": "tpu", "reason": "unavailable"},
}  # fmt: skip
WANTED_SEVERITY = {kind: fields.get("severity", EVENT_TYPES[kind]) for kind, fields in
                   EXAMPLES.items()}  # fmt: skip


def _emit_all(sink: Any) -> None:
    for kind, fields in EXAMPLES.items():
        sink.emit(kind, f"{kind} happened", **IDENTITY, **fields)


def _data(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k not in ("severity", "session_id")}


def _identity(fields: dict[str, Any]) -> dict[str, str]:
    return {**IDENTITY, **({"session_id": fields["session_id"]} if "session_id" in fields else {})}


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    built = build_telemetry()
    yield built
    built.shutdown()


def _count(telemetry: Telemetry, name: str, **labels: str) -> float | None:
    return telemetry.registry.get_sample_value(name, labels)


def test_log_form_is_one_json_object_per_line(telemetry: Telemetry) -> None:
    out = io.StringIO()
    sink = LogEvents(telemetry.meter, stream=out)
    _emit_all(sink)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["type"] for line in lines] == list(EXAMPLES)
    for line, (kind, fields) in zip(lines, EXAMPLES.items(), strict=True):
        assert line.pop("time").endswith("Z")
        assert line == {
            "severity": WANTED_SEVERITY[kind],
            "type": kind,
            "message": f"{kind} happened",
            **_identity(fields),
            "data": _data(fields),
        }
    for kind in EVENT_TYPES:
        assert _count(telemetry, "mlprof_events_total", type=kind) == 1.0
    assert _count(telemetry, "mlprof_events_dropped_total", sink="log") == 0.0


def test_structured_form_parses_back_field_by_field() -> None:
    out = io.StringIO()
    _emit_all(StructuredEvents(stream=out, project=PROJECT))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    # The library announces itself once per process in the same format; skip that line.
    events = [line for line in lines if "type" in line]
    assert len(events) == len(EXAMPLES)
    for line, (kind, fields) in zip(events, EXAMPLES.items(), strict=True):
        assert line["severity"] == WANTED_SEVERITY[kind]
        # The handler adds the Python logger's name as a label of its own.
        assert line["logging.googleapis.com/labels"] == {
            "python_logger": "mlprof.events",
            "event_type": kind,
            **_identity(fields),
        }
        assert line["message"] == f"{kind} happened"
        assert line["type"] == kind
        assert {k: line[k] for k in _identity(fields)} == _identity(fields)
        assert line["data"] == _data(fields)
        # Only the agent's special fields besides the payload: no stray keys.
        special = {k for k in line if k.startswith("logging.googleapis.com/") or k in
                   ("severity", "httpRequest")}  # fmt: skip
        assert set(line) - special == {"message", "type", "data", *_identity(fields)}


def _api_client(url: str) -> cloud_logging.Client:
    return cloud_logging.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": url},
        _use_grpc=False,
    )


GLOBAL = Resource(type="global", labels={"project_id": PROJECT})


def test_api_form_writes_entries_with_labels_and_severities(telemetry: Telemetry) -> None:
    with LoggingApiStandIn() as standin:
        sink = ApiEvents(lambda: _api_client(standin.url), telemetry.meter, resource=GLOBAL,
                         log_name="mlprof-events", flush_interval_s=0.05)  # fmt: skip
        try:
            _emit_all(sink)
            entries = standin.wait_for(len(EXAMPLES))
        finally:
            sink.close()
    assert standin.errors == []
    assert [e["jsonPayload"]["type"] for e in entries] == list(EXAMPLES)
    for entry, (kind, fields) in zip(entries, EXAMPLES.items(), strict=True):
        assert entry["logName"] == f"projects/{PROJECT}/logs/mlprof-events"
        assert entry["resource"] == {"type": "global", "labels": {"project_id": PROJECT}}
        assert entry["severity"] == WANTED_SEVERITY[kind]
        assert entry["labels"] == {"event_type": kind, **_identity(fields)}
        assert entry["jsonPayload"] == {
            "type": kind,
            "message": f"{kind} happened",
            **_identity(fields),
            "data": _data(fields),
        }
    assert sink.sent == len(EXAMPLES)
    assert _count(telemetry, "mlprof_events_dropped_total", sink="cloud-logging-api") == 0.0


def test_hung_api_never_blocks_emit_and_counts_drops(telemetry: Telemetry) -> None:
    with LoggingApiStandIn() as standin:
        standin.hold()  # every request waits: the sender thread is stuck in its first call
        sink = ApiEvents(lambda: _api_client(standin.url), telemetry.meter, resource=GLOBAL,
                         queue_size=5, flush_interval_s=0.05, attempts=1)  # fmt: skip
        sink.emit("run_started", "first", **IDENTITY)
        done = threading.Event()

        def burst() -> None:
            for n in range(200):
                sink.emit("source_error", f"error {n}", source="tpu", reason="unavailable")
            done.set()

        threading.Thread(target=burst, daemon=True).start()
        # emit returns while the API hangs: the burst finishes although nothing is sent.
        assert done.wait(30), "emit blocked on a hung Logging API"
        assert standin.entries == []
        dropped = _count(telemetry, "mlprof_events_dropped_total", sink="cloud-logging-api")
        # 201 emitted; at most the batch in flight and the 5 queued can still be sent.
        assert dropped is not None and dropped >= 201 - 5 - 100
        standin.release()
        sink.close()
    assert _count(telemetry, "mlprof_events_total", type="source_error") == 200.0


def test_unreachable_api_drops_after_retries(telemetry: Telemetry) -> None:
    sink = ApiEvents(lambda: _api_client("http://127.0.0.1:9"), telemetry.meter, resource=GLOBAL,
                     flush_interval_s=0.05, attempts=2, backoff_s=0.01)  # fmt: skip
    sink.emit("run_ended", "ended", **IDENTITY, steps=3)
    sink.close()
    assert sink.sent == 0
    assert _count(telemetry, "mlprof_events_dropped_total", sink="cloud-logging-api") == 1.0


def test_report_written_carries_status_counts_and_severity() -> None:
    out = io.StringIO()
    sink = LogEvents(stream=out)
    report_written(sink.emit, session_id="s9", status="NEEDS_ATTENTION",
                   findings={"P0": 2, "P2": 1}, **IDENTITY, files=["analysis.json"])  # fmt: skip
    report_written(sink.emit, session_id="s10", status="OPTIMAL", findings={})
    report_written(sink.emit, session_id="s11", status="error", findings={})
    first, second, third = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["severity"] == "WARNING"
    assert first["message"] == "report of session s9: NEEDS_ATTENTION (2 P0, 1 P2)"
    assert first["session_id"] == "s9"
    assert first["data"] == {
        "status": "NEEDS_ATTENTION",
        "findings": {"P0": 2, "P1": 0, "P2": 1},
        "files": ["analysis.json"],
    }
    assert (second["severity"], second["message"]) == (
        "INFO",
        "report of session s10: OPTIMAL (no findings)",
    )
    assert third["severity"] == "ERROR"


def test_unknown_type_is_not_written_and_bad_severity_falls_back() -> None:
    out = io.StringIO()
    sink = LogEvents(stream=out)
    sink.emit("something_else", "x")
    sink.emit("run_started", "y", severity="LOUD")
    (line,) = [json.loads(text) for text in out.getvalue().splitlines()]
    assert (line["type"], line["severity"]) == ("run_started", "INFO")


def test_throttle_holds_back_and_reports_the_count() -> None:
    now = [0.0]
    throttle = Throttle(60.0, clock=lambda: now[0])
    assert throttle.allow("tpu:unavailable") == 0
    assert throttle.allow("tpu:unavailable") is None
    assert throttle.allow("nvml:nvml") == 0  # another key is not held back
    now[0] = 61.0
    assert throttle.allow("tpu:unavailable") == 1
