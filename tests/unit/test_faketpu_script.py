"""Scripts of the fake TPU runtime: frames over time, absent chips, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.errors import InputError
from exporter.faketpu import FakeTpuRuntime, load_script
from exporter.metrics.tpu import DUTY_CYCLE_METRIC, HBM_TOTAL_METRIC, HBM_USAGE_METRIC


def test_frames_repeat_and_missing_chips_are_absent(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(
        "chips: 2\nperiod_s: 10\nhbm_total_bytes: 1000\nframes:\n"
        "  - {duty_cycle_percent: [90, 10], hbm_usage_bytes: [1.0e9, 2e2]}\n"
        "  - {duty_cycle_percent: [50]}\n"
    )
    fake = FakeTpuRuntime(load_script(path))  # not started: values only
    start = fake._state.started
    assert fake.frame(start + 1).duty_cycle_percent == (90.0, 10.0)
    assert fake.frame(start + 11).duty_cycle_percent == (50.0,)
    assert fake.frame(start + 21).hbm_usage_bytes == (1e9, 200.0)
    assert fake.values(HBM_TOTAL_METRIC) == {0: 1000.0, 1: 1000.0}
    assert fake.values("tpu.runtime.unknown") is None
    fake.remove_chip(1)
    assert set(fake.values(DUTY_CYCLE_METRIC) or {}) <= {0}
    assert set(fake.values(HBM_USAGE_METRIC) or {}) <= {0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a mapping with a non-empty 'frames' list"),
        ("frames: []", "expected a mapping with a non-empty 'frames' list"),
        ("chips: 2\nframes: [{duty_cycle_percent: [1, 2, 3]}]", "at most 2 numbers"),
        ("frames: [{hbm_usage_bytes: [true]}]", "expected numbers or null, got True"),
        ("period_s: 0\nframes: [{}]", "'period_s' must be a positive number"),
        ("chips: 0\nframes: [{}]", "'chips' must be an integer 1..4096"),
        ("frames: [{: ]", "not YAML or JSON"),
    ],
)
def test_bad_scripts_name_the_file_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_script(path)
    assert str(err.value).startswith(f"--script {path}: ")
    assert message in str(err.value)
