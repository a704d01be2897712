"""The sidecar's reports and the side cache: a session that may be a baseline keeps its
sides after its report, and an alert session's report compared against it loads them
(the cache file is not rewritten) with the same comparison as decoding the baseline."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.sides import cache as side_cache
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.pipeline.worker import ReportSettings, ReportWorker
from exporter.testing.synthetic import write_tpu_capture
from tests.analysis_captures import AnalysisCaptures

pytestmark = pytest.mark.integration

NAME = "tpu-vm-0_8466.xplane.pb"
SHAPE: dict[str, Any] = {"devices": 2, "steps": 10, "ops_per_step": 300, "distinct_ops": 60}
T0 = datetime.now(UTC) - timedelta(hours=1)


def add_session(
    store: SessionStore, session_id: str, minutes: int, trigger: str, **shape: Any
) -> Path:
    directory = Path(store.session_dir(session_id))
    directory.mkdir(parents=True)
    write_tpu_capture(directory / NAME, **{**SHAPE, **shape})
    store.write_record(
        SessionRecord(
            id=session_id,
            status="done",
            trigger=trigger,
            run_id="run-1",
            workload="trainer",
            created=T0 + timedelta(minutes=minutes),
            alert={"name": "MLWorkloadDutyCycleLow"} if trigger == "alert" else None,
            targets=[
                TargetResult(
                    address="127.0.0.1:8466",
                    host="tpu-vm-0",
                    run_id="run-1",
                    status="ok",
                    files=[NAME],
                )
            ],
        )
    )
    return directory / NAME


def baseline_section(report: dict[str, Any]) -> dict[str, Any]:
    return dict(report["baseline"])


def test_a_baseline_keeps_its_sides_and_the_alert_report_loads_them(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "store")
    base = add_session(store, "base", 0, "manual")
    head = add_session(store, "alert", 10, "alert", slowdown=1.4, seed=3)
    worker = ReportWorker(store, ReportSettings(xprof=False))

    assert worker.process("base") is not None
    cache = side_cache.cache_path(base)
    assert cache.is_file(), "the manual session's report left its sides"
    kept = cache.stat().st_ino

    event = worker.process("alert")
    assert event is not None and event.baseline_session == "base", event
    assert cache.stat().st_ino == kept, "the baseline's cache was read, not rewritten"
    assert side_cache.cache_path(head).is_file(), "the compared session keeps its sides too"
    from_cache = store.fs.cat_file(f"{store.session_dir('alert')}/analysis.json")

    # The same report with the baseline decoded: the same comparison.
    cache.unlink()
    store.fs.rm(f"{store.session_dir('alert')}/analysis.json")
    worker2 = ReportWorker(store, ReportSettings(xprof=False))

    def clear(record: SessionRecord) -> None:
        record.report = None

    store.update_record("alert", clear)
    assert worker2.process("alert") is not None
    decoded = store.fs.cat_file(f"{store.session_dir('alert')}/analysis.json")
    first, second = json.loads(from_cache), json.loads(decoded)
    assert first["baseline"]["top_regression"], "the slower session has a regression"
    assert baseline_section(first) == baseline_section(second)
    assert first["findings"] == second["findings"]
    assert cache.is_file(), "decoding the baseline wrote its cache again"


def test_real_cpu_captures_compare_the_same_from_their_caches(
    analysis_captures: AnalysisCaptures, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JAX CPU captures (XLA on host threads, the xla_host view): decoded and cached
    sides compare the same, both ways, in every view."""
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import load_side, load_sides
    from exporter.profiles import xplane

    store = SessionStore(tmp_path / "store")
    dirs = {}
    for name, capture in (("base", analysis_captures.demo), ("head", analysis_captures.demo_slow)):
        directory = Path(store.session_dir(name))
        directory.mkdir(parents=True)
        (directory / "session.json").write_text("{}", encoding="utf-8")
        shutil.copy(capture, directory / NAME)
        dirs[name] = str(directory)

    def read() -> dict[str, Any]:
        return {
            n: {"step": load_side(d), **load_sides(d, ["device", "host"])} for n, d in dirs.items()
        }

    decoded = read()
    assert all(side_cache.cache_path(Path(d) / NAME).is_file() for d in dirs.values())

    def refuse(path: Path, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{path} decoded: the side cache was not used")

    monkeypatch.setattr(xplane, "load_capture", refuse)
    cached = read()
    assert decoded["base"]["device"].view == "xla_host"
    for view in ("step", "device", "host"):
        for a, b in (("base", "head"), ("head", "base")):
            want = compare_sides(decoded[a][view], decoded[b][view]).to_json(top=50)
            for x, y in ((cached, cached), (decoded, cached), (cached, decoded)):
                assert compare_sides(x[a][view], y[b][view]).to_json(top=50) == want, (view, a)
