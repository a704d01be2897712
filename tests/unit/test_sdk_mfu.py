"""MFU without hand-given FLOPs: XLA's cost analysis of the real compiled step (JAX on
CPU), a peak from the user or the chip table, and ``train_mfu`` on the sidecar's /metrics.

CPU has no entry in the chip table, so these runs set a peak; without one the step log
says why there is no MFU and no ``mfu`` record is written.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter import sdk
from exporter.metrics.steplog import StepLogTailer
from exporter.metrics.telemetry import build_telemetry
from exporter.metrics.training import TrainingMetrics
from exporter.sdk.mfu import chip_peak

M, K, N = 128, 256, 64  # one matmul: 2*M*K*N FLOPs
PEAK = 1e9  # a made-up CPU peak, FLOP/s


def _lines(shared: Path) -> list[dict[str, Any]]:
    (log,) = (shared / "steps").iterdir()
    return [json.loads(x) for x in log.read_text().splitlines()]


def _train(run: sdk.Run, steps: int) -> None:
    import jax
    import jax.numpy as jnp

    step = jax.jit(lambda a, b: jnp.tanh(a @ b))
    a, b = jnp.ones((M, K)), jnp.ones((K, N))
    run.step_function(step, a, b)
    for _ in range(steps):
        with run.step():
            step(a, b).block_until_ready()


def test_mfu_from_xla_cost_analysis_with_a_user_peak(tmp_path: Path) -> None:
    telemetry = build_telemetry(CollectorRegistry())
    training = TrainingMetrics(telemetry.meter, tmp_path)
    tailer = StepLogTailer(tmp_path, tmp_path / "state.json", training)
    with sdk.run("mm", shared_dir=tmp_path, run_id="mm-1", host="h", peak_flops=PEAK) as run:
        _train(run, steps=3)
        run.flush()
        assert tailer.poll().errors == {}
        last_mfu = telemetry.registry.get_sample_value(
            "train_mfu", {"run_id": "mm-1", "workload": "mm", "host": "h"}
        )

    lines = _lines(tmp_path)
    basis = [x for x in lines if x["kind"] == "mfu_basis"][-1]
    flops = basis["flops_per_step"]
    # XLA counts the matmul (2*M*K*N) plus the elementwise tanh: at least the matmul.
    assert 2 * M * K * N <= flops < 2 * M * K * N * 1.1
    assert basis["flops_source"] == "xla_cost_analysis"
    assert (basis["peak_flops"], basis["peak_source"]) == (PEAK, "user")
    assert basis["device_kind"] == "cpu"
    assert "xla_cost_analysis" in basis["note"] and "user" in basis["note"]

    steps = [x for x in lines if x["kind"] == "step"]
    mfus = [x for x in lines if x["kind"] == "record" and x["name"] == "mfu"]
    assert [x["step"] for x in mfus] == [x["step"] for x in steps] == [1, 2, 3]
    for step, mfu in zip(steps, mfus, strict=True):
        assert math.isclose(
            mfu["value"], flops / PEAK / step["duration"], rel_tol=1e-4
        )  # 6 significant digits
    assert last_mfu == mfus[-1]["value"]  # what the sidecar exposes as train_mfu


def test_on_cpu_without_a_peak_the_log_says_why_and_no_mfu_is_written(tmp_path: Path) -> None:
    with sdk.run("mm", shared_dir=tmp_path, run_id="mm-2", host="h") as run:
        _train(run, steps=2)
    lines = _lines(tmp_path)
    basis = [x for x in lines if x["kind"] == "mfu_basis"][-1]
    assert basis["flops_source"] == "xla_cost_analysis" and basis["flops_per_step"] > 0
    assert basis["peak_flops"] is None and basis["peak_source"] is None
    assert "'cpu'" in basis["note"] and "peak_flops" in basis["note"]
    assert not [x for x in lines if x["kind"] == "record"]


def test_user_flops_override_the_cost_analysis(tmp_path: Path) -> None:
    shared = tmp_path
    with sdk.run("mm", shared_dir=shared, run_id="r", flops_per_step=5e8, peak_flops=PEAK) as run:
        _train(run, steps=1)
    lines = _lines(shared)
    basis = [x for x in lines if x["kind"] == "mfu_basis"][-1]
    assert (basis["flops_per_step"], basis["flops_source"]) == (5e8, "user")
    (step,) = [x for x in lines if x["kind"] == "step"]
    (mfu,) = [x for x in lines if x["kind"] == "record"]
    assert math.isclose(mfu["value"], 0.5 / step["duration"], rel_tol=1e-4)  # 6 significant digits


def test_a_bad_user_value_names_the_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="peak_flops"):
        sdk.run("mm", shared_dir=tmp_path, peak_flops=0)
    with pytest.raises(ValueError, match="flops_per_step"):
        sdk.run("mm", shared_dir=tmp_path, flops_per_step=math.nan)


@pytest.mark.parametrize(
    ("device_kind", "chip", "tflops"),
    [
        ("TPU v4", "TPU v4", 275),
        ("TPU v5 lite", "TPU v5e", 197),
        ("TPU v5e", "TPU v5e", 197),
        ("TPU v5", "TPU v5p", 459),
        ("TPU v5p", "TPU v5p", 459),
        ("TPU v6 lite", "TPU v6e", 918),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100", 312),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100", 312),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 989.5),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", "NVIDIA H200 SXM", 989.5),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL", 835.5),
    ],
)
def test_chip_table(device_kind: str, chip: str, tflops: float) -> None:
    peak = chip_peak(device_kind)
    assert peak is not None and (peak.name, peak.flops_per_s) == (chip, tflops * 1e12)


@pytest.mark.parametrize("device_kind", ["cpu", "NVIDIA A10", "Tesla V100-SXM2-16GB", "TPU v3"])
def test_unknown_chips_have_no_peak(device_kind: str) -> None:
    assert chip_peak(device_kind) is None


def test_a_sharded_step_counts_one_devices_flops(tmp_path: Path) -> None:
    """XLA's cost analysis of an SPMD program is per device: the unit of the peak."""
    code = textwrap.dedent(
        f"""
        import json, jax, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from exporter import sdk
        mesh = Mesh(jax.devices(), ("d",))
        a = jax.device_put(jnp.ones(({4 * M}, {K})), NamedSharding(mesh, P("d", None)))
        b = jnp.ones(({K}, {N}))
        with sdk.run("mm", shared_dir={str(tmp_path)!r}, peak_flops={PEAK}) as run:
            print(json.dumps([jax.device_count(), run.step_function(jax.jit(jnp.matmul), a, b)]))
        """
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    devices, flops = json.loads(out.splitlines()[-1])
    assert devices == 4
    assert flops == 2 * M * K * N  # a quarter of the global 2 * (4M) * K * N


def test_the_sidecar_refuses_a_malformed_basis_line_without_a_phantom_run(tmp_path: Path) -> None:
    telemetry = build_telemetry(CollectorRegistry())
    training = TrainingMetrics(telemetry.meter, tmp_path)
    tailer = StepLogTailer(tmp_path, tmp_path / "state.json", training)
    (tmp_path / "steps").mkdir()
    line = {"kind": "mfu_basis", "run_id": "x", "workload": "w", "host": "h", "note": 7}
    (tmp_path / "steps" / "h-1.jsonl").write_text(json.dumps(line) + "\n")
    assert sum(tailer.poll().errors.values()) == 1
    up = telemetry.registry.get_sample_value(
        "mlprof_workload_up", {"run_id": "x", "workload": "w", "host": "h"}
    )
    assert up is None
