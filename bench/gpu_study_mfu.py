"""GPU study part ``mfu``: the SDK's MFU (XLA's cost analysis, the chip table) against a
hand count on a bf16 matmul chain, and the chain's rate against torch's own matmul.

A jitted chain of ``CHAIN`` bf16 matmuls of n x n (8192 on a GPU) has exactly
``CHAIN x 2 n^3`` FLOPs by hand. Checks:

- ``xla_step_flops`` (``exporter/sdk/mfu.py``: XLA's cost analysis of the compiled
  chain) equals the hand count but for elementwise work of order n^2 (bf16 converts:
  XLA counts a flop an element; on the CPU 12 n^2 a matmul, 2.3 % at n = 256, 0.07 %
  at 8192);
- the chip table's peak for the device's ``device_kind`` (an H200: 989.5 TFLOP/s dense
  bf16); on the dry run's CPU no peak is known and a stated 1 TFLOP/s stands in;
- every ``mfu`` record the SDK wrote to the step log (``run.step_function`` + one
  ``run.step()`` per chain) equals XLA's FLOPs / (that step's logged duration x peak)
  to the 6 digits written; MFU by the hand count is reported beside it;
- the chain's achieved TFLOP/s against an n x n x n bf16 ``torch.matmul`` timed with
  CUDA events in the same process (KINDS.md measured 769-798 TFLOP/s on an H200).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_study_part import Part, run_part

CHAIN = 8
STEPS = 20
# Elementwise FLOPs XLA may count beside a matmul, per n^2 (converts, the slice of ws).
ELEMENTWISE = 16


def body(part: Part) -> None:
    import jax
    import jax.numpy as jnp

    from exporter import sdk
    from exporter.sdk.mfu import chip_peak, xla_step_flops

    n = 8192 if part.gpu else 256
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    x = (jax.random.normal(keys[0], (n, n)) / n**0.5).astype(jnp.bfloat16)
    ws = (jax.random.normal(keys[1], (CHAIN, n, n)) / n**0.5).astype(jnp.bfloat16)

    @jax.jit
    def chain(x: jax.Array, ws: jax.Array) -> jax.Array:
        for i in range(CHAIN):
            x = x @ ws[i]
        return x

    hand = CHAIN * 2.0 * n**3
    xla = xla_step_flops(chain, x, ws)
    part.figures.update({"n": n, "chain": CHAIN, "hand_flops": hand, "xla_flops": xla})
    elementwise = xla - hand
    part.check(
        0 <= elementwise <= ELEMENTWISE * CHAIN * n**2,
        "XLA cost analysis = hand count",
        f"{xla:.6g} vs {hand:.6g} FLOPs (x{xla / hand:.5f}; "
        f"{elementwise / (CHAIN * n**2):g} n^2 a matmul besides)",
    )
    device = jax.devices()[0]
    peak = chip_peak(device.device_kind)
    part.figures.update({"device_kind": device.device_kind, "platform": device.platform})
    user_peak = None
    if peak is None:
        user_peak = 1e12  # no table entry (a CPU): a stated peak exercises the same path
        part.add("INFO", "chip table peak", f"none for {device.device_kind!r}: 1 TFLOP/s stated")
    else:
        part.add("INFO", "chip table peak", f"{peak.name}: {peak.flops_per_s / 1e12:g} TFLOP/s")
    peak_flops = user_peak or (peak.flops_per_s if peak else 0.0)
    if part.gpu:
        part.check(peak is not None, "the GPU is in the chip table", device.device_kind)

    shared = part.work / "shared"
    chain(x, ws).block_until_ready()  # compiled outside the steps
    with sdk.run("gpu-study-mfu", shared_dir=shared, peak_flops=user_peak) as run:
        used = run.step_function(chain, x, ws)
        part.check(used == xla, "run.step_function takes XLA's FLOPs", f"{used:.4g}")
        times = []
        for _ in range(STEPS):
            started = time.perf_counter()
            with run.step():
                chain(x, ws).block_until_ready()
            times.append(time.perf_counter() - started)
    steps, mfus = {}, {}
    for log in sorted((shared / "steps").glob("*")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "step":
                steps[record["step"]] = record["duration"]
            elif record.get("kind") == "record" and record.get("name") == "mfu":
                mfus[record["step"]] = record["value"]
    pairs = [(mfus[s], xla / (steps[s] * peak_flops)) for s in mfus if s in steps]
    worst = max((abs(logged / want - 1) for logged, want in pairs), default=None)
    part.check(
        len(pairs) == STEPS and worst is not None and worst <= 1e-5,
        "step log mfu = XLA FLOPs / (step x peak)",
        f"{len(pairs)}/{STEPS} steps, worst {worst or 0:.1e} apart",
    )
    step_s = statistics.median(times)
    part.figures.update(
        {
            "step_ms_median": 1e3 * step_s,
            "mfu_sdk_median": statistics.median(v for v, _ in pairs) if pairs else None,
            "mfu_hand_median": hand / (step_s * peak_flops),
            "chain_tflops": hand / step_s / 1e12,
            "peak_tflops": peak_flops / 1e12,
        }
    )
    part.add(
        "INFO",
        "chain",
        f"{1e3 * step_s:.2f} ms a step, {hand / step_s / 1e12:.3g} TFLOP/s, "
        f"MFU {hand / (step_s * peak_flops):.3f}",
    )
    reference_tflops(part, n)


def reference_tflops(part: Part, n: int) -> None:
    """torch's own n x n x n bf16 matmul in this process: the rate the chain is held to."""
    import torch

    dev = "cuda" if part.gpu and torch.cuda.is_available() else "cpu"
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b)
    if dev == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / 10
    else:
        started = time.perf_counter()
        for _ in range(10):
            torch.matmul(a, b)
        seconds = (time.perf_counter() - started) / 10
    tflops = 2.0 * n**3 / seconds / 1e12
    part.figures["torch_matmul_tflops"] = tflops
    chain = part.figures.get("chain_tflops") or 0.0
    part.add(
        "INFO",
        "reference: torch.matmul",
        f"{tflops:.3g} TFLOP/s on {dev} (the chain: {chain / tflops:.2f}x of it)",
    )


if __name__ == "__main__":
    run_part("mfu", body)
