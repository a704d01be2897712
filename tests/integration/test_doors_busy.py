"""The doors that serve others when the job child cannot answer for want of time or
memory budget, and the settings a door hands its child (exporter.pipeline.job).

A child stopped at its deadline, or never started because the memory budget stayed
full, says nothing about the input: the API answers 503 with ``Retry-After`` and MCP
raises UnavailableError (both used to be a 422, "bad input"). A YAML config's pprof
inflation bounds reach the child's flame-graph subtree as its other values do (they
followed the child's environment only).
"""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

import httpx
import pytest

from exporter.api.app import create_app
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.config import load_settings
from exporter.errors import InputError, UnavailableError
from exporter.mcp_server import ProfileTools
from exporter.sidecar import Sidecar
from exporter.testing.synthetic import write_tpu_capture
from tests.sidecar_app import settings_in

pytestmark = pytest.mark.integration

SHAPE = {"devices": 1, "steps": 4, "ops_per_step": 40, "distinct_ops": 10}


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("MLPROF_")]:
        monkeypatch.delenv(name)


def _session(store: SessionStore, session_id: str, files: dict[str, bytes] | None = None) -> None:
    directory = store.local_dir(session_id)
    assert directory is not None
    names = []
    if files is None:
        write_tpu_capture(directory / "tpu-vm-0.xplane.pb", **SHAPE)
        names = ["tpu-vm-0.xplane.pb"]
    else:
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (directory / name).write_bytes(data)
            names.append(name)
    target = TargetResult(address="tpu-vm-0:9999", host="tpu-vm-0", status="ok", files=names)
    store.write_record(SessionRecord(id=session_id, status="done", targets=[target]))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("busy") / "store"
    sessions = SessionStore(str(root))
    for session_id in ("base", "head"):
        _session(sessions, session_id)
    # 2 MiB of zeros in about 2 KB: the default ratio (200x) refuses it at 1 MiB.
    bomb = gzip.compress(bytes(2 << 20), 9)
    _session(sessions, "memory", {"device_memory.pprof.gz": bomb})
    return root


def _compare_through_the_api(sidecar: Sidecar) -> httpx.Response:
    app = create_app(sidecar)

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        base_url = f"http://{sidecar.settings.listen}"  # the sidecar checks the Host header
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            return await client.get("/api/v1/compare?base=base&head=head", timeout=600)

    return asyncio.run(call())


def test_a_child_past_its_deadline_is_503_not_422(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    # No interpreter starts, let alone compares, in 10 ms: the child is stopped.
    settings = settings_in(tmp_path, store=str(store), report_timeout_s=0.01)
    done = _compare_through_the_api(Sidecar(settings))
    assert done.status_code == 503, done.text
    assert "was stopped" in done.json()["detail"] and done.headers["retry-after"]

    tools = ProfileTools(str(store), settings=settings)
    with pytest.raises(UnavailableError, match="was stopped"):
        tools.compare("base", "head")


def test_a_child_without_memory_budget_is_503_not_422(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    settings = settings_in(
        tmp_path, store=str(store), report_timeout_s=0.5, memory_limit_mb=1024,
        report_max_memory_mb=512,
    )  # fmt: skip
    sidecar = Sidecar(settings)  # its budget is this process's (set_default_budget)
    try:
        # Another child holds the whole budget for as long as the requests may wait.
        with sidecar.memory_budget.reserve(1024, "another child", wait_s=1.0):
            done = _compare_through_the_api(sidecar)
            tools = ProfileTools(str(store), settings=settings)
            with pytest.raises(UnavailableError, match="memory budget"):
                tools.compare("base", "head")
    finally:
        from exporter.sandbox import set_default_budget

        set_default_budget(None)
    assert done.status_code == 503, done.text
    assert "not started" in done.json()["detail"] and done.headers["retry-after"]


def test_a_yaml_files_inflation_bounds_reach_the_subtree_child(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    config = tmp_path / "mlprof.yaml"
    config.write_text("max_profile_bytes: 1048576\nmax_profile_ratio: 100000\n")
    settings = load_settings(config, store=str(store))
    tools = ProfileTools(str(store), settings=settings)
    # The file's bounds, not the defaults: the byte cap stops it, not the 200x ratio.
    with pytest.raises(InputError, match="MLPROF_MAX_PROFILE_BYTES=1048576"):
        tools.flamegraph_subtree("memory", kind="memory")
