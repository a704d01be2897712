"""Issue 22: a new user's first hour and the attack round's smaller breaks, on the
sidecar's HTTP surface (the app in process, on temp dirs)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from exporter.api.app import create_app
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.cli import main
from exporter.pipeline.job import REPORT_HTML, REPORT_JSON, JobResult
from exporter.pipeline.worker import ReportEvent, ReportSettings, ReportWorker
from exporter.sidecar import Sidecar
from tests.sidecar_app import settings_in

pytestmark = pytest.mark.integration

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def _app_with_report(tmp_path: Path) -> tuple[Sidecar, TestClient]:
    sidecar = Sidecar(settings_in(tmp_path))
    store = sidecar.captures.store
    store.write_record(SessionRecord(id="s1", status="done", report={"status": "ok"}))
    store.write_file("s1", REPORT_JSON, json.dumps({"findings": []}).encode())
    store.write_file("s1", REPORT_HTML, b"<html>report</html>")
    # No lifespan: the store is read by the request alone, no loop needs to run.
    return sidecar, TestClient(create_app(sidecar), base_url="http://127.0.0.1")


def test_the_reports_json_link_gives_json_to_a_browser(tmp_path: Path) -> None:
    sidecar, client = _app_with_report(tmp_path)
    record = sidecar.captures.store.read_record("s1")
    assert record is not None
    link = sidecar.reports._links(record, None)["report (JSON)"]
    assert link.endswith("/api/v1/sessions/s1/report?format=json")
    answer = client.get(
        "/api/v1/sessions/s1/report?format=json", headers={"Accept": BROWSER_ACCEPT}
    )
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json() == {"findings": []}
    # Without the parameter a browser still gets the page, and ?format=html wins too.
    assert client.get("/api/v1/sessions/s1/report", headers={"Accept": BROWSER_ACCEPT}).text == (
        "<html>report</html>"
    )
    page = client.get("/api/v1/sessions/s1/report?format=html", headers={"Accept": "*/*"})
    assert page.text == "<html>report</html>"


class _InProcessApi:
    """The CLI's API client, answered by the app in process."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.base_url = str(client.base_url)

    def get(self, path: str, **params: object) -> object:
        shown = {k: v for k, v in params.items() if v is not None}
        return self.client.get(path, params=shown).raise_for_status().json()  # type: ignore[arg-type]


def test_sessions_with_a_filter_count_the_stored_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = _app_with_report(tmp_path)  # one manual session in the store
    monkeypatch.setattr("exporter.cli_capture._client", lambda *_: _InProcessApi(client))
    listed = CliRunner().invoke(main, ["sessions", "--trigger", "snapshot"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.strip().splitlines() == ["0 of 1 sessions"]  # was "0 of 0 sessions"


class _FullStore(SessionStore):
    """A store whose disk fills up while a report is written: a 0-byte file is left."""

    def write_file(self, session_id: str, name: str, data: bytes) -> None:
        if name in (REPORT_HTML, REPORT_JSON):
            super().write_file(session_id, name, b"")
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write_file(session_id, name, data)


def test_a_report_the_full_store_cannot_take_is_an_error_not_pending_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_in(tmp_path)
    store = _FullStore(settings.store)
    capture = TargetResult(address="h:1", host="h", status="ok", files=["h.xplane.pb"])
    store.write_record(SessionRecord(id="s1", status="done", targets=[capture]))

    def analysed(args: list[str], *_: object) -> JobResult:  # the child, without the work
        out = Path(args[2])
        (out / REPORT_JSON).write_text(json.dumps({"status": "ok", "finding_counts": {}}))
        (out / REPORT_HTML).write_text("<html>report</html>")
        return JobResult(ok=True)

    monkeypatch.setattr("exporter.pipeline.worker.run_job", analysed)
    worker = ReportWorker(store, ReportSettings(xprof=False))
    heard: list[ReportEvent] = []
    worker.on_report.append(heard.append)
    event = worker.process("s1")
    assert event is not None and event.status == "error"  # was: an exception, logged only
    assert "No space left on device" in event.error
    assert heard == [event]
    files = store.files("s1")
    assert REPORT_HTML not in files and REPORT_JSON not in files  # no 0-byte page left
    client = TestClient(create_app(Sidecar(settings)), base_url="http://127.0.0.1")
    answer = client.get("/api/v1/sessions/s1/report")
    assert answer.status_code == 500  # was 202 "pending", for ever
    assert "cannot write the report into the store" in answer.json()["detail"]


def test_a_deeply_nested_baseline_body_is_a_400_not_a_500(tmp_path: Path) -> None:
    sidecar = Sidecar(settings_in(tmp_path))
    client = TestClient(
        create_app(sidecar), base_url="http://127.0.0.1", raise_server_exceptions=False
    )
    body = "[" * 2000 + "]" * 2000  # 4,000 bytes: RecursionError in json.loads
    answer = client.put(
        "/api/v1/baselines/trainer", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400, answer.text  # was 500
    assert "nests deeper than" in answer.json()["detail"]
