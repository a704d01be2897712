"""Scripts of the fake TPU runtime: frames over time, absent chips, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.errors import InputError
from exporter.faketpu import FakeFrame, FakeTpuRuntime, FakeTpuScript, load_script
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
        ("frames: [{latency_scale: 0}]", "frames[0].latency_scale: expected a positive number"),
        ("frames: [{hbm_bandwidth_util_percent: [x]}]", "expected numbers or null, got 'x'"),
    ],
)
def test_bad_scripts_name_the_file_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_script(path)
    assert str(err.value).startswith(f"--script {path}: ")
    assert message in str(err.value)


def test_latency_distributions_grow_with_time_and_follow_the_frames_scale() -> None:
    now = [0.0]
    frames = (FakeFrame((90.0,), (1.0,)), FakeFrame((90.0,), (1.0,), latency_scale=2.0))
    fake = FakeTpuRuntime(FakeTpuScript(1, 1 << 30, 100.0, frames), clock=lambda: now[0])
    name = "megascale.dcn_transfer_latencies.microsecond.cumulative.distribution"

    def eight_mb() -> tuple[int, float]:
        metrics = fake.metrics(name)
        assert metrics is not None
        (dist,) = [m.distribution for m in metrics if "8MB+" in str(m.attribute)]
        assert sum(dist.bucket_counts) == dist.count
        assert dist.bucket_options.exponential_buckets.growth_factor > 1
        return dist.count, dist.mean

    c0, m0 = eight_mb()
    assert c0 > 0  # the runtime has a history when the fake starts
    now[0] = 100.0
    c1, m1 = eight_mb()
    assert c1 - c0 == pytest.approx(600, abs=3)  # 6 transfers a second of 8 MB+
    now[0] = 200.0  # the second frame doubles every latency
    c2, m2 = eight_mb()
    added = (c2 * m2 - c1 * m1) / (c2 - c1)
    assert added == pytest.approx(2 * m0, rel=0.01)
    assert fake.metrics("tpu.runtime.unknown") is None
