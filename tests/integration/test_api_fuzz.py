"""Fuzzing the sidecar's HTTP API: no 5xx, no hang (issue 11).

- Schemathesis drives every operation of the app's own OpenAPI schema (``/openapi.json``,
  request bodies included: the routes declare what they parse), in process through
  ASGI, both schema-valid and schema-violating inputs.
- Hypothesis throws arbitrary JSON at the Alertmanager webhook and the capture API:
  deep nesting, huge integers, lone surrogates, Alertmanager-shaped payloads with
  hostile labels.

The app is built on temp dirs with a profiler client that only writes files, so nothing
outside the test is dialled. Examples are bounded (see MAX_EXAMPLES) to keep CI lean;
``derandomize`` makes every run try the same cases.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from exporter.api.app import create_app
from exporter.sidecar import Sidecar
from tests.harness import free_port
from tests.sidecar_app import FileWritingProfilerClient, settings_in

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Per operation (schemathesis) and per endpoint (webhook, captures): ~20 s in all here.
MAX_EXAMPLES = 30
FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,  # a shared CI machine: time is bounded by the pytest timeout
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# Schemathesis's and Starlette's in-process clients send ``Host: testserver``.
TEST_HOST = "testserver"


def _build_app() -> tuple[FastAPI, tempfile.TemporaryDirectory[str]]:
    tmp = tempfile.TemporaryDirectory(prefix="mlprof-fuzz-")
    # A Pyroscope URL (a closed loopback port: pushes wait in the spool) so that the
    # ingest routes parse what the fuzzer sends; without one they answer 503 unread.
    sidecar = Sidecar(
        settings_in(
            Path(tmp.name),
            allowed_hosts=TEST_HOST,
            pyroscope_url=f"http://127.0.0.1:{free_port()}",
        ),
        profiler_client=FileWritingProfilerClient(),
    )
    return create_app(sidecar), tmp


# The schema is the app's own, taken without serving it: schemathesis's ASGI transport
# (openapi.from_asgi) runs the app's lifespan in its own event loop, starting and
# stopping the sidecar around the schema download, and a sidecar does not start twice.
# (schemathesis.pytest.from_fixture would defer the loading to a fixture, but
# schemathesis 4.32 reads ``request.node._nodeid``, which pytest 9 no longer has.)
APP, _APP_DIR = _build_app()
schema = schemathesis.openapi.from_dict(APP.openapi())


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    """A client of the app with its lifespan running: the sidecar's loops work."""
    with TestClient(APP) as running:
        yield running


@schema.parametrize()
@FUZZ_SETTINGS
def test_no_operation_answers_5xx(case: Any, client: TestClient) -> None:
    sent = case.as_transport_kwargs(base_url=str(client.base_url))
    response = client.request(**_httpx_kwargs(sent))
    case.validate_response(response, checks=[not_a_server_error])


def _httpx_kwargs(sent: dict[str, Any]) -> dict[str, Any]:
    """Schemathesis's requests-style arguments for Starlette's (httpx) test client."""
    kwargs = {k: v for k, v in sent.items() if k in ("method", "url", "headers", "params", "json")}
    if sent.get("data") is not None:
        data = sent["data"]
        kwargs["content" if isinstance(data, bytes | str) else "data"] = data
    return kwargs


# -- hypothesis: arbitrary JSON at the endpoints that parse bodies themselves ---------------

# Every code point, lone surrogates included (Hypothesis leaves those out by default).
TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True))
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
LABELS = st.dictionaries(
    st.sampled_from(["alertname", "run_id", "host", "instance", "mlprof_action",
                     "mlprof_duration_ms"]) | TEXT,
    st.sampled_from(["capture", "snapshot", "0", "-1", "1" * 5000]) | TEXT,
    max_size=6,
)  # fmt: skip
ALERT = st.fixed_dictionaries(
    {"status": st.sampled_from(["firing", "resolved"]) | TEXT, "labels": LABELS},
    optional={"annotations": LABELS, "startsAt": TEXT | st.just("2026-01-01T00:00:00Z"),
              "fingerprint": TEXT, "extra": JSON},
)  # fmt: skip
PAYLOAD = st.fixed_dictionaries(
    {"alerts": st.lists(ALERT, max_size=3)},
    optional={"version": TEXT, "truncatedAlerts": NUMBERS, "groupLabels": JSON},
)


def _dumped(value: Any) -> bytes:
    # allow_nan: NaN and Infinity as Python writes them (not JSON, still a body to send)
    return json.dumps(value).encode()


NESTED = st.integers(min_value=1, max_value=6000).map(
    lambda depth: b'{"alerts": ' + b"[" * depth + b"]" * depth + b"}"
)
BODIES = st.one_of(PAYLOAD.map(_dumped), JSON.map(_dumped), NESTED, st.binary(max_size=200))


@pytest.mark.parametrize("path", ["/api/v1/alertmanager", "/api/v1/captures"])
def test_arbitrary_bodies_never_answer_5xx(client: TestClient, path: str) -> None:
    @FUZZ_SETTINGS
    @given(body=BODIES)
    def post(body: bytes) -> None:
        response = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code < 500, (response.status_code, response.text[:300], body[:200])
        if response.status_code >= 400:
            assert isinstance(response.json()["detail"], str | list)

    post()


def test_fuzzing_reached_the_capture_paths(client: TestClient) -> None:
    """The fuzzers are no use if every request died at the door: a plain one works."""
    answer = client.post("/api/v1/alertmanager", json={"alerts": []})
    assert answer.status_code == 202, answer.text
    assert client.get("/api/v1/targets").status_code == 200
