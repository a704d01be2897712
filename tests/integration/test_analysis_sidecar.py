"""Reports in the sidecar: every finished session gets analysis.json and summary.html
(written off the request path, bounded), alert sessions are compared against the
baseline, the API serves reports, comparisons and baseline marks, and the metrics count
reports and findings. A real ``mlprof serve`` on a store of real JAX CPU captures."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.pipeline.worker import ReportSettings, ReportWorker
from exporter.testing.synthetic import write_tpu_capture
from tests.analysis_captures import AnalysisCaptures
from tests.harness import Proc, free_port, wait_http, wait_until

pytestmark = pytest.mark.integration

RUN = "run-7"
T0 = datetime.now(UTC) - timedelta(hours=1)


def add_session(
    store: SessionStore,
    session_id: str,
    capture: Path | bytes,
    minutes: int,
    trigger: str = "manual",
) -> None:
    name = "host-a_9999.xplane.pb"
    directory = Path(store.session_dir(session_id))
    directory.mkdir(parents=True)
    if isinstance(capture, Path):
        shutil.copy(capture, directory / name)
    else:
        (directory / name).write_bytes(capture)
    store.write_record(
        SessionRecord(
            id=session_id,
            status="done",
            trigger=trigger,
            run_id=RUN,
            workload="trainer",
            created=T0 + timedelta(minutes=minutes),
            alert={"name": "MLWorkloadDutyCycleLow"} if trigger == "alert" else None,
            targets=[
                TargetResult(
                    address="127.0.0.1:9999", host="host-a", run_id=RUN, status="ok", files=[name]
                )
            ],
        )
    )


@pytest.fixture(scope="module")
def sidecar(
    analysis_captures: AnalysisCaptures, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, SessionStore]]:
    tmp = tmp_path_factory.mktemp("reports")
    store = SessionStore(tmp / "store")
    add_session(store, "good", analysis_captures.compute, 0)
    add_session(store, "slow", analysis_captures.sleepy, 10, trigger="alert")
    add_session(store, "broken", b"\x0a\x05not a capture at all", 20)
    port = free_port()
    env = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(tmp / "shared"),
        "MLPROF_STORE": str(tmp / "store"),
        "MLPROF_COLLECT_INTERVAL_S": "0.5",
        "MLPROF_REPORT_XPROF": "false",
        "MLPROF_GRAFANA_URL": "http://grafana.example:3000",
        "MLPROF_SOURCES": "jax",
    }
    proc = Proc.python(["-m", "exporter.cli", "serve"], tmp / "sidecar.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", timeout=120)
        yield url, store
    finally:
        print(proc.output()[-3000:])
        proc.stop()


def report(url: str, session: str, **headers: str) -> httpx.Response:
    return wait_until(
        lambda: (
            (
                r := httpx.get(
                    f"{url}/api/v1/sessions/{session}/report", headers=headers, timeout=10
                )
            ).status_code
            != 202
            and r
        ),
        timeout=240,
        interval=0.5,
        what=f"the report of session {session}",
    )


def test_alert_session_report_is_compared_with_the_baseline(
    sidecar: tuple[str, SessionStore],
) -> None:
    url, store = sidecar
    answer = report(url, "slow")
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["status"] == "NEEDS_ATTENTION"
    assert data["session"] == {
        "id": "slow",
        "run_id": RUN,
        "workload": "trainer",
        "trigger": "alert",
        "alert": "MLWorkloadDutyCycleLow",
    }
    assert data["baseline"]["session"] == "good"
    assert "not started by an alert" in data["baseline"]["reason"]
    first = data["findings"][0]
    assert first["rule"] == "BaselineRegressionRule"
    assert first["frame"].endswith("data_loading") and "data_loading" in first["title"]
    assert any(f["rule"] == "InputWaitRule" for f in data["findings"])
    assert data["links"]["Grafana dashboard"].startswith("http://grafana.example:3000/d/")
    files = store.files("slow")
    assert {"analysis.json", "summary.html"} <= set(files)
    # The verdict is in session.json too (session lists and Grafana's session table),
    # beside the flame graphs the other hook recorded: neither write lost the other.
    record = wait_until(
        lambda: (r := store.read_record("slow")) and r.report and r.processed and r,
        timeout=60,
        what="session.json with the report's verdict and the flame graphs",
    )
    assert record.report == {
        "status": "NEEDS_ATTENTION",
        "findings": data["finding_counts"],
        "file": "analysis.json",
    }
    assert any(a.get("kind") == "flamegraph" for a in record.artifacts)
    page = httpx.get(f"{url}/api/v1/sessions/slow/report", headers={"Accept": "text/html"})
    assert page.headers["content-type"].startswith("text/html")
    assert 'class="NEEDS_ATTENTION"' in page.text and "data_loading" in page.text


def test_a_manual_session_gets_a_report_without_a_comparison(
    sidecar: tuple[str, SessionStore],
) -> None:
    url, _ = sidecar
    data = report(url, "good").json()
    assert data["baseline"] is None and data["status"] in ("OPTIMAL", "NEEDS_ATTENTION")
    assert not [f for f in data["findings"] if f["rule"] == "InputWaitRule"]


def test_a_failed_analysis_is_recorded_not_fatal(sidecar: tuple[str, SessionStore]) -> None:
    url, store = sidecar
    answer = report(url, "broken")
    assert answer.status_code == 500 and "the analysis failed" in answer.json()["detail"]
    assert "analysis-error.json" in store.files("broken")
    broken = store.read_record("broken")
    assert broken is not None and broken.report and broken.report["status"] == "error"
    assert httpx.get(f"{url}/healthz").is_success
    assert httpx.get(f"{url}/api/v1/sessions/nope/report").status_code == 404


def test_metrics_count_reports_and_findings(sidecar: tuple[str, SessionStore]) -> None:
    url, _ = sidecar
    for session in ("slow", "good", "broken"):
        report(url, session)

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("mlprof_report")
        }

    found = wait_until(
        lambda: (m := samples()) and m.get(("mlprof_reports_total", (("status", "error"),))) and m,
        timeout=30,
        what="report metrics",
    )
    assert found[("mlprof_reports_total", (("status", "NEEDS_ATTENTION"),))] >= 1
    assert ("mlprof_reports_total", (("status", "OPTIMAL"),)) in found  # exported from 0
    key = ("mlprof_report_findings", (("priority", "P0"), ("run_id", RUN), ("workload", "trainer")))
    # The run's newest session is "broken" (its analysis failed: no findings to export);
    # the newest with a report is the alert session "slow", whatever order they finished.
    assert found[key] >= 1


def test_compare_and_baseline_api(sidecar: tuple[str, SessionStore]) -> None:
    url, store = sidecar
    diff = httpx.get(
        f"{url}/api/v1/compare",
        params={"base": "good", "head": "slow", "kind": "host"},
        timeout=300,
    )
    assert diff.status_code == 200, diff.text
    data = diff.json()
    assert data["normalisation"] == "per_step"
    assert data["regressions"][0]["name"] == "data_loading"
    page = httpx.get(
        f"{url}/api/v1/compare",
        params={"base": "good", "head": "slow"},
        headers={"Accept": "text/html"},
        timeout=300,
    )
    assert page.status_code == 200 and 'id="diff-data"' in page.text
    for bad in ("/etc/passwd", "../good", "good/../../x"):
        refused = httpx.get(f"{url}/api/v1/compare", params={"base": bad, "head": "slow"})
        assert refused.status_code in (404, 422), (bad, refused.text)

    mark = httpx.put(f"{url}/api/v1/baselines/trainer", json={"session_id": "good"})
    assert mark.status_code == 200 and mark.json()["session_id"] == "good"
    assert (Path(store.root) / "baselines" / "trainer.json").is_file()
    assert httpx.get(f"{url}/api/v1/baselines").json()["baselines"][0]["workload"] == "trainer"
    escape = httpx.put(f"{url}/api/v1/baselines/..%2F..%2Fescape", json={"session_id": "good"})
    assert escape.status_code in (400, 404)
    unknown = httpx.put(f"{url}/api/v1/baselines/trainer", json={"session_id": "nope"})
    assert unknown.status_code == 404
    foreign = httpx.put(
        f"{url}/api/v1/baselines/trainer",
        json={"session_id": "good"},
        headers={"Origin": "https://evil.example"},
    )
    assert foreign.status_code == 403


def test_analysis_is_bounded_in_time_and_memory(
    analysis_captures: AnalysisCaptures, tmp_path: Path
) -> None:
    store = SessionStore(tmp_path / "store")
    add_session(store, "s1", analysis_captures.compute, 0)
    # The time bound by construction, not by a race with the machine's speed: a child
    # given 10 ms cannot even import numpy, let alone read 400,000 events.
    big = tmp_path / "big" / "tpu-vm-0.xplane.pb"
    write_tpu_capture(big, devices=4, steps=10, ops_per_step=10_000, distinct_ops=400)
    add_session(store, "s-big", big, 0)
    events = []
    slow = ReportWorker(store, ReportSettings(timeout_s=0.01, xprof=False))
    slow.on_report.append(events.append)
    event = slow.process("s-big")
    assert event is not None and event.status == "error" and "took over" in event.error
    assert events == [event]  # callbacks hear about failures too
    small = ReportWorker(store, ReportSettings(max_memory_mb=64, xprof=False))
    event = small.process("s1")
    assert event is not None and event.status == "error"
    record = json.loads(Path(store.session_dir("s1"), "analysis-error.json").read_text())
    assert record["status"] == "error"
    assert "analysis.json" not in store.files("s1")


def test_run_side_and_baseline_cli(sidecar: tuple[str, SessionStore]) -> None:
    from click.testing import CliRunner

    from exporter.analysis.sides.load import SideContext, load_side
    from exporter.cli import main

    _, store = sidecar
    run = load_side(f"run:{RUN}", "host", SideContext(store=store.url))
    assert run.source == "run" and len(run.files) == 2  # good and slow
    assert run.notes[0] == "2 sessions merged: good, slow"
    assert any(n.startswith("skipped broken/") for n in run.notes)
    assert len(run.steps) > 20  # both sessions' steps are samples

    done = CliRunner().invoke(main, ["baseline", "set", "slow", "--store", store.url])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["session_id"] == "slow"
    assert (
        json.loads((Path(store.root) / "baselines" / "trainer.json").read_text())["set_by"] == "cli"
    )
    escape = CliRunner().invoke(main, ["baseline", "set", "../good", "--store", store.url])
    assert escape.exit_code == 2 and "expected 1-128 characters" in escape.output


def test_alert_sessions_are_analysed_first(
    analysis_captures: AnalysisCaptures, tmp_path: Path
) -> None:
    store = SessionStore(tmp_path / "store")
    for index, (session, trigger) in enumerate(
        [("m1", "manual"), ("m2", "manual"), ("a1", "alert"), ("m3", "manual")]
    ):
        add_session(store, session, analysis_captures.compute, index, trigger=trigger)
    worker = ReportWorker(store, ReportSettings(xprof=False))
    order: list[str] = []
    worker.on_report.append(lambda event: order.append(event.session_id))
    futures = [worker(store.read_record(s)) for s in ("m1", "m2", "a1", "m3")]  # type: ignore[arg-type]
    assert worker(store.read_record("m1")) is None  # type: ignore[arg-type]  # once per session
    for future in futures:
        assert future is not None and future.result(timeout=600) is not None
    worker.close()
    # m1 was already running when the others arrived; then the alert jumps the queue.
    assert order.index("a1") <= 1 and order[-2:] == ["m2", "m3"], order
