"""JAX device memory: the SDK writes ``memory`` lines, the sidecar publishes them (source="jax").

JAX here runs on CPU, where ``Device.memory_stats()`` returns None: the real-JAX test
checks that nothing is written then. The publishing path is tested with lines written
by the SDK's own writer from a memory_stats() dict recorded on a TPU v5e.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter import schema, sdk
from exporter.metrics.accelerator import DeviceSeries, accelerator_gauges
from exporter.metrics.jax_memory import JaxMemoryMetrics
from exporter.metrics.steplog import StepLogTailer
from exporter.metrics.telemetry import build_telemetry
from exporter.metrics.training import TrainingMetrics
from exporter.sdk.memory_stats import MemoryStatsSampler, jax_local_devices

# jax.devices()[0].memory_stats() on a TPU v5e, during training.
RECORDED_V5E = {
    "bytes_in_use": 8_589_934_592,
    "bytes_limit": 16_909_336_576,
    "peak_bytes_in_use": 12_884_901_888,
    "bytes_reserved": 0,
    "largest_alloc_size": 1_073_741_824,
    "num_allocs": 412,
    "largest_free_block_bytes": 6_442_450_944,
}


class RecordedDevice:
    def __init__(self, id: int, stats: dict[str, int] | None) -> None:
        self.id = id
        self.platform = "tpu"
        self._stats = stats

    def memory_stats(self) -> dict[str, int] | None:
        return self._stats


def memory_lines(shared: Path) -> list[dict[str, Any]]:
    lines = []
    for path in (shared / schema.STEPS_DIR).glob("*.jsonl"):
        for raw in path.read_text().splitlines():
            record = json.loads(raw)
            if record["kind"] == schema.KIND_MEMORY:
                lines.append(record)
    return lines


def test_real_jax_on_cpu_writes_no_memory_lines(tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp

    jnp.ones(4).block_until_ready()  # backends initialised, as in a training loop
    assert jax.local_devices()[0].memory_stats() is None  # CPU: no stats to publish
    assert [d.platform for d in jax_local_devices()] == ["cpu"]
    lines: list[str] = []
    sampler = MemoryStatsSampler.for_writer_prefix('{"run_id":"r",', lines.append)
    sampler.tick()  # the first tick always samples: no interval to wait out
    assert (lines, sampler.enabled) == ([], True)  # sampled the real devices, nothing to write
    with sdk.run(name="cpu", shared_dir=tmp_path) as run:
        with run.step():
            pass
        writer = run._writer  # drive the run's own flusher hooks rather than wait for them
        for hook in list(writer.on_tick):
            hook()
        writer.flush()
    assert memory_lines(tmp_path) == []


def test_sdk_does_not_import_jax_for_sampling(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from exporter import sdk
        with sdk.run(name="nojax", shared_dir={str(tmp_path)!r}) as run:
            with run.step():
                pass
            hooks = list(run._writer.on_tick)
            for hook in hooks:  # what the flusher thread runs, run now rather than waited for
                hook()
        print(len(hooks) > 0, "jax" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True False"


def test_sampler_writes_at_most_once_per_second() -> None:
    now = [100.0]
    lines: list[str] = []
    sampler = MemoryStatsSampler(
        '{"kind":"memory","run_id":"r",',
        lines.append,
        devices=lambda: [RecordedDevice(0, RECORDED_V5E)],
        clock=lambda: now[0],
    )
    sampler.tick()
    now[0] += 0.4
    sampler.tick()
    now[0] += 0.7
    sampler.tick()
    assert len(lines) == 2
    record = json.loads(lines[0])
    assert record["devices"] == [
        {
            "chip": "0",
            "platform": "tpu",
            "bytes_in_use": 8_589_934_592,
            "bytes_limit": 16_909_336_576,
            "peak_bytes_in_use": 12_884_901_888,
        }
    ]


def test_sampler_switches_off_after_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("backend gone")

    lines: list[str] = []
    sampler = MemoryStatsSampler("{", lines.append, devices=broken)
    sampler.tick()
    assert not sampler.enabled
    assert "device memory sampling off" in capsys.readouterr().err


def test_sidecar_publishes_recorded_tpu_memory_from_the_step_log(tmp_path: Path) -> None:
    telemetry = build_telemetry(CollectorRegistry())
    training = TrainingMetrics(telemetry.meter, tmp_path)
    series = DeviceSeries("jax", "unknown", stale_after_s=15.0)
    accelerator_gauges(telemetry.meter).add_series(series)
    training.memory = JaxMemoryMetrics(series)
    tailer = StepLogTailer(tmp_path, tmp_path / "state.json", training)
    devices = [RecordedDevice(0, RECORDED_V5E), RecordedDevice(1, None)]

    run = sdk.run(name="llm", shared_dir=tmp_path, run_id="llm-1", host="tpu-vm-0")
    sampler = MemoryStatsSampler.for_writer_prefix(
        run._writer.prefix, run._writer.append, devices=lambda: devices
    )
    sampler.tick()  # what the flusher thread does each second
    run.flush()
    assert tailer.poll().errors == {}

    labels = {
        "run_id": "llm-1",
        "workload": "llm",
        "host": "tpu-vm-0",
        "accelerator": "tpu",
        "source": "jax",
        "chip": "0",
    }
    registry = telemetry.registry
    assert registry.get_sample_value("accelerator_memory_usage_bytes", labels) == 8_589_934_592
    assert registry.get_sample_value("accelerator_memory_limit_bytes", labels) == 16_909_336_576
    # A device without stats gets no series.
    assert (
        registry.get_sample_value("accelerator_memory_usage_bytes", labels | {"chip": "1"}) is None
    )

    run.close()  # the run's "end" line takes its device series away
    tailer.poll()
    assert registry.get_sample_value("accelerator_memory_usage_bytes", labels) is None


def test_malformed_memory_line_is_counted_not_applied(tmp_path: Path) -> None:
    telemetry = build_telemetry(CollectorRegistry())
    training = TrainingMetrics(telemetry.meter, tmp_path)
    training.memory = JaxMemoryMetrics(DeviceSeries("jax", "unknown", stale_after_s=15.0))
    errors: list[str] = []
    tailer = StepLogTailer(tmp_path, tmp_path / "state.json", training, on_error=errors.append)
    steps = tmp_path / schema.STEPS_DIR
    steps.mkdir()
    identity = '"run_id":"r","workload":"w","host":"h"'
    (steps / "h-1.jsonl").write_text(
        f'{{"kind":"memory",{identity},"time":{time.time()},"devices":"lots"}}\n'
        f'{{"kind":"memory",{identity},"time":{time.time()},'
        f'"devices":[{{"chip":"0","platform":"gpu","bytes_in_use":-5}}]}}\n'
    )
    stats = tailer.poll()
    assert stats.errors == {"schema": 2}
    assert errors == ["schema", "schema"]
