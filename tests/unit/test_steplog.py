"""Step-log tailing: partial lines, restart without loss or double count, rotation,
malformed lines; and the metrics a user scrapes from it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from exporter import sdk
from exporter.metrics.steplog import StepLogTailer
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.training import TrainingMetrics

IDENT = {"run_id": "r1", "workload": "w", "host": "h"}
LABELS = {"run_id": "r1", "workload": "w", "host": "h"}


def step_line(n: int, start: float = 1000.0, duration: float = 0.5, tokens: int = 10) -> str:
    rec = {"kind": "step", **IDENT, "step": n, "start": start + n, "duration": duration}
    return json.dumps({**rec, "wait": 0.5, "tokens": tokens}) + "\n"


class Sidecar:
    """The tailer and the metrics, as `mlprof serve` wires them, restartable."""

    def __init__(self, shared: Path, clock: float = 2000.0) -> None:
        self.shared = shared
        self.now = clock
        self.telemetry: Telemetry = build_telemetry()
        self.metrics = TrainingMetrics(
            self.telemetry.meter, shared, window_s=10, clock=lambda: self.now
        )
        self.errors: list[str] = []
        self.tailer = StepLogTailer(
            shared, shared / "sidecar" / "state.json", self.metrics, self.errors.append
        )

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.telemetry.registry.get_sample_value(name, labels or LABELS)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    (tmp_path / "steps").mkdir()
    return tmp_path


def test_partial_last_line_waits_for_its_newline(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    line = step_line(1)
    log.write_text(step_line(0) + line[:20])
    car = Sidecar(shared)
    assert car.tailer.poll().records == 1
    assert car.value("train_steps_total") == 1
    with log.open("a") as fh:
        fh.write(line[20:])
    assert car.tailer.poll().records == 1
    assert car.value("train_steps_total") == 2
    assert car.errors == []


def test_restart_neither_loses_nor_double_counts(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n, tokens=5) for n in range(10)))
    first = Sidecar(shared)
    first.tailer.poll()
    assert first.value("train_steps_total") == 10
    with log.open("a") as fh:
        fh.write("".join(step_line(n, tokens=5) for n in range(10, 15)))
    # A new sidecar process: totals come back from the state file, then the 5 new lines.
    second = Sidecar(shared)
    assert second.value("train_steps_total") == 10
    second.tailer.poll()
    assert second.value("train_steps_total") == 15
    assert second.value("train_tokens_total") == 75
    assert second.value("train_step") == 14


def test_crash_before_persisting_recounts_exactly_once(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n) for n in range(4)))
    first = Sidecar(shared)
    first.tailer.poll()
    state = (shared / "sidecar" / "state.json").read_bytes()
    with log.open("a") as fh:
        fh.write("".join(step_line(n) for n in range(4, 7)))
    first.tailer.poll()
    # Simulate a crash that lost the last state write: offsets and totals roll back together.
    (shared / "sidecar" / "state.json").write_bytes(state)
    second = Sidecar(shared)
    second.tailer.poll()
    assert second.value("train_steps_total") == 7


def test_truncation_and_rotation_start_the_file_over(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n) for n in range(5)))
    car = Sidecar(shared)
    car.tailer.poll()
    log.write_text(step_line(5))  # truncated and rewritten, shorter than the offset
    car.tailer.poll()
    assert car.value("train_steps_total") == 6
    rotated = shared / "steps" / "h-1.jsonl.1"
    log.rename(rotated)  # rotated away (no longer *.jsonl) and a new file starts
    log.write_text("".join(step_line(n) for n in range(6, 8)) + "x" * 0)
    car.tailer.poll()
    assert car.value("train_steps_total") == 8
    (shared / "steps" / "h-2.jsonl").write_text(step_line(8))  # a new file from a new pid
    car.tailer.poll()
    assert car.value("train_steps_total") == 9


def test_malformed_lines_are_counted_and_skipped(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    bad = [
        "not json\n",
        "[1, 2]\n",
        json.dumps({"kind": "step", **IDENT, "step": 1, "start": "x", "duration": 1}) + "\n",
        json.dumps({"kind": "teleport", **IDENT}) + "\n",
        json.dumps({"kind": "step", "step": 1, "start": 1, "duration": 1}) + "\n",
    ]
    log.write_text(step_line(0) + "".join(bad) + step_line(1))
    car = Sidecar(shared)
    stats = car.tailer.poll()
    assert stats.records == 2
    assert sorted(car.errors) == ["json", "schema", "schema", "schema", "schema"]
    assert car.value("train_steps_total") == 2


def test_garbage_without_newline_does_not_stall_the_file(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    log.write_bytes(b"\0" * (2 << 20))
    car = Sidecar(shared)
    car.tailer.poll()
    with log.open("a") as fh:
        fh.write("\n" + step_line(0))
    car.tailer.poll()
    assert car.value("train_steps_total") == 1
    assert "line_too_long" in car.errors


def test_step_duration_histogram_and_user_gauges(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    rec = {"kind": "record", **IDENT, "name": "loss", "value": 2.5, "step": 3, "time": 1}
    log.write_text(
        step_line(0, duration=0.003) + step_line(1, duration=7.0) + json.dumps(rec) + "\n"
    )
    car = Sidecar(shared)
    car.tailer.poll()
    assert car.value("train_step_duration_seconds_bucket", {**LABELS, "le": "0.005"}) == 1
    assert car.value("train_step_duration_seconds_bucket", {**LABELS, "le": "10.0"}) == 2
    assert car.value("train_step_duration_seconds_sum") == pytest.approx(7.003)
    assert car.value("train_loss") == 2.5


def test_duty_cycle_is_busy_time_over_the_window(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    # Steps of 0.5 s every 1 s from t=1001: half the time is spent waiting for input.
    log.write_text("".join(step_line(n, duration=0.5) for n in range(1, 30)))
    car = Sidecar(shared, clock=1030.0)
    car.tailer.poll()
    duty = {"run_id": "r1", "workload": "w", "host": "h", "accelerator": "unknown", "source": "sdk"}
    assert car.value("accelerator_duty_cycle", duty) == pytest.approx(0.5, abs=0.06)
    # The workload stalls: as polls go on with no new steps, the estimate falls to 0.
    car.now = 1060.0
    car.tailer.poll()
    assert car.value("accelerator_duty_cycle", duty) == 0.0


def test_series_expire_after_the_ttl_and_end_marks_down(shared: Path) -> None:
    with sdk.run("w", shared_dir=shared, run_id="r1", host="h") as run, run.step(tokens=1):
        pass
    car = Sidecar(shared)
    car.now = next((shared / "steps").iterdir()).stat().st_mtime + 1
    car.tailer.poll()
    assert car.value("mlprof_workload_up") == 0  # the run wrote its end record
    assert car.value("train_steps_total") == 1
    car.now += 10_000
    assert car.metrics.expire() == 1
    assert car.value("train_steps_total") is None


def test_a_finished_run_is_told_from_a_dead_one(shared: Path) -> None:
    # Both are down (no fresh heartbeat); only the finished one wrote its end line.
    with sdk.run("w", shared_dir=shared, run_id="done", host="h") as run, run.step(tokens=1):
        pass
    (shared / "steps" / "h-dead.jsonl").write_text(step_line(1) + step_line(2))
    car = Sidecar(shared)
    car.now = max(p.stat().st_mtime for p in (shared / "steps").iterdir()) + 1
    car.tailer.poll()
    assert car.value("mlprof_workload_up") == 1  # r1 looks alive while its file is fresh
    car.now += 60
    done = {"run_id": "done", "workload": "w", "host": "h"}
    assert car.value("mlprof_workload_up", done) == 0
    assert car.value("mlprof_run_ended", done) == 1
    assert car.value("mlprof_workload_up") == 0  # r1: heartbeat lost
    assert car.value("mlprof_run_ended") == 0  # ... and no end line: the process died
    restarted = Sidecar(shared, clock=car.now)  # the end is remembered across a restart
    restarted.tailer.poll()
    assert restarted.value("mlprof_run_ended", done) == 1
    assert restarted.value("mlprof_run_ended") == 0


def test_sdk_log_is_read_back_exactly(shared: Path) -> None:
    with sdk.run("w", shared_dir=shared, run_id="r1", host="h", configs={"lr": 0.1}) as run:
        for _ in range(50):
            with run.step(tokens=3):
                pass
            run.record("loss", 1.25)
    info = json.loads((shared / "run.json").read_text())
    assert info["run_id"] == "r1" and info["configs"] == {"lr": 0.1}
    assert json.loads((shared / "runs" / "r1.json").read_text())["host"] == "h"
    car = Sidecar(shared)
    car.tailer.poll()
    assert car.value("train_steps_total") == 50
    assert car.value("train_tokens_total") == 150
    assert car.value("train_step") == 50
    assert car.value("train_loss") == 1.25
    assert car.errors == []


def test_sdk_rejects_bad_record_names(tmp_path: Path) -> None:
    with sdk.run("w", shared_dir=tmp_path) as run, pytest.raises(ValueError, match="record name"):
        run.record("bad name", 1.0)


def test_new_record_names_during_scrapes_do_not_deadlock(shared: Path) -> None:
    car = Sidecar(shared)
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            generate_latest(car.telemetry.registry)

    def feed() -> None:
        for i in range(32):
            rec = {"kind": "record", **IDENT, "name": f"m{i}", "value": float(i), "step": i}
            car.metrics.handle({**rec, "time": 1.0}, "h-1.jsonl")
            for n in range(20):
                car.metrics.handle(json.loads(step_line(i * 20 + n)), "h-1.jsonl")

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    worker = threading.Thread(target=feed, daemon=True)
    worker.start()
    worker.join(60)  # a liveness bound, not a speed assertion: a deadlock never returns
    stop.set()
    assert not worker.is_alive(), "a new user gauge deadlocked against a concurrent scrape"
    scraper.join(60)
    assert car.value("train_m31") == 31.0
    assert car.value("train_steps_total") == 640


def test_a_missing_steps_directory_for_one_poll_does_not_recount(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n) for n in range(5)))
    car = Sidecar(shared)
    car.tailer.poll()
    (shared / "steps").rename(shared / "steps.away")  # e.g. a remount or a slow volume
    car.tailer.poll()
    (shared / "steps.away").rename(shared / "steps")
    car.tailer.poll()
    assert car.value("train_steps_total") == 5


def test_runs_beyond_the_cap_are_dropped_and_counted(
    shared: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 20,000 run ids in one step log made 18.9 MB of /metrics; the cap bounds the series.
    telemetry = build_telemetry()
    now = [2000.0]
    metrics = TrainingMetrics(telemetry.meter, shared, clock=lambda: now[0], max_runs=3)
    tailer = StepLogTailer(shared, shared / "sidecar" / "state.json", metrics)
    lines = [
        json.dumps({"kind": "step", "run_id": f"r{i}", "workload": "w", "host": "h",
                    "step": 1, "start": 1000.0, "duration": 0.5}) + "\n"
        for i in range(50)
    ]  # fmt: skip
    (shared / "steps" / "h-1.jsonl").write_text("".join(lines))
    tailer.poll()
    text = generate_latest(telemetry.registry).decode()
    runs = {
        line.split('run_id="')[1].split('"')[0] for line in text.splitlines() if "run_id=" in line
    }
    assert runs == {"r0", "r1", "r2"}
    assert telemetry.registry.get_sample_value("mlprof_runs_dropped_total") == 47
    warned = [r for r in caplog.records if "MLPROF_MAX_RUNS" in r.getMessage()]
    assert len(warned) == 1  # once, not per line
    # Once the tracked runs expire, a new run is taken again.
    now[0] += 10_000
    metrics.expire()
    with (shared / "steps" / "h-1.jsonl").open("a") as fh:
        fh.write(lines[49])
    tailer.poll()
    assert (
        telemetry.registry.get_sample_value("train_steps_total", {**LABELS, "run_id": "r49"}) == 1
    )
