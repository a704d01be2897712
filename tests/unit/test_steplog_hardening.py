"""Hostile and unlucky shared directories (issue 11): special files, files rewritten under
the tail, bad state files, absurd lines, input wait, and series that outlive their run."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from exporter.config import Settings
from exporter.sidecar import Sidecar as RealSidecar
from tests.unit.test_steplog import IDENT, LABELS, Sidecar, step_line

LIVENESS_S = 10.0  # a bound for "it returned", not a speed assertion: a wedge never returns


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    (tmp_path / "steps").mkdir()
    return tmp_path


def returns_within(func: Callable[[], object], unblock: Callable[[], None]) -> bool:
    """Run ``func`` in a thread; True if it returned. ``unblock`` frees a stuck one."""
    thread = threading.Thread(target=func, daemon=True)
    thread.start()
    thread.join(LIVENESS_S)
    stuck = thread.is_alive()
    if stuck:
        unblock()
        thread.join(LIVENESS_S)
    return not stuck


def open_writer(fifo: Path) -> Callable[[], None]:
    """Opening a FIFO's write end releases a reader blocked in open()."""

    def unblock() -> None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    return unblock


@pytest.fixture
def fifo_cleanup() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for path in made:
        path.unlink(missing_ok=True)


# -- A.3 special files ---------------------------------------------------------------


def test_fifo_named_like_a_step_log_is_skipped_and_counted_once(
    shared: Path, fifo_cleanup: list[Path]
) -> None:
    fifo = shared / "steps" / "x.jsonl"
    os.mkfifo(fifo)
    fifo_cleanup.append(fifo)
    (shared / "steps" / "h-1.jsonl").write_text(step_line(0) + step_line(1))
    car = Sidecar(shared)
    assert returns_within(car.tailer.poll, open_writer(fifo)), "a FIFO wedged the tailer"
    assert car.value("train_steps_total") == 2  # the real log is still read
    assert car.errors == ["not_regular_file"]
    car.tailer.poll()
    assert car.errors == ["not_regular_file"]  # reported once, not every poll


def test_no_file_is_read_while_metrics_render(shared: Path, fifo_cleanup: list[Path]) -> None:
    """mkfifo runs/<id>.json used to block every scrape (the render lock held)."""
    (shared / "runs").mkdir()
    fifo = shared / "runs" / "r1.json"
    os.mkfifo(fifo)
    fifo_cleanup.append(fifo)
    (shared / "steps" / "h-1.jsonl").write_text(step_line(0) + step_line(1))
    car = Sidecar(shared)
    car.tailer.poll()
    # The sidecar's tailing thread looks the run's backend up: it must not block either.
    assert returns_within(car.metrics.refresh_runs, open_writer(fifo)), "the run lookup blocked"
    rendered: list[bytes] = []
    assert returns_within(
        lambda: rendered.append(generate_latest(car.telemetry.registry)), open_writer(fifo)
    ), "a FIFO in the shared dir blocked /metrics"
    assert b'accelerator="unknown"' in rendered[0]


def test_a_fifo_where_the_state_is_written_wedges_nothing(
    shared: Path, fifo_cleanup: list[Path]
) -> None:
    """The workload can write into sidecar/ too: a FIFO at the temporary state file."""
    (shared / "sidecar").mkdir()
    fifos = [shared / "sidecar" / ".state.json.tmp", shared / "sidecar" / "state.tmp"]
    for fifo in fifos:
        os.mkfifo(fifo)
        fifo_cleanup.append(fifo)
    (shared / "steps" / "h-1.jsonl").write_text(step_line(0))
    car = Sidecar(shared)

    def unblock() -> None:
        for fifo in fifos:  # a reader frees a writer stuck in open()
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))

    assert returns_within(car.tailer.poll, unblock), "saving the state blocked on a FIFO"
    assert json.loads((shared / "sidecar" / "state.json").read_text())["files"]


def test_a_backend_found_on_the_tailing_thread_reaches_the_duty_cycle(shared: Path) -> None:
    (shared / "runs").mkdir()
    (shared / "runs" / "r1.json").write_text(json.dumps({"system": {"backend": "tpu"}}))
    (shared / "steps" / "h-1.jsonl").write_text(step_line(0) + step_line(1))
    car = Sidecar(shared, clock=1005.0)
    car.tailer.poll()
    car.metrics.refresh_runs()
    labels = {**LABELS, "accelerator": "tpu", "source": "sdk"}
    assert car.value("accelerator_duty_cycle", labels) is not None


# -- A.8 files rewritten under the tail ------------------------------------------------


def test_truncated_and_regrown_past_the_offset_is_read_from_the_start(shared: Path) -> None:
    """Within one poll: 4 lines read, then the file rewritten with 20 new ones (same inode,
    larger size). The old code went on from the old offset and lost the first 4 new lines
    (or more): all 20 must count."""
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n, start=1000.0) for n in range(4)))
    car = Sidecar(shared)
    car.tailer.poll()
    inode = log.stat().st_ino
    log.write_text("".join(step_line(n, start=5000.0) for n in range(20)))
    assert log.stat().st_ino == inode  # the case the inode check alone cannot see
    car.tailer.poll()
    assert car.value("train_steps_total") == 24
    assert car.errors == ["rewritten"]


def test_a_file_replaced_by_one_reusing_its_inode_is_read_from_the_start(shared: Path) -> None:
    """ext4 gives a deleted file's inode to the next one: same inode, new content."""
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n, start=1000.0) for n in range(5)))
    car = Sidecar(shared)
    car.tailer.poll()
    # Deleted and recreated within one poll, with the inode reused: written in place
    # here, as no filesystem promises reuse on demand.
    with log.open("r+b") as fh:
        fh.write("".join(step_line(n, start=9000.0) for n in range(20)).encode())
    car.tailer.poll()
    assert car.value("train_steps_total") == 25


def test_offsets_and_fingerprints_survive_a_restart(shared: Path) -> None:
    log = shared / "steps" / "h-1.jsonl"
    log.write_text("".join(step_line(n) for n in range(3)))
    Sidecar(shared).tailer.poll()
    with log.open("a") as fh:
        fh.write(step_line(3))
    second = Sidecar(shared)
    second.tailer.poll()
    assert second.value("train_steps_total") == 4
    assert second.errors == []


# -- A.6 bad state files ---------------------------------------------------------------

BAD_STATES = {
    "null": "null",
    "list": "[]",
    "files-list": '{"files": []}',
    "inode-text": '{"files": {"h-1.jsonl": {"inode": "abc", "offset": 0}}}',
    "steps-nan": '{"consumer": {"series": [["r1", "w", "h", {"steps": "NaN"}]]}}',
    "not-json": "{half",
}


def _settings(shared: Path) -> Settings:
    return Settings(
        shared_dir=shared, store=str(shared.parent / "store"), sources=["jax"],
        spool_dir=shared.parent / "spool",
    )  # fmt: skip


@pytest.mark.parametrize("text", BAD_STATES.values(), ids=BAD_STATES.keys())
def test_a_bad_state_file_is_moved_aside_counted_and_the_sidecar_starts(
    shared: Path, text: str
) -> None:
    state = shared / "sidecar" / "state.json"
    state.parent.mkdir()
    state.write_text(text)
    (shared / "steps" / "h-1.jsonl").write_text(step_line(0))
    sidecar = RealSidecar(_settings(shared))  # used to raise: a crash loop
    assert (shared / "sidecar" / "state.json.bad").read_text() == text
    registry = sidecar.telemetry.registry
    assert registry.get_sample_value("mlprof_state_discarded_total", {"file": "step_log"}) == 1
    sidecar.tailer.poll()
    assert registry.get_sample_value("train_steps_total", LABELS) == 1  # started fresh
    assert json.loads(state.read_text())["files"]["h-1.jsonl"]["offset"] > 0


def test_good_state_is_not_counted_and_a_bad_memory_state_is_set_aside(shared: Path) -> None:
    (shared / "sidecar").mkdir()
    (shared / "sidecar" / "memory-profiles.json").write_text('{"processed": 5}')
    sidecar = RealSidecar(_settings(shared))
    value = sidecar.telemetry.registry.get_sample_value
    assert value("mlprof_state_discarded_total", {"file": "step_log"}) == 0
    assert value("mlprof_state_discarded_total", {"file": "memory_profiles"}) == 1
    assert (shared / "sidecar" / "memory-profiles.json.bad").is_file()


# -- A.9 phantom runs, absurd values -------------------------------------------------------


def test_a_malformed_line_of_a_new_run_leaves_no_series(shared: Path) -> None:
    phantom = {"kind": "step", "run_id": "ghost", "workload": "w", "host": "h", "step": 1}
    (shared / "steps" / "h-1.jsonl").write_text(
        step_line(0) + json.dumps({**phantom, "start": "x", "duration": 1}) + "\n"
    )
    car = Sidecar(shared)
    car.tailer.poll()
    assert car.errors == ["schema"]
    text = generate_latest(car.telemetry.registry).decode()
    assert 'run_id="ghost"' not in text


@pytest.mark.parametrize(
    ("field", "value"),
    [("start", 1e308), ("duration", 1e308), ("duration", 86_401.0), ("wait", 1e308),
     ("wait", -1.0), ("tokens", 1e300)],
)  # fmt: skip
def test_absurd_step_values_are_refused(shared: Path, field: str, value: float) -> None:
    line = json.loads(step_line(1, start=1000.0))
    (shared / "steps" / "h-1.jsonl").write_text(json.dumps({**line, field: value}) + "\n")
    car = Sidecar(shared)
    car.tailer.poll()
    assert car.errors == ["schema"]
    assert car.value("train_steps_total") is None  # no run, no duty cycle pinned at 1.0
    assert car.metrics.expire() == 0


# -- C. input wait ------------------------------------------------------------------------


def test_input_wait_is_exported_as_histogram_and_share(shared: Path) -> None:
    rec = {"kind": "step", **IDENT, "duration": 0.1, "tokens": 1}
    lines = [  # each step: 0.3 s of input wait, then 0.1 s inside the step
        json.dumps({**rec, "step": n, "start": 1000.0 + 0.4 * n + 0.3, "wait": 0.3}) + "\n"
        for n in range(20)
    ]
    (shared / "steps" / "h-1.jsonl").write_text("".join(lines))
    car = Sidecar(shared, clock=1008.5)
    car.tailer.poll()
    assert car.value("train_step_wait_seconds_count") == 20
    assert car.value("train_step_wait_seconds_sum") == pytest.approx(6.0)
    assert car.value("train_step_wait_seconds_bucket", {**LABELS, "le": "0.2"}) == 0
    assert car.value("train_step_wait_seconds_bucket", {**LABELS, "le": "0.3"}) == 20
    assert car.value("train_input_wait_share") == pytest.approx(0.75)
    # Step time is what run.step() timed: the input wait does not inflate it.
    assert car.value("train_step_duration_seconds_sum") == pytest.approx(2.0)


# -- A.9 histogram series of expired runs ---------------------------------------------------


def test_histogram_series_leave_the_exposition_with_their_run(shared: Path) -> None:
    """As the sidecar is wired: a run silent past MLPROF_SERIES_TTL_S loses its gauges
    and, now, its histogram series too (they used to stay for the sidecar's life)."""
    now = time.time()
    old, new = {**IDENT, "run_id": "old"}, {**IDENT, "run_id": "new"}
    # The SDK's heartbeat is the log's mtime: "old" stopped long ago, "new" keeps beating.
    for name, ident, beat in (("h-1.jsonl", old, now - 2000), ("h-2.jsonl", new, now + 3600)):
        line = {"kind": "step", **ident, "step": 0, "start": now - 2000, "duration": 0.5}
        (shared / "steps" / name).write_text(json.dumps(line) + "\n")
        os.utime(shared / "steps" / name, (beat, beat))
    ttl_s = 0.2
    sidecar = RealSidecar(_settings(shared).model_copy(update={"series_ttl_s": ttl_s}))
    registry = sidecar.telemetry.registry
    sidecar.tailer.poll()
    sidecar.tailer.poll()  # a file's heartbeat is noted from its second poll on
    assert b'run_id="old"' in generate_latest(registry)
    time.sleep(ttl_s * 2)  # a run is first seen alive: the TTL runs from then
    assert sidecar.training.expire() == 1
    text = generate_latest(registry).decode()
    assert 'run_id="old"' not in text, "an expired run's histogram series stayed"
    labels = {"run_id": "new", "workload": "w", "host": "h"}
    assert registry.get_sample_value("train_step_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("train_step_wait_seconds_count", labels) == 1


def test_backend_cache_forgets_expired_runs(shared: Path) -> None:
    (shared / "steps" / "h-1.jsonl").write_text(step_line(0))
    os.utime(shared / "steps" / "h-1.jsonl", (1001.0, 1001.0))
    car = Sidecar(shared, clock=1001.0)
    car.tailer.poll()
    car.metrics.refresh_runs()
    assert set(car.metrics._accelerators) == {"r1"}
    car.now = 5000.0
    car.metrics.expire()
    assert car.metrics._accelerators == {}
