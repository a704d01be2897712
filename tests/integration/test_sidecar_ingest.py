"""The sidecar's Pyroscope ingest endpoints in front of the test receiver.

The app runs in process (no background loops); its sink pushes to a real receiver over
loopback. Uploads are shaped like pyroscope-io's (see test_ingest_formats).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exporter.api.app import create_app
from exporter.config import load_settings
from exporter.proto import pyroscope_push_pb2
from exporter.sidecar import Sidecar
from tests.pyroscope_receiver import PyroscopeReceiver
from tests.unit.test_ingest_formats import AGENT_LABELS, agent_pprof, push_body

pytestmark = pytest.mark.integration

TOKEN = "ingest-token"
PUSH = "/push.v1.PusherService/Push"
PROTO = {"Content-Type": "application/proto", "Content-Encoding": "gzip"}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _client(tmp_path: Path, **settings: object) -> TestClient:
    sidecar = Sidecar(
        load_settings(
            shared_dir=str(tmp_path / "shared"),
            store=str(tmp_path / "store"),
            spool_dir=str(tmp_path / "spool"),
            sources=["jax"],
            **settings,
        )
    )
    return TestClient(create_app(sidecar), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def started() -> Iterator[PyroscopeReceiver]:
    with PyroscopeReceiver() as receiver:
        yield receiver


@pytest.fixture
def receiver(started: PyroscopeReceiver) -> PyroscopeReceiver:
    """The module's receiver with nothing received yet."""
    with started._lock:
        started.received.clear()
        started.rejected.clear()
        started.requests = 0
    return started


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, started: PyroscopeReceiver) -> TestClient:
    return _client(
        tmp_path_factory.mktemp("ingest"),
        pyroscope_url=started.url,
        auth_token=TOKEN,
        ingest_max_body_bytes=64 * 1024,
    )


def test_agent_push_reaches_pyroscope_unchanged(
    client: TestClient, receiver: PyroscopeReceiver
) -> None:
    body = gzip.compress(push_body(AGENT_LABELS))
    response = client.post(PUSH, content=body, headers={**PROTO, **AUTH})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/proto"
    pyroscope_push_pb2.PushResponse.FromString(response.content)
    (series,) = receiver.wait_for(1)
    assert series.labels == AGENT_LABELS
    assert series.folded_where(phase="data") == {"main;prepare_batch": 30_000_000}
    assert series.headers["user-agent"] == "mlprof-exporter"


def test_legacy_ingest_reaches_pyroscope_as_a_push(
    client: TestClient, receiver: PyroscopeReceiver
) -> None:
    query = {"name": "trainer.cpu{run_id=r1,host=h0}", "format": "pprof", "sampleRate": "100",
             "from": "1700000000", "until": "1700000010", "spyName": "pyspy"}  # fmt: skip
    response = client.post(
        "/ingest",
        params=query,
        content=agent_pprof(),
        headers={"Content-Type": "binary/octet-stream", **AUTH},
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok"}
    (series,) = receiver.wait_for(1)
    assert series.labels == {"__name__": "process_cpu", "service_name": "trainer",
                             "run_id": "r1", "host": "h0", "pyroscope_spy": "pyspy"}  # fmt: skip
    assert series.folded() == {"main;prepare_batch": 30_000_000, "main": 10_000_000}


def test_pyroscope_down_spools_and_answers_ok(
    client: TestClient, receiver: PyroscopeReceiver, tmp_path: Path
) -> None:
    receiver.fail_next(1, 503)
    body = gzip.compress(push_body(AGENT_LABELS))
    response = client.post(PUSH, content=body, headers={**PROTO, **AUTH})
    assert response.status_code == 200, response.text
    assert receiver.received == []
    sidecar: Sidecar = client.app.state.sidecar  # type: ignore[attr-defined]
    assert sidecar.pyroscope is not None and len(sidecar.pyroscope.spool or []) == 1
    assert sidecar.pyroscope.drain() == 1  # the spool's loop delivers it later
    (series,) = receiver.wait_for(1)
    assert series.labels == AGENT_LABELS


def test_pyroscope_refusal_comes_back_to_the_agent(
    client: TestClient, receiver: PyroscopeReceiver
) -> None:
    receiver.fail_next(1, 400)
    body = gzip.compress(push_body(AGENT_LABELS))
    response = client.post(PUSH, content=body, headers={**PROTO, **AUTH})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument"
    assert "Pyroscope refused it" in response.json()["message"]


@pytest.mark.parametrize(
    ("headers", "body", "status", "words"),
    [
        ({**PROTO}, b"", 401, "missing bearer token"),
        ({**PROTO, "Authorization": "Bearer wrong"}, b"", 403, "wrong bearer token"),
        ({**PROTO, **AUTH}, b"\0" * (65 * 1024), 413, "MLPROF_INGEST_MAX_BODY_BYTES"),
        ({"Content-Type": "application/json", **AUTH}, b"{}", 415, "application/proto"),
        ({**PROTO, **AUTH}, gzip.compress(b"\xff\xff"), 400, "not a push.v1 PushRequest"),
    ],
)
def test_push_refusals_are_connect_errors(
    client: TestClient,
    receiver: PyroscopeReceiver,
    headers: dict[str, str],
    body: bytes,
    status: int,
    words: str,
) -> None:
    response = client.post(PUSH, content=body, headers=headers)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"code", "message"}
    assert words in response.json()["message"]
    assert receiver.requests == 0


def test_without_pyroscope_the_sidecar_says_so(tmp_path: Path) -> None:
    client = _client(tmp_path)
    response = client.post(PUSH, content=gzip.compress(push_body(AGENT_LABELS)), headers=PROTO)
    assert response.status_code == 503
    assert response.json() == {
        "code": "unavailable",
        "message": "the sidecar pushes no profiles: MLPROF_PYROSCOPE_URL is unset",
    }
    legacy = client.post("/ingest", params={"name": "a", "format": "pprof"}, content=agent_pprof())
    assert legacy.status_code == 503
    assert "MLPROF_PYROSCOPE_URL" in legacy.json()["detail"]


def test_bad_legacy_upload_is_400_and_nothing_is_pushed(
    client: TestClient, receiver: PyroscopeReceiver
) -> None:
    response = client.post(
        "/ingest", params={"name": "trainer{env}", "format": "pprof"}, content=agent_pprof(),
        headers=AUTH,
    )  # fmt: skip
    assert response.status_code == 400
    assert "is not key=value" in response.json()["detail"]
    assert receiver.requests == 0
