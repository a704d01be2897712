"""One use case, four doors: the CLI, the HTTP API, the MCP tools and the job child give
the same answer to the same question, with the same credentials and the same refusals
(exporter.usecases).

Each door is driven as a user drives it: the CLI through click, the API through its
ASGI app, the MCP tools through ``ProfileTools`` (their stdio server is
tests/integration/test_mcp.py's), on one store of TPU-shaped sessions.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from exporter.api.app import create_app
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.cli import main
from exporter.mcp_server import ProfileTools
from exporter.profiles.flamegraph import FlameGraph
from exporter.sidecar import Sidecar
from exporter.sinks.pyroscope import PyroscopeSink
from exporter.testing.synthetic import write_tpu_capture
from tests.pyroscope_receiver import PyroscopeReceiver
from tests.sidecar_app import settings_in

pytestmark = pytest.mark.integration

SHAPE = {"devices": 1, "steps": 8, "ops_per_step": 120, "distinct_ops": 30}
# The sessions of the store: (id, run, slowdown).
SESSIONS = [
    ("base", "run-a", 1.0),
    ("base-2", "run-a", 1.0),
    ("slow", "run-b", 1.5),
    ("slow-2", "run-b", 1.5),
    ("base-3", "run-c", 1.0),
]
# What a side's JSON says about where it was read: a door that serves others names a
# local session by its directory, the CLI by the id it was given.
WHERE = ("spec", "files")


def _session(store: SessionStore, session_id: str, run_id: str, slowdown: float) -> None:
    directory = store.local_dir(session_id)
    assert directory is not None
    write_tpu_capture(directory / "tpu-vm-0.xplane.pb", slowdown=slowdown, **SHAPE)
    store.write_record(
        SessionRecord(
            id=session_id,
            status="done",
            run_id=run_id,
            workload="train",
            targets=[
                TargetResult(
                    address="tpu-vm-0:9999",
                    host="tpu-vm-0",
                    run_id=run_id,
                    status="ok",
                    files=["tpu-vm-0.xplane.pb"],
                )
            ],
        )
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("doors") / "store"
    sessions = SessionStore(str(root))
    for session_id, run_id, slowdown in SESSIONS:
        _session(sessions, session_id, run_id, slowdown)
    return root


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("MLPROF_")]:
        monkeypatch.delenv(name)


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    done = CliRunner().invoke(main, list(args), env=env)
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def api(tmp_path: Path, store: Path, path: str, **overrides: Any) -> httpx.Response:
    settings = settings_in(tmp_path, store=str(store), **overrides)
    app = create_app(Sidecar(settings))

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        base_url = f"http://{settings.listen}"  # the sidecar checks the Host header
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            return await client.get(path, timeout=600)

    return asyncio.run(call())


def answer(comparison: dict[str, Any]) -> dict[str, Any]:
    """What a comparison found, without where each door read its sides from."""
    found = {k: v for k, v in comparison.items() if k not in ("timings",)}
    for side in ("base", "head"):
        described = found.get(side)
        if isinstance(described, dict):
            found[side] = {k: v for k, v in described.items() if k not in WHERE}
        elif isinstance(described, list):
            found[side] = [{k: v for k, v in d.items() if k not in WHERE} for d in described]
    return found


def test_compare_answers_alike_through_every_door(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    by_cli = cli("compare", "base", "slow", "--store", str(store), "--format", "json")
    by_api = api(tmp_path, store, "/api/v1/compare?base=base&head=slow")
    assert by_api.status_code == 200, by_api.text
    by_mcp = ProfileTools(str(store)).compare("base", "slow")

    assert by_cli["step_verdict"]["verdict"] == "slower", by_cli["step_verdict"]
    assert answer(by_api.json()) == answer(by_cli)
    assert answer(by_mcp) == answer(by_cli)


def test_replicates_a_side_answer_alike_through_every_door(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    by_cli = cli(
        "compare", "--base", "base", "--base", "base-2", "--head", "run:run-b~2",
        "--store", str(store), "--format", "json",
    )  # fmt: skip
    query = "base=base&base=base-2&head=run:run-b~2"
    by_api = api(tmp_path, store, f"/api/v1/compare?{query}")
    assert by_api.status_code == 200, by_api.text
    by_mcp = ProfileTools(str(store)).compare(["base", "base-2"], "run:run-b~2")

    assert by_cli["step_verdict"]["verdict"] == "slower", by_cli["step_verdict"]
    assert answer(by_api.json()) == answer(by_cli)
    assert answer(by_mcp) == answer(by_cli)


def test_earlier_runs_judge_the_changes_alike_through_every_door(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --history: the earlier runs' median steps set the step noise instead of the
    # backend's fixed floor (issue 29, item 3; with one capture a side and fewer than 8
    # runs the frames keep the fixed floors, and the note says so); the API and MCP
    # tools take the same.
    from exporter.config import load_settings
    from exporter.pipeline.job import COMPARE_JSON, ChildLimits, in_child
    from exporter.usecases import side_context

    _clean_env(monkeypatch)
    # "base" is a side: left out of its own comparison's history (a note says so).
    history = ["base", "base-2", "base-3", "slow-2"]
    by_cli = cli(
        "compare", "base", "slow", *[f"--history={h}" for h in history],
        "--store", str(store), "--format", "json",
    )  # fmt: skip
    context = side_context(load_settings(store=str(store)))
    options = ["--base=base", "--head=slow", *[f"--history={h}" for h in history]]
    found = in_child("compare", [], context, ChildLimits(), options, read=[COMPARE_JSON])
    by_child = json.loads(found[COMPARE_JSON])
    query = "base=base&head=slow&" + "&".join(f"history={h}" for h in history)
    by_api = api(tmp_path, store, f"/api/v1/compare?{query}")
    assert by_api.status_code == 200, by_api.text
    by_mcp = ProfileTools(str(store)).compare("base", "slow", history=history)

    assert by_cli["step_verdict"]["noise_source"] == "3 earlier runs", by_cli["step_verdict"]
    between = by_cli["noise"]["between_runs"]
    assert (between["source"], between["history_runs"]) == ("fixed floors", 0)
    assert any("3 earlier runs judge the step time" in n for n in by_cli["notes"])
    assert any("1 of the history's runs are compared" in n for n in by_cli["notes"])
    assert answer(by_child) == answer(by_cli)
    assert answer(by_api.json()) == answer(by_cli)
    assert answer(by_mcp) == answer(by_cli)


def test_sessions_are_listed_alike_with_or_without_a_sidecar(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    by_flag = cli("sessions", "--store", str(store), "--limit", "50", "--json")
    # MLPROF_STORE is honoured: no sidecar listens (MLPROF_LISTEN's default port here).
    by_env = cli("sessions", "--limit", "50", "--json", env={"MLPROF_STORE": str(store)})
    by_api = api(tmp_path, store, "/api/v1/sessions?limit=50")
    by_mcp = ProfileTools(str(store)).list_sessions(limit=50)

    assert [s["id"] for s in by_flag["sessions"]] == [s for s, _, _ in reversed(SESSIONS)]
    assert by_env == by_flag == by_api.json() == by_mcp
    of_run = cli("sessions", "--store", str(store), "--run-id", "run-b", "--json")
    assert [s["id"] for s in of_run["sessions"]] == ["slow-2", "slow"] and of_run["total"] == 2


def test_bad_names_are_refused_alike_by_the_doors_that_serve_others(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    tools = ProfileTools(str(store))
    for value, status, words in (
        ("../../etc", 422, "expected 1-128 characters"),
        ("/etc", 422, "expected 1-128 characters"),
        ("run:a/b", 422, "expected run:<run_id>"),
        ("run:run-b~0", 422, "N of 1-"),
        ("no-such-session", 404, "no session 'no-such-session'"),
    ):
        by_api = api(tmp_path, store, f"/api/v1/compare?base=base&head={value}")
        assert by_api.status_code == status and words in by_api.json()["detail"], by_api.text
        with pytest.raises(Exception, match=words.replace("(", r"\(").replace("[", r"\[")):
            tools.compare("base", value)


@pytest.fixture(scope="module")
def pyroscope() -> Iterator[PyroscopeReceiver]:
    with PyroscopeReceiver() as receiver:
        sink = PyroscopeSink(receiver.url)
        for run_id, extra in (("r-base", 0), ("r-head", 900_000_000)):
            folded = "main;train_step;forward 600000000\nmain;train_step;backward 400000000\n"
            folded += f"main;train_step;load_batch {extra}\n" if extra else ""
            graph = FlameGraph.from_folded(
                folded, sample_type="cpu", unit="nanoseconds", profile_name="process_cpu"
            )
            labels = {"service_name": "trainer", "run_id": run_id, "host": "h0"}
            assert sink.push(graph, labels).status == "ok"
        sink.close()
        receiver.wait_for(2)
        yield receiver


def test_every_door_sends_pyroscope_the_same_credentials(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pyroscope: PyroscopeReceiver
) -> None:
    # The CLI sent tenant and basic auth, the API only the tenant, MCP nothing.
    _clean_env(monkeypatch)
    credentials = {
        "MLPROF_PYROSCOPE_URL": pyroscope.url,
        "MLPROF_PYROSCOPE_TENANT": "team-a",
        "MLPROF_PYROSCOPE_USER": "reader",
        "MLPROF_PYROSCOPE_PASSWORD": "s3cret",
    }
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    sides = ['pyroscope:{service_name="trainer",run_id="r-base"}',
             'pyroscope:{service_name="trainer",run_id="r-head"}']  # fmt: skip
    wanted = {
        "x-scope-orgid": "team-a",
        "authorization": "Basic " + base64.b64encode(b"reader:s3cret").decode(),
    }
    found: dict[str, list[dict[str, str]]] = {}
    answers: dict[str, dict[str, Any]] = {}
    for door in ("cli", "api", "mcp"):
        asked = len(pyroscope.query_headers)
        if door == "cli":
            answers[door] = cli(
                "compare", *sides, "--kind", "host", "--store", str(store), "--format", "json"
            )
        elif door == "api":
            query = httpx.QueryParams({"base": sides[0], "head": sides[1], "kind": "host"})
            done = api(tmp_path, store, f"/api/v1/compare?{query}")
            assert done.status_code == 200, done.text
            answers[door] = done.json()
        else:
            answers[door] = ProfileTools(str(store)).compare(*sides, kind="host")
        found[door] = pyroscope.query_headers[asked:]
    for door, headers in found.items():
        assert headers, f"{door}: Pyroscope was not asked"
        for sent in headers:
            assert {k: sent.get(k) for k in wanted} == wanted, (door, sent)
    assert answer(answers["api"]) == answer(answers["cli"]) == answer(answers["mcp"])
    names = [r["name"] for r in answers["cli"]["regressions"] if r.get("regression")]
    assert "load_batch" in names, answers["cli"]["regressions"]


def test_review_round_refusals_and_precedence(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.errors import ConfigError, UnavailableError
    from exporter.usecases import stored_side

    _clean_env(monkeypatch)
    # An analysis reads captures: a Pyroscope selection is refused in one line, even where
    # Pyroscope is configured (it failed as a "bad session name" ValueError).
    monkeypatch.setenv("MLPROF_PYROSCOPE_URL", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="not a side here"):
        ProfileTools(str(store)).analyze('pyroscope:{service_name="x"}', xprof=False)
    monkeypatch.delenv("MLPROF_PYROSCOPE_URL")
    # --url on the command line asks that sidecar, though MLPROF_STORE is set.
    done = CliRunner().invoke(
        main,
        ["sessions", "--url", "http://127.0.0.1:9", "--json"],
        env={"MLPROF_STORE": str(store)},
    )
    assert done.exit_code == 1 and "127.0.0.1:9" in done.output, done.output
    # A remote store: an unrecorded session is a session; one that does not answer is
    # UnavailableError (the API's 503), never "no such session" (404).
    bucket = SessionStore(f"memory://doors-{tmp_path.name}")
    bucket.write_file("unrecorded-1", "h.xplane.pb", b"capture")
    assert stored_side(bucket, "unrecorded-1", pyroscope=False) == "unrecorded-1"
    monkeypatch.setattr(bucket, "session_files", _unreachable)
    with pytest.raises(UnavailableError, match="cannot read the store"):
        stored_side(bucket, "unrecorded-1", pyroscope=False)


def _unreachable(session_id: str) -> dict[str, int]:
    raise ConnectionRefusedError(111, "Connection refused")
