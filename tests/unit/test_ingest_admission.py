"""The sidecar's ingest endpoints: 503 before reading when no Pyroscope is set, 429
beyond the uploads it reads at once."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

import httpx
import pytest

from exporter.api.admission import AdmissionPool
from exporter.api.app import create_app
from exporter.sidecar import Sidecar
from tests.sidecar_app import settings_in
from tests.unit.test_ingest_formats import AGENT_LABELS, agent_pprof, push_body

PUSH = "/push.v1.PusherService/Push"
PROTO = {"content-type": "application/proto", "content-encoding": "gzip"}


def _post(app: object, listen: str, path: str, **kwargs: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{listen}") as client:
            return await client.post(path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_without_pyroscope_uploads_are_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    monkeypatch.setattr("exporter.api.ingest.push_from_connect", lambda *args: parsed.append(1))
    monkeypatch.setattr("exporter.api.ingest.push_from_ingest", lambda *a, **k: parsed.append(1))
    settings = settings_in(tmp_path)
    app = create_app(Sidecar(settings))
    # Not even a valid body: it used to be parsed (400) before the 503.
    push = _post(app, settings.listen, PUSH, content=b"\x1f\x8b garbage", headers=PROTO)
    assert push.status_code == 503 and push.json()["code"] == "unavailable"
    legacy = _post(
        app, settings.listen, "/ingest", params={"name": "a", "format": "folded"}, content=b"x"
    )
    assert legacy.status_code == 503 and "MLPROF_PYROSCOPE_URL" in legacy.json()["detail"]
    assert parsed == []


def test_uploads_beyond_those_read_at_once_get_429(tmp_path: Path) -> None:
    settings = settings_in(tmp_path, pyroscope_url="http://127.0.0.1:9")
    app = create_app(Sidecar(settings))
    pool = app.state.ingest_pool = AdmissionPool(1, 0)
    assert pool.admit()  # one upload being read: the pool is full
    body = gzip.compress(push_body(AGENT_LABELS, agent_pprof()))
    busy = _post(app, settings.listen, PUSH, content=body, headers=PROTO)
    assert busy.status_code == 429
    assert busy.headers["retry-after"] == "5"
    assert busy.json()["code"] == "resource_exhausted"
    legacy = _post(
        app, settings.listen, "/ingest", params={"name": "a", "format": "pprof"},
        content=agent_pprof(),
    )  # fmt: skip
    assert legacy.status_code == 429 and legacy.headers["retry-after"] == "5"
    pool.release()
    assert pool.admitted == 0 and pool.refused == 2
