"""Baseline marks in the store, names that cannot escape it, and the automatic choice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def record(
    session_id: str,
    minutes: int,
    trigger: str = "manual",
    status: str = "done",
    workload: str = "trainer",
    run_id: str = "r1",
) -> SessionRecord:
    return SessionRecord(
        id=session_id,
        status=status,
        trigger=trigger,
        workload=workload,
        run_id=run_id,  # type: ignore[arg-type]
        created=T0 + timedelta(minutes=minutes),
        targets=[TargetResult(address="h:9999", host="h", status="ok", files=["h.xplane.pb"])],
    )


@pytest.fixture
def marks(tmp_path: Path) -> BaselineStore:
    store = SessionStore(tmp_path / "store")
    for rec in (
        record("good-1", 0),
        record("good-2", 10),
        record("alert-1", 20, trigger="alert"),
        record("failed", 25, status="failed"),
        record("other-workload", 26, workload="evaluator"),
        record("alert-2", 30, trigger="alert"),
        record("later", 40),
    ):
        store.write_record(rec)
    return BaselineStore(store)


def test_without_a_mark_the_newest_earlier_non_alert_session(marks: BaselineStore) -> None:
    chosen = marks.choose(marks.store.read_record("alert-2"))  # type: ignore[arg-type]
    assert chosen is not None and chosen.session_id == "good-2"
    assert "not started by an alert" in chosen.reason
    assert marks.choose(marks.store.read_record("good-1")) is None  # type: ignore[arg-type]


def test_a_workload_mark_wins(marks: BaselineStore) -> None:
    marks.set("trainer", "good-1")
    chosen = marks.choose(marks.store.read_record("alert-2"))  # type: ignore[arg-type]
    assert chosen is not None and chosen.session_id == "good-1"
    assert "workload trainer" in chosen.reason
    assert marks.marks()[0]["session_id"] == "good-1"
    assert (Path(marks.store.root) / "baselines" / "trainer.json").is_file()


def test_a_run_mark_wins_over_the_workload_mark(marks: BaselineStore) -> None:
    marks.set("trainer", "good-1")
    marks.set("r1", "good-2", run=True)
    chosen = marks.choose(marks.store.read_record("alert-2"))  # type: ignore[arg-type]
    assert chosen is not None and chosen.session_id == "good-2"


@pytest.mark.parametrize("name", ["../escape", "..", "a/b", ".hidden", "", "x" * 200, "a\\b"])
def test_names_cannot_escape_the_store(marks: BaselineStore, name: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected 1-128 characters"):
        marks.set(name, "good-1")
    assert not (tmp_path / "escape.json").exists()


def test_marking_an_unknown_session_is_refused(marks: BaselineStore) -> None:
    with pytest.raises(LookupError, match="no session"):
        marks.set("trainer", "nope")
    with pytest.raises(ValueError):
        marks.set("trainer", "../../etc")


def test_history_is_the_earlier_runs_median_steps_from_their_reports(
    marks: BaselineStore,
) -> None:
    import json

    for session_id, median in (("good-1", 10.0), ("good-2", 12.0), ("alert-1", 99.0)):
        report = {"facts": {"steps": {"median_ms": median}}}
        marks.store.write_file(session_id, "analysis.json", json.dumps(report).encode())
    # Alert-started runs, failed ones, other workloads and later ones are not history.
    history = marks.history(marks.store.read_record("alert-2"))  # type: ignore[arg-type]
    assert history == [12.0e6, 10.0e6]
    assert marks.history(marks.store.read_record("good-1")) == []  # type: ignore[arg-type]


def test_a_burst_of_failed_sessions_erases_neither_history_nor_baselines(
    marks: BaselineStore,
) -> None:
    """Attack round 3, item 8: 2,000 refused capture requests each made a failed session;
    retention (count 200) then deleted the earlier sessions and a marked baseline's."""
    marks.set("trainer", "good-1")
    marks.set("r1", "alert-1", run=True)
    store = marks.store
    for i in range(30):  # the burst: newer than every good session, each failed
        store.write_record(record(f"refused-{i:02d}", 100 + i, status="failed"))
    for r in store.records():
        if r.finished_ok:
            store.update_record(r.id, lambda rec: setattr(rec, "processed", T0))
    assert marks.pinned() == {"good-1", "alert-1"}
    deleted = store.enforce_retention(10, 0, keep=marks.pinned())
    left = {r.id for r in store.records()}
    # Failed sessions go first; the marked sessions and the newest stay.
    assert {"good-1", "good-2", "alert-1", "alert-2", "later", "other-workload"} <= left
    assert all(d.startswith(("refused-", "failed")) for d in deleted), deleted
    assert "refused-29" in left and len(left) == 10
    # Past the failed ones the oldest go, never a marked baseline.
    store.enforce_retention(3, 0, keep=marks.pinned())
    assert {"good-1", "alert-1", "refused-29"} <= {r.id for r in store.records()}
