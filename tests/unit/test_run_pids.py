"""Process ids to runs, from the run records the SDK writes (real files, real /proc)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from exporter import sdk
from exporter.metrics.run_pids import MAX_RECORD_BYTES, RunPids, process_start_unix


def write(path: Path, record: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_sdks_own_record_maps_this_process(tmp_path: Path) -> None:
    """What sdk.run writes is enough: pid and start time are in run.json."""
    with sdk.run("pids", shared_dir=tmp_path, run_id="pids-1") as run:
        identity = RunPids(tmp_path).identity(os.getpid())
        assert identity == {"run_id": run.run_id, "workload": "pids"}
    assert RunPids(tmp_path).identity(os.getpid() + 1_000_000) is None


def test_newest_run_of_a_process_wins_and_new_records_are_seen(tmp_path: Path) -> None:
    now = time.time()
    runs = RunPids(tmp_path, started=lambda pid: now - 100)
    write(
        tmp_path / "runs" / "a.json", {"run_id": "a", "name": "w", "pid": 7, "start_unix": now - 50}
    )
    assert runs.identity(7) == {"run_id": "a", "workload": "w"}
    # The same process starts a second run (a notebook): a new file in runs/.
    write(tmp_path / "runs" / "b.json", {"run_id": "b", "name": "w", "pid": 7, "start_unix": now})
    assert runs.identity(7) == {"run_id": "b", "workload": "w"}


def test_a_reused_pid_is_not_the_old_run(tmp_path: Path) -> None:
    now = time.time()
    write(tmp_path / "run.json", {"run_id": "old", "name": "w", "pid": 9, "start_unix": now - 3600})
    # pid 9 now belongs to a process that started after that run: not its run.
    assert RunPids(tmp_path, started=lambda pid: now - 10).identity(9) is None
    # Where /proc cannot tell (another pid namespace), the record is taken at its word.
    assert RunPids(tmp_path, started=lambda pid: None).identity(9) == {
        "run_id": "old",
        "workload": "w",
    }


def test_workload_written_garbage_is_ignored(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    (runs_dir / "broken.json").write_text("{not json")
    (runs_dir / "list.json").write_text("[1, 2]")
    write(runs_dir / "bad-pid.json", {"run_id": "x", "pid": "7", "start_unix": 1.0})
    write(runs_dir / "bool-pid.json", {"run_id": "x", "pid": True, "start_unix": 1.0})
    huge = {"run_id": "huge", "pid": 7, "start_unix": 1.0, "pad": "x" * MAX_RECORD_BYTES}
    write(runs_dir / "huge.json", huge)
    (runs_dir / "dir.json").mkdir()
    write(runs_dir / "ok.json", {"run_id": "ok", "pid": 8, "start_unix": 1.0})
    runs = RunPids(tmp_path, started=lambda pid: None)
    assert runs.identity(7) is None
    assert runs.identity(8) == {"run_id": "ok", "workload": ""}


def test_process_start_time_from_proc() -> None:
    started = process_start_unix(os.getpid())
    assert started is not None
    assert time.time() - 3600 * 24 * 365 < started <= time.time() + 1
    assert process_start_unix(2**22 + 12345) is None  # above pid_max: never a process
