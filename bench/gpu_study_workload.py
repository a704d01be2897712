"""The GPU study's JAX workload: one process, one XProf capture, a change of known size.

Usage::

    python gpu_study_workload.py OUT_DIR VARIANT K_PCT [--size gpu|cpu]
    python gpu_study_workload.py --hog SECONDS [--size gpu|cpu]

``bench/transformer_workload.py`` sized for a GPU: at its CPU sizes an H200 would run
each step in microseconds of launch overhead. The step (``StepTraceAnnotation("train")``)
is an embedding lookup and two MLP blocks in bf16 (``block_step``: four 8192 x 2048 x 8192
matmuls, ~1.5 ms on an H200) and the step's own refinement loop (``block_step``'s
``while``: small matmuls, about a third of the device time); the data phase is numpy
work on the host in ``TraceAnnotation("load_batch")`` (token ids drawn and mixed), whose
ids go to the device, as a language model's loader sends them. Variants, K % of the step
calibrated in this process as ``detection_workload.py`` does:

* ``same``: the workload unchanged;
* ``added``: one more jitted function (``extra_work``) each step, data-dependent on it;
* ``grown``: the step's own loop runs K % of the step longer (same program and ops);
* ``input``: the data phase does K % of the step more numpy work.

``--hog`` is the GPU-hogging neighbour: bf16 matmuls back to back in their own process
until SECONDS pass (it prints ``HOGGING`` once its loop runs). ``--size cpu`` is the
dry run's: the same program at sizes a 2-core CPU runs in tens of ms a step.

Prints ``DONE <path> <step_ms> <unit_ms> <iterations> <traced_step_ms>`` like the other
workloads, then ``PLATFORM <jax platform> <device kind>``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# numpy's BLAS threads spinning against XLA's pool (transformer_workload.py measured it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection_workload import timed  # the median of repeated wall-clock runs

SIZES = {
    # tokens, width, hidden, loop rows, loop width, loop iterations, data rounds, steps
    "gpu": (8192, 2048, 8192, 2048, 1024, 60, 12, 40),
    "cpu": (256, 128, 256, 64, 64, 40, 4, 24),
}
VOCAB = 4096
MIX = 256  # the data phase's numpy matmul (MIX x MIX, float32): ~0.1 ms a round, one thread


def sizes(name: str) -> dict[str, int]:
    keys = ("tokens", "width", "hidden", "loop_rows", "loop_width", "loop", "rounds", "steps")
    return dict(zip(keys, SIZES[name], strict=True))


def init(s: dict[str, int], dtype: jnp.dtype) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    w, h, lw = s["width"], s["hidden"], s["loop_width"]

    def normal(key: jax.Array, shape: tuple[int, int]) -> jax.Array:
        return (jax.random.normal(key, shape) / np.sqrt(shape[0])).astype(dtype)

    return {
        "embed": normal(keys[0], (VOCAB, w)),
        "up0": normal(keys[1], (w, h)),
        "down0": normal(keys[2], (h, w)),
        "up1": normal(keys[3], (w, h)),
        "down1": normal(keys[4], (h, w)),
        "loop": normal(keys[5], (lw, lw)),
    }


def _refine(a: jax.Array, w: jax.Array, n: jax.Array, fn) -> jax.Array:  # type: ignore[no-untyped-def]
    return lax.fori_loop(0, n, lambda _, x: (fn(x @ w) * 0.5).astype(x.dtype), a)


@jax.jit
def block_step(params: dict[str, jax.Array], ids: jax.Array, n: jax.Array) -> jax.Array:
    h = params["embed"][ids]
    for i in range(2):
        h = h + jax.nn.gelu(h @ params[f"up{i}"]) @ params[f"down{i}"] * 0.1
    rows, width = params["loop"].shape[0] * 2, params["loop"].shape[0]
    small = _refine(h[:rows, :width], params["loop"], n, jnp.cos)
    return h.at[:rows, :width].add(small * 1e-3)


@jax.jit
def extra_work(h: jax.Array, loop: jax.Array, n: jax.Array) -> jax.Array:
    rows, width = loop.shape[0] * 2, loop.shape[0]
    small = _refine(h[:rows, :width], loop, n, jnp.sin)
    return h.at[:rows, :width].add(small * 1e-3)


_MIX = np.random.default_rng(2).standard_normal((MIX, MIX)).astype(np.float32) / MIX


def load_batch(step: int, tokens: int, rounds: int) -> jax.Array:
    """The data phase: numpy work on the host; only the token ids go to the device."""
    with jax.profiler.TraceAnnotation("load_batch"):
        rng = np.random.default_rng(step)
        ids = rng.integers(0, VOCAB, tokens)
        x = rng.standard_normal((MIX, MIX), np.float32)
        for _ in range(rounds):
            x = np.tanh(x @ _MIX) + x
        ids[0] = int(x[0, 0] > 0)  # the mixing's result is used: nothing skips it
        return jnp.asarray(ids, jnp.int32)


def capture(out: Path, variant: str, k_pct: float, size: str) -> None:
    s = sizes(size)
    dtype = jnp.bfloat16 if size == "gpu" else jnp.float32
    params = init(s, dtype)

    def one_step(step: int, rounds: int, loop: int, extra: int) -> jax.Array:
        ids = load_batch(step, s["tokens"], rounds)
        h = block_step(params, ids, jnp.int32(loop))
        if extra:
            h = extra_work(h, params["loop"], jnp.int32(extra))  # data-dependent: no overlap
        return h.block_until_ready()

    one_step(0, 1, 1, 1)  # compile outside the trace (a cached executable loads here)
    step_s = timed(lambda: one_step(0, s["rounds"], s["loop"], 0))
    h = one_step(0, 1, 1, 0)

    def per_unit(fn) -> float:  # type: ignore[no-untyped-def]
        return max(1e-7, (timed(lambda: fn(17)) - timed(lambda: fn(1))) / 16)

    loop_s = per_unit(lambda n: extra_work(h, params["loop"], jnp.int32(n)).block_until_ready())
    data_s = per_unit(lambda n: load_batch(0, s["tokens"], n))
    share = k_pct / 100
    rounds, loop, extra, unit_s = s["rounds"], s["loop"], 0, loop_s
    if variant == "added":
        extra = max(1, round(share * step_s / loop_s))
    elif variant == "grown":
        loop = s["loop"] + max(1, round(share * step_s / loop_s))
    elif variant == "input":
        rounds, unit_s = s["rounds"] + max(1, round(share * step_s / data_s)), data_s
    elif variant != "same":
        raise SystemExit(f"unknown variant {variant!r}")
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 0
    traced = []
    with jax.profiler.trace(str(out), profiler_options=options):
        for step in range(s["steps"]):
            started = time.perf_counter()
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                one_step(step, rounds, loop, extra)
            traced.append(time.perf_counter() - started)
    (path,) = out.glob("plugins/profile/*/*.xplane.pb")
    iterations = {"added": extra, "grown": loop, "input": rounds}.get(variant, loop)
    print(
        f"DONE {path} {1e3 * step_s:.3f} {1e3 * unit_s:.3f} {iterations} "
        f"{1e3 * float(np.median(traced)):.3f}",
        flush=True,
    )
    device = jax.devices()[0]
    print(f"PLATFORM {device.platform} {device.device_kind.replace(' ', '_')}", flush=True)


def hog(seconds: float, size: str) -> None:
    """A neighbour that keeps the device busy: chained bf16 matmuls, back to back."""
    n = 8192 if size == "gpu" else 256
    dtype = jnp.bfloat16 if size == "gpu" else jnp.float32
    x = jax.random.normal(jax.random.PRNGKey(3), (n, n)).astype(dtype) / np.sqrt(n)

    @jax.jit
    def burn(a: jax.Array) -> jax.Array:
        for _ in range(8):
            a = (a @ a).astype(dtype) * 0.5
        return a

    burn(x).block_until_ready()
    print("HOGGING", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x = burn(x).block_until_ready()


def main(argv: list[str]) -> None:
    size = "cpu"
    if "--size" in argv:
        at = argv.index("--size")
        size = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    if size not in SIZES:
        raise SystemExit(f"--size: expected one of {sorted(SIZES)}, got {size!r}")
    if argv[:1] == ["--hog"]:
        hog(float(argv[1]), size)
        return
    if len(argv) != 3:
        raise SystemExit(__doc__)
    capture(Path(argv[0]), argv[1], float(argv[2]), size)


if __name__ == "__main__":
    main(sys.argv[1:])
