"""One child per finished session (exporter.pipeline.job ``session``): the sidecar's
conversion and its report share one read of each capture.

Before, a session's capture was opened for decoding by the conversion child, by the
report child's facts and again for the report's head side (or, for a session that may
become a baseline, by a third child keeping its sides). Here every child this process
starts counts the capture opens it makes (a ``sitecustomize`` audit hook: a decode
begins with ``load_capture``'s ``Path.open``; hashing a capture for its side cache opens
it with ``os.open``, which the hook leaves out), so the test sees what each path costs
in the same run.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.sides import cache as side_cache
from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import SessionStore
from exporter.pipeline.processing import SessionProcessor, bounded_flamegraphs
from exporter.pipeline.worker import ReportEvent, ReportSettings, ReportWorker
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.pprof import decode_pprof, graphs_from_pprof
from exporter.profiles.xplane import xplane_flamegraphs
from exporter.testing.synthetic import write_tpu_capture

pytestmark = pytest.mark.integration

NAME = "tpu-vm-0_8466.xplane.pb"
SHAPE: dict[str, Any] = {"devices": 2, "steps": 10, "ops_per_step": 300, "distinct_ops": 60}
T0 = datetime.now(UTC) - timedelta(hours=1)
# Installed in every child through PYTHONPATH (the sandbox keeps the parent's entries).
SITECUSTOMIZE = """
import os, sys

def _count(event, args):
    if event == "open" and args[1] is not None and str(args[0]).endswith(".xplane.pb"):
        with open(os.environ["MLPROF_TEST_OPENS"], "a") as log:
            log.write(f"{args[0]}\\n")

sys.addaudithook(_count)
"""


def add_session(
    store: SessionStore, session_id: str, minutes: int, trigger: str, **shape: Any
) -> Path:
    directory = Path(store.session_dir(session_id))
    directory.mkdir(parents=True)
    shape = SHAPE | shape | ({"slowdown": 1.4, "seed": 3} if trigger == "alert" else {})
    write_tpu_capture(directory / NAME, **shape)
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


class Pushes:
    def __init__(self) -> None:
        self.graphs: list[tuple[FlameGraph, dict[str, str]]] = []

    def __call__(self, graph: FlameGraph, labels: dict[str, str]) -> str:
        self.graphs.append((graph, labels))
        return "ok"


def opens(log: Path) -> Counter[str]:
    if not log.is_file():
        return Counter()
    return Counter(Path(line).parent.name for line in log.read_text().splitlines())


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(hooks))
    log = tmp_path / "opens.log"
    monkeypatch.setenv("MLPROF_TEST_OPENS", str(log))
    return log


def _store(tmp_path: Path, **shape: Any) -> tuple[SessionStore, dict[str, Path]]:
    store = SessionStore(str(tmp_path / "store"))
    paths = {"base": add_session(store, "base", 0, "manual", **shape)}
    paths["alert"] = add_session(store, "alert", 10, "alert", **shape)
    BaselineStore(store).set("trainer", "base")
    return store, paths


def _joined(store: SessionStore, pushes: Pushes) -> tuple[SessionProcessor, ReportWorker]:
    """Wired as the sidecar wires them (exporter/sidecar.py)."""

    def no_second_converter(path: Path) -> dict[str, FlameGraph]:
        raise AssertionError(f"{path}: converted outside the session's child")

    worker = ReportWorker(store, ReportSettings(xprof=False))
    processor = SessionProcessor(store, no_second_converter, push=pushes, retry_delays_s=())
    processor.session_job = worker.session_job
    processor.on_processed.append(worker)
    worker.deferred = processor.pending
    return processor, worker


def test_a_session_is_decoded_in_one_child_for_its_graphs_side_cache_and_report(
    tmp_path: Path, counted: Path
) -> None:
    store, paths = _store(tmp_path)
    pushes = Pushes()
    processor, worker = _joined(store, pushes)
    events: list[ReportEvent] = []
    worker.on_report.append(events.append)

    for session_id in ("base", "alert"):
        processor(store.read_record(session_id)).result(timeout=600)  # type: ignore[union-attr]

    # Each capture opened for decoding once, in its session's child: the report's facts
    # read its graphs as its sides (the side cache), which are also the graphs stored
    # and pushed; the alert's head and its baseline's sides came from those caches.
    assert opens(counted) == {"base": 1, "alert": 1}, opens(counted)
    for path in paths.values():
        assert side_cache.cache_path(path).is_file()
    assert [(e.session_id, e.baseline_session) for e in events] == [
        ("base", None),
        ("alert", "base"),
    ]
    report = json.loads(store.fs.cat_file(f"{store.session_dir('alert')}/analysis.json"))
    assert report["session"]["id"] == "alert" and report["baseline"]["session"] == "base"
    assert report["baseline"]["top_regression"] is not None
    assert store.read_record("alert").report["status"] == report["status"]  # type: ignore[union-attr]

    # The graphs stored and pushed are the conversion's: the same frames and values.
    for session_id, path in paths.items():
        record = store.read_record(session_id)
        assert record is not None and record.processed is not None
        expected = {s: g.to_folded() for s, g in xplane_flamegraphs(path).items()}
        stored = {}
        for artifact in record.artifacts:
            assert "error" not in artifact, artifact
            data = store.fs.cat_file(f"{store.session_dir(session_id)}/{artifact['file']}")
            profile = decode_pprof(data)
            types = [profile.string_table[t.type] for t in profile.sample_type]
            graph = graphs_from_pprof(profile, types, artifact["profile_source"])[-1]
            stored[artifact["profile_source"]] = graph
        assert {s: _lines(g) for s, g in stored.items()} == {
            s: sorted(f.splitlines()) for s, f in expected.items()
        }
        pushed = {
            labels["profile_source"]: _lines(graph)
            for graph, labels in pushes.graphs
            if labels.get("session_id") == session_id
        }
        assert pushed == {s: sorted(f.splitlines()) for s, f in expected.items()}


def test_the_two_queues_decoded_each_capture_three_times(tmp_path: Path, counted: Path) -> None:
    # The reference: conversion and report each in their own child, as before.
    store, _ = _store(tmp_path)
    worker = ReportWorker(store, ReportSettings(xprof=False))
    processor = SessionProcessor(store, bounded_flamegraphs(300, 4096), push=Pushes())
    for session_id in ("base", "alert"):
        assert processor.process(session_id) is not None
        assert worker.process(session_id) is not None
    # base: conversion, facts, its sides kept for later; alert: conversion, facts, head.
    assert opens(counted) == {"base": 3, "alert": 3}, opens(counted)


def test_the_hook_leaves_the_processors_sessions_to_it(tmp_path: Path, counted: Path) -> None:
    # The sidecar's hooks in their order: the processor's, then the worker's, which
    # leaves the session to the processor's child (one report, one child).
    store, _ = _store(tmp_path)
    processor, worker = _joined(store, Pushes())
    record = store.read_record("base")
    assert record is not None
    future = processor(record)
    assert future is not None
    assert worker(record) is None, "queued beside the processor's child"
    future.result(timeout=600)
    assert worker.written == 1 and opens(counted) == {"base": 1}, opens(counted)
    again = store.read_record("base")
    assert again is not None and again.report is not None and worker(again) is None


def test_without_reports_a_session_is_decoded_once(tmp_path: Path, counted: Path) -> None:
    store, paths = _store(tmp_path)
    worker = ReportWorker(store, ReportSettings(enabled=False))
    processor = SessionProcessor(store, push=Pushes())
    processor.session_job = worker.session_job
    record = processor.process("base")
    assert record is not None and [a.get("profile_source") for a in record.artifacts] == [
        "xprof_device",
        "xprof_host",
    ]
    assert opens(counted) == {"base": 1}, opens(counted)
    assert side_cache.cache_path(paths["base"]).is_file()


def _lines(graph: FlameGraph) -> list[str]:
    return sorted(graph.to_folded().splitlines())


def test_a_remote_session_is_read_once_from_its_copy(tmp_path: Path, counted: Path) -> None:
    # A bucket's session is copied in the store's layout, so the child writes its side
    # cache beside the copy and the report loads the head from it; the baseline's copy
    # has no cache (a bucket's caches are not copied), so it is decoded.
    local, _ = _store(tmp_path)
    store = SessionStore(f"memory://session-job-{tmp_path.name}")
    for session_id in ("base", "alert"):
        record = local.read_record(session_id)
        assert record is not None
        store.write_file(
            session_id, NAME, local.fs.cat_file(f"{local.session_dir(session_id)}/{NAME}")
        )
        store.write_record(record)
    BaselineStore(store).set("trainer", "base")
    pushes = Pushes()
    processor, worker = _joined(store, pushes)
    processor.process("alert")
    assert worker.written == 1 and len(pushes.graphs) == 2
    assert opens(counted) == {"alert": 1, "base": 1}, opens(counted)


# What differs between two runs of one analysis: when and how long.
RUN_KEYS = ("generated", "written_at", "analysis_seconds", "timings")


def _report(store: SessionStore, session_id: str) -> dict[str, Any]:
    """The session's report, its store's root written as ``STORE``."""
    text = store.fs.cat_file(f"{store.session_dir(session_id)}/analysis.json").decode()
    found = json.loads(text.replace(str(store.local_dir("x").parent), "STORE"))  # type: ignore[union-attr]
    found["facts"].pop("timings", None)
    return {k: v for k, v in found.items() if k not in RUN_KEYS}


# A side samples 200 steps: past it, the sampled cycles and the whole graph still come
# from one pass (sides.load.capture_side), so one read either way.
@pytest.mark.parametrize("steps", [10, 230])
def test_the_session_childs_report_is_the_analyze_childs(
    tmp_path: Path, counted: Path, steps: int
) -> None:
    joined, _ = _store(tmp_path / "joined", steps=steps)
    apart, _ = _store(tmp_path / "apart", steps=steps)
    processor, _ = _joined(joined, Pushes())
    for session_id in ("base", "alert"):
        processor.process(session_id)
    assert opens(counted) == {"base": 1, "alert": 1}, opens(counted)
    reference = ReportWorker(apart, ReportSettings(xprof=False))
    for session_id in ("base", "alert"):
        assert reference.process(session_id) is not None
        assert _report(joined, session_id) == _report(apart, session_id), session_id


def test_captures_a_dead_session_child_never_reached_are_converted_alone(
    tmp_path: Path,
) -> None:
    from exporter.pipeline.job import run_session

    _, paths = _store(tmp_path)
    directory = paths["base"].parent
    # The child refuses its arguments before it reads anything (as one killed early).
    run = run_session(directory, [NAME], 300, 4096, report_args=["--no-such-flag"])
    assert not run.result.ok and run.report is None
    made = run.graphs[NAME]
    assert not isinstance(made, str), made
    expected = {
        s: sorted(g.to_folded().splitlines()) for s, g in xplane_flamegraphs(paths["base"]).items()
    }
    assert {s: _lines(c.graph) for s, c in made.items()} == expected
