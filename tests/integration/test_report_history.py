"""The sidecar's report judges an alert session against its workload's own history
(issue 29, item 3): the earlier sessions of the same run name and configuration, not
alert-started, give each frame's spread; a session of another configuration is the
baseline if it is the newest, but never history."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.pipeline.worker import ReportSettings, ReportWorker
from exporter.testing.synthetic import write_tpu_capture

pytestmark = pytest.mark.integration

NAME = "tpu-vm-0_8466.xplane.pb"
SHAPE: dict[str, Any] = {"devices": 1, "steps": 10, "ops_per_step": 120, "distinct_ops": 30}
T0 = datetime.now(UTC) - timedelta(hours=1)


def add_session(
    store: SessionStore, session_id: str, minutes: int, trigger: str, config: str, **shape: Any
) -> None:
    directory = Path(store.session_dir(session_id))
    directory.mkdir(parents=True)
    write_tpu_capture(directory / NAME, **{**SHAPE, **shape})
    store.write_record(
        SessionRecord(
            id=session_id,
            status="done",
            trigger=trigger,
            run_id=f"run-{session_id}",
            workload="trainer",
            config_fingerprint=config,
            created=T0 + timedelta(minutes=minutes),
            alert={"name": "MLWorkloadDutyCycleLow"} if trigger == "alert" else None,
            targets=[
                TargetResult(
                    address="127.0.0.1:8466",
                    host="tpu-vm-0",
                    run_id=f"run-{session_id}",
                    status="ok",
                    files=[NAME],
                )
            ],
        )
    )


def test_an_alert_report_is_judged_against_the_workloads_history(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "store")
    good = [f"good-{n}" for n in range(8)]  # one capture a side: 8 runs judge frames
    for n, session_id in enumerate(good):
        add_session(store, session_id, n, "manual", "aaaa", seed=n)
    add_session(store, "other-config", 9, "manual", "bbbb", seed=17)
    add_session(store, "alert", 10, "alert", "aaaa", slowdown=1.3, seed=19)
    worker = ReportWorker(store, ReportSettings(xprof=False))
    for session_id in [*good, "other-config", "alert"]:
        assert worker.process(session_id) is not None, session_id

    report = json.loads(store.fs.cat_file(f"{store.session_dir('alert')}/analysis.json"))
    # The newest earlier session is the baseline, whatever its configuration ...
    assert report["baseline"]["session"] == "other-config", report["baseline"]["reason"]
    # ... but only the same configuration's runs are history: 8, not 9.
    for kind, comparison in report["baseline"]["comparisons"].items():
        between = comparison["noise"]["between_runs"]
        assert (between["source"], between["history_runs"]) == ("history", 8), kind
        assert "8 earlier runs" in comparison["min_detectable"]["basis"], kind


def test_too_short_a_history_leaves_the_fixed_floors(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "store")
    for n in range(3):
        add_session(store, f"good-{n}", n, "manual", "aaaa", seed=n)
    add_session(store, "alert", 10, "alert", "aaaa", slowdown=1.3, seed=9)
    worker = ReportWorker(store, ReportSettings(xprof=False))
    for session_id in ("good-0", "good-1", "good-2", "alert"):
        assert worker.process(session_id) is not None, session_id
    report = json.loads(store.fs.cat_file(f"{store.session_dir('alert')}/analysis.json"))
    assert report["baseline"]["comparisons"], report["baseline"]
    for comparison in report["baseline"]["comparisons"].values():
        assert comparison["noise"]["between_runs"]["source"] == "fixed floors"


def test_the_baseline_is_no_earlier_run_of_its_own_comparison(tmp_path: Path) -> None:
    """The newest earlier session is the baseline and was the newest of the workload's
    history: it is one side of the comparison, so the history leaves it out and takes
    the next 10 (before: the 8 newest, the baseline among them), but one whose sides
    are not cached."""
    from exporter.analysis.sides.baselines import BaselineStore

    store = SessionStore(tmp_path / "store")
    good = [f"good-{n}" for n in range(11)]
    for n, session_id in enumerate(good):
        add_session(store, session_id, n, "manual", "aaaa", seed=n)
    add_session(store, "alert", 20, "alert", "aaaa", slowdown=1.3, seed=29)
    worker = ReportWorker(store, ReportSettings(xprof=False))
    for session_id in good:
        assert worker.process(session_id) is not None, session_id
    # A run whose sides are not cached is no history: the report would decode it.
    from exporter.analysis.sides import cache as side_cache

    side_cache.cache_path(Path(store.session_dir("good-0")) / NAME).unlink()
    assert worker.process("alert") is not None
    report = json.loads(store.fs.cat_file(f"{store.session_dir('alert')}/analysis.json"))
    assert report["baseline"]["session"] == "good-10"
    for kind, comparison in report["baseline"]["comparisons"].items():
        assert comparison["noise"]["between_runs"]["history_runs"] == 9, kind
    alert = store.read_record("alert")
    assert alert is not None
    chosen = BaselineStore(store).history_sessions(alert, exclude={"good-10"})
    assert chosen == [f"good-{n}" for n in range(9, -1, -1)]
