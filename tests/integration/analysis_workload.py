"""JAX CPU workloads for the comparison and analysis tests, one capture per variant.

Usage: python analysis_workload.py OUT_DIR VARIANT [VARIANT ...]

Variants (each writes ``OUT_DIR/<variant>/plugins/profile/<session>/<host>.xplane.pb``,
except the memory ones, which write ``OUT_DIR/<variant>.pprof.gz``):

* ``compute``: steps of a jitted MLP update; the batch is made in an annotated
  ``data_loading`` phase inside the step, which costs almost nothing;
* ``heavy``: the same, plus a heavy jitted function (``heavy_extra``) every step;
* ``sleepy``: the same as ``compute``, but ``data_loading`` sleeps twice as long as the
  previous step's compute took (so its share stays near two thirds however loaded the
  machine is);
* ``demo`` / ``demo_slow``: as the README's demo loop is written, the batch comes from an
  ``input_pipeline`` annotation *between* the steps; ``demo_slow`` sleeps
  :data:`DEMO_DELAY_S` in it, as ``echo 0.02 > demo-input-delay`` would;
* ``recompiling``: every step's batch has a new shape, so ``update`` compiles again
  inside each step, as a workload with unpadded variable-length batches does;
* ``memory_base`` / ``memory_extra``: device-memory profiles of the model's buffers,
  the second with a 64 MiB buffer allocated by ``allocate_extra_buffer``.

Prints ``DONE <variant> <path>`` per variant. The demo variants also write
``OUT_DIR/<variant>/cycle_ms``: the median of their step cycles (a step's start to the
next step's, the last step alone, as ``exporter.analysis.sides.load.step_cycles`` reads them
from the capture) by the process's own clock (``time.perf_counter``), so a test can tell
a busy machine's doing from the product's.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

STEPS = 16
SLEEP_RATIO = 2.0  # sleepy: data_loading sleeps this many times the last compute time
EXTRA_BUFFER_BYTES = 64 * 1024 * 1024
DEMO_DELAY_S = 0.02


@jax.jit
def update(w: jax.Array, x: jax.Array) -> jax.Array:
    h = x
    for _ in range(4):
        h = jnp.tanh(h @ w)
    return w - 1e-3 * (x.T @ h) / x.shape[0]


@jax.jit
def heavy_extra(a: jax.Array) -> jax.Array:
    # Heavier than the update itself: new work, named whatever the machine's load
    # (analysis.noise.MIN_NEW_STEP_PCT).
    for _ in range(8):
        a = jnp.sin(a @ a)
    return a


def data_loading(step: int, sleep_s: float) -> jax.Array:
    with jax.profiler.TraceAnnotation("data_loading"):
        if sleep_s:
            time.sleep(sleep_s)
        return jnp.full((512, 512), step % 7, jnp.float32)


def allocate_extra_buffer() -> jax.Array:
    return jnp.ones((EXTRA_BUFFER_BYTES // 4,), jnp.float32).block_until_ready()


def capture(out: Path, variant: str) -> Path:
    w = jnp.eye(512, dtype=jnp.float32)
    a = jnp.ones((512, 512), jnp.float32) / 512
    compute_s = 0.05
    # Compile outside the trace: a capture of a steady state.
    update(w, data_loading(0, 0.0)).block_until_ready()
    heavy_extra(a).block_until_ready()
    logdir = out / variant
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 0
    starts: list[float] = []  # perf_counter at each demo step's start, then the last end
    with jax.profiler.trace(str(logdir), profiler_options=options):
        for step in range(STEPS if variant.startswith("demo") else 0):
            with jax.profiler.TraceAnnotation("input_pipeline"):
                if variant == "demo_slow":
                    time.sleep(DEMO_DELAY_S)
                x = jnp.full((512, 512), step % 7, jnp.float32)
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                starts.append(time.perf_counter())
                w = update(w, x)
                w.block_until_ready()
            last_end = time.perf_counter()
        for step in range(STEPS if variant == "recompiling" else 0):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                x = data_loading(step, 0.0)[: 256 + step]
                update(w[: 256 + step, : 256 + step], x[:, : 256 + step]).block_until_ready()
        plain = not variant.startswith("demo") and variant != "recompiling"
        for step in range(STEPS if plain else 0):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                sleep_s = SLEEP_RATIO * compute_s if variant == "sleepy" else 0.0
                x = data_loading(step, sleep_s)
                started = time.perf_counter()
                w = update(w, x)
                if variant == "heavy":
                    heavy_extra(a).block_until_ready()
                w.block_until_ready()
                compute_s = time.perf_counter() - started
    if starts:
        cycles = [b - a for a, b in zip(starts, [*starts[1:], last_end], strict=True)]
        (logdir / "cycle_ms").write_text(f"{1e3 * statistics.median(cycles):.3f}\n")
    (path,) = logdir.glob("plugins/profile/*/*.xplane.pb")
    return path


def memory_profile(out: Path, variant: str) -> Path:
    keep = [jnp.ones((512, 512), jnp.float32), jnp.zeros((1024,), jnp.float32)]
    if variant == "memory_extra":
        keep.append(allocate_extra_buffer())
    path = out / f"{variant}.pprof.gz"
    path.write_bytes(jax.profiler.device_memory_profile())
    del keep
    return path


def main() -> None:
    out = Path(sys.argv[1])
    for variant in sys.argv[2:]:
        if variant.startswith("memory"):
            path = memory_profile(out, variant)
        else:
            path = capture(out, variant)
        print(f"DONE {variant} {path}", flush=True)


if __name__ == "__main__":
    main()
