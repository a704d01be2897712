"""Where ``mlprof demo --duration`` starts counting: the workload's first step record."""

from __future__ import annotations

from pathlib import Path

from exporter.demo.first_step import FirstStep

IDENTITY = '"run_id":"r1","workload":"demo-mlp","host":"vm"'


def _append(log: Path, *kinds: str) -> None:
    with log.open("a") as f:
        for kind in kinds:
            f.write(f'{{"kind":"{kind}",{IDENTITY}}}\n')


def test_the_first_step_of_this_process_is_seen(tmp_path: Path) -> None:
    first = FirstStep(tmp_path, 4242)
    assert not first.seen()  # no steps directory yet
    log = tmp_path / "steps" / "vm-4242.jsonl"
    log.parent.mkdir()
    _append(tmp_path / "steps" / "vm-14242.jsonl", "step")  # another process
    _append(log, "mfu_basis")  # compiled, no step yet
    assert not first.seen()
    _append(log, "step")
    assert first.seen()


def test_an_earlier_run_with_the_same_pid_does_not_count(tmp_path: Path) -> None:
    log = tmp_path / "steps" / "vm-4242.jsonl"
    log.parent.mkdir()
    _append(log, "mfu_basis", "step", "step", "end")  # a run before this one
    first = FirstStep(tmp_path, 4242)
    _append(log, "mfu_basis")
    assert not first.seen()
    _append(log, "step")
    assert first.seen()
