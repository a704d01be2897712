"""run_started / run_ended from the SDK's files: once per run, across sidecar restarts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from exporter import schema, sdk
from exporter.metrics.runs import MAX_RUN_FILE_BYTES, RunEvents


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, message: str = "", /, **fields: Any) -> None:
        self.events.append((kind, fields))


def test_each_run_is_announced_once_even_after_a_restart(tmp_path: Path) -> None:
    emit = Recorder()
    events = RunEvents(tmp_path, emit)
    with sdk.run("trainer", shared_dir=tmp_path, host="h0", run_id="r1", profiler_port=None):
        assert events.poll() == 1
        assert events.poll() == 0
    ((kind, fields),) = emit.events
    assert kind == "run_started"
    assert (fields["run_id"], fields["workload"], fields["host"]) == ("r1", "trainer", "h0")
    assert fields["pid"] == os.getpid() and fields["host_profiling"] is None
    restarted = RunEvents(tmp_path, emit)
    assert restarted.poll() == 0
    assert len(emit.events) == 1


def test_run_ended_has_steps_tokens_and_duration(tmp_path: Path) -> None:
    emit = Recorder()
    events = RunEvents(tmp_path, emit)
    with sdk.run("trainer", shared_dir=tmp_path, host="h0", run_id="r2") as run:
        start = run.info()["start_unix"]
    identity = {"run_id": "r2", "workload": "trainer", "host": "h0"}
    events.ended(identity, {"kind": "end", "time": start + 12.5}, 40, 1024)
    ((kind, fields),) = emit.events
    assert kind == "run_ended"
    assert fields["steps"] == 40 and fields["tokens"] == 1024
    assert 12.0 < fields["duration_s"] < 13.0  # start_unix is written a moment after info()


def test_bad_run_files_are_skipped_once_and_old_ones_on_a_fresh_sidecar(tmp_path: Path) -> None:
    runs = tmp_path / schema.RUNS_DIR
    runs.mkdir()
    (runs / "garbage.json").write_text("{not json")
    (runs / "wrong.json").write_text(json.dumps({"run_id": 3, "name": "x", "host": "h"}))
    (runs / "huge.json").write_bytes(b" " * (MAX_RUN_FILE_BYTES + 1))
    old = runs / "old.json"
    old.write_text(json.dumps({"run_id": "old", "name": "x", "host": "h"}))
    an_hour_ago = time.time() - 2 * 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    emit = Recorder()
    events = RunEvents(tmp_path, emit)
    assert events.poll() == 4
    assert emit.events == []
    (runs / "new.json").write_text(json.dumps({"run_id": "new", "name": "x", "host": "h"}))
    assert events.poll() == 1
    assert [f["run_id"] for _, f in emit.events] == ["new"]
