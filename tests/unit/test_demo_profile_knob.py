"""The demo workload's ``demo-profile`` knob: how the device check captures without xprof.

scripts/device-check.sh asks the workload to trace a few steps with ``run.profile`` when
XProf's profiler client (remote capture) is not installed, as on the lent GPU machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.demo.workload import PROFILE_FILE, profile_request


@pytest.mark.parametrize(
    ("written", "steps"), [("5", 5), ("", 5), ("0", 1), ("99999", 1000), ("many", 5)]
)
def test_a_request_is_read_once_and_bounded(tmp_path: Path, written: str, steps: int) -> None:
    knob = tmp_path / PROFILE_FILE
    knob.write_text(written)
    assert profile_request(knob) == steps
    assert not knob.exists()  # taken: one trace per request
    assert profile_request(knob) == 0


def test_the_workload_traces_the_steps_asked_for_into_a_session(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    from exporter.demo.workload import main

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / PROFILE_FILE).write_text("2")
    args = ["--shared-dir", str(shared), "--steps", "3", "--profiler-port", "0"]
    assert main([*args, "--batch", "8", "--features", "8", "--hidden", "16"]) == 0
    records = list(shared.rglob("session.json"))
    assert len(records) == 1, records
    record = json.loads(records[0].read_text())
    assert (record["status"], record["trigger"]) == ("done", "programmatic")
    assert list(records[0].parent.rglob("*.xplane.pb"))


def test_a_fifo_or_a_link_under_the_knobs_name_is_no_request(tmp_path: Path) -> None:
    """The knob is read as the project reads every file others may write: a FIFO there
    blocked the step loop in open(), a link was followed."""
    import os

    knob = tmp_path / PROFILE_FILE
    os.mkfifo(knob)
    assert profile_request(knob) == 0  # returns at once, no reader waits on it
    assert not knob.exists()
    (tmp_path / "elsewhere").write_text("7")
    knob.symlink_to(tmp_path / "elsewhere")
    assert profile_request(knob) == 0
    assert (tmp_path / "elsewhere").read_text() == "7"
