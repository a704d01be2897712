"""The automatic baseline of a session is one of its kind.

A torch_xla workload can be both captured (XProf) and traced (torch.profiler) in one
run; the two share no frames, so a torch trace compared with the newest earlier XProf
capture would show every frame as new (and the reverse as gone).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _record(session_id: str, minutes: int, kind: str) -> SessionRecord:
    name = "h.pt.trace.json" if kind == "torch_trace" else "h.xplane.pb"
    return SessionRecord(
        id=session_id, status="done", kind=kind, workload="trainer", run_id="r1",
        created=T0 + timedelta(minutes=minutes),
        targets=[TargetResult(address="local", host="h", status="ok", files=[name])],
    )  # fmt: skip


def test_each_kind_is_compared_with_the_newest_earlier_session_of_its_kind(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path / "store")
    for rec in (
        _record("trace-1", 0, "torch_trace"),
        _record("capture-1", 5, "trace"),
        _record("trace-2", 10, "torch_trace"),
        _record("capture-2", 20, "trace"),  # the newest, of the other kind
        _record("trace-3", 30, "torch_trace"),
        _record("capture-3", 40, "trace"),
    ):
        store.write_record(rec)
    marks = BaselineStore(store)
    chosen = marks.choose(store.read_record("trace-3"))  # type: ignore[arg-type]
    assert chosen is not None and chosen.session_id == "trace-2"
    chosen = marks.choose(store.read_record("capture-3"))  # type: ignore[arg-type]
    assert chosen is not None and chosen.session_id == "capture-2"
    assert marks.choose(store.read_record("trace-1")) is None  # type: ignore[arg-type]
