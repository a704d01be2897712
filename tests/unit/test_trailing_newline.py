"""Issue 22 (9): ids and names checked with ``re.match`` and ``$`` let a trailing newline
through (``$`` matches before it). A store file ``small-a\\n.json`` was written, and a
capture named ``"x\\n"`` was answered 503 (the store refused the id) instead of 422."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exporter.api.app import create_app
from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRejected, CaptureRequest
from exporter.capture.session import check_session_id
from exporter.capture.store import SessionStore
from exporter.capture.targets import ProfilerTarget
from exporter.sdk.host_profile import check_phase
from exporter.sidecar import Sidecar
from tests.harness import free_port
from tests.sidecar_app import settings_in


@pytest.mark.parametrize("value", ["small-a\n", "small-a\r\n"])
def test_a_session_id_with_a_trailing_newline_is_refused(value: str) -> None:
    check_session_id(value.rstrip())
    with pytest.raises(ValueError, match="expected 1-128 characters"):
        check_session_id(value)


def test_a_capture_name_with_a_newline_is_a_bad_request_not_a_store_failure(
    tmp_path: Path,
) -> None:
    engine = CaptureEngine(
        SessionStore(f"memory://nl-{time.monotonic_ns()}"), tmp_path, CaptureLimits(timeout_s=1)
    )
    target = ProfilerTarget(f"127.0.0.1:{free_port()}", "h0", "run-a", "static")
    try:
        with pytest.raises(CaptureRejected, match="session name 'x\\\\n'"):
            engine.submit(CaptureRequest(name="x\n", duration_ms=100), [target])
    finally:
        engine.close()
    assert engine.store.session_ids() == []


def test_other_names_refuse_a_trailing_newline_too(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        check_phase("data\n")
    client = TestClient(create_app(Sidecar(settings_in(tmp_path))), base_url="http://127.0.0.1")
    answer = client.get("/api/v1/memory-profiles/1700000000-0a1b2c3d%0A")
    assert answer.status_code == 404
    assert "expected a request id" in answer.json()["detail"]
