"""One JAX CPU training loop captured with XProf, with an optional change of known size.

Usage: python detection_workload.py OUT_DIR VARIANT K_PCT [SEED]

The step is an MLP update (~25 ms on a 2-core machine) whose batch comes from a Python
data phase in ``TraceAnnotation("input_pipeline")``, every step in
``StepTraceAnnotation("train")``, as a real training loop is written. Variants:

* ``same``: the workload unchanged;
* ``added``: one more jitted function (``extra_work``) every step, data-dependent on
  the step's output, costing ``K_PCT`` % of the calibrated step;
* ``slower_op``: the step's own loop (``train_step``'s ``while``) runs ``K_PCT`` % of the
  step longer (more iterations of the same compiled loop: the same program and ops);
* ``uniform``: the step's computation done twice in series (every op's time per step
  doubles, K is ignored), as a slower machine or clock would make it;
* ``input``: the data phase sleeps ``K_PCT`` % of the step longer.

The workload calibrates itself before the trace: it times its own step and the unit of
the added work, so that K is a share of *this* process's step, and prints
``DONE <path> <step_ms> <unit_ms> <iterations> <traced_step_ms>``, the last the median
wall-clock step inside the trace (``time.perf_counter``, not read from the capture): how
fast this process really ran, for a test to tell a busy machine from a product error.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

STEPS = 24
WIDTH = 512
# The added work's unit: a matmul this wide, small enough that K resolves to 1 %.
EXTRA_WIDTH = 128
# The step's own loop: SCALED_BASE iterations of a small matmul, about a fifth of the
# step, so "an existing op made slower" is that loop running longer.
SCALED_BASE = 40


@jax.jit
def train_step(w: jax.Array, x: jax.Array, n: jax.Array) -> jax.Array:
    h = x
    for _ in range(3):
        h = jnp.tanh(h @ w)
    w = w - 1e-3 * (x.T @ h) / x.shape[0]
    # The step's own loop ("scaled_op"): n iterations of a small matmul.
    small = lax.fori_loop(0, n, lambda _, a: jnp.cos(a @ a) * 0.5, w[:EXTRA_WIDTH, :EXTRA_WIDTH])
    return w.at[:EXTRA_WIDTH, :EXTRA_WIDTH].add(1e-6 * small)


@jax.jit
def extra_work(w: jax.Array, n: jax.Array) -> jax.Array:
    small = lax.fori_loop(0, n, lambda _, a: jnp.sin(a @ a) * 0.5, w[:EXTRA_WIDTH, :EXTRA_WIDTH])
    return w.at[:EXTRA_WIDTH, :EXTRA_WIDTH].add(1e-6 * small)


def batch(step: int, sleep_s: float) -> jax.Array:
    with jax.profiler.TraceAnnotation("input_pipeline"):
        if sleep_s > 0:
            time.sleep(sleep_s)
        rows = np.random.default_rng(step).standard_normal((WIDTH, WIDTH), np.float32)
        return jnp.asarray(rows)


def one_step(
    w: jax.Array, step: int, sleep_s: float, scaled: int, extra: int, repeat: int
) -> jax.Array:
    x = batch(step, sleep_s)
    out = w
    for _ in range(repeat):
        out = train_step(out, x, jnp.int32(scaled))  # chained: twice the work, in series
    w = out
    if extra:
        # Data-dependent on the step's output: it cannot overlap with the step.
        w = extra_work(w, jnp.int32(extra))
    return w.block_until_ready()


def timed(fn, repeats: int = 9) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def main() -> None:
    out, variant, k_pct = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    w = jnp.eye(WIDTH, dtype=jnp.float32) * 0.5
    # Compile everything outside the trace: a capture of a steady state.
    one_step(w, 0, 0.0, SCALED_BASE, 1, 1)
    step_s = timed(lambda: one_step(w, 0, 0.0, SCALED_BASE, 0, 1))
    unit_s = (
        timed(lambda: extra_work(w, jnp.int32(17)).block_until_ready())
        - timed(lambda: extra_work(w, jnp.int32(1)).block_until_ready())
    ) / 16
    scaled_unit_s = unit_s  # the same loop body shape: a matmul of the same width
    share = k_pct / 100
    sleep_s, scaled, extra, repeat = 0.0, SCALED_BASE, 0, 1
    if variant == "added":
        extra = max(1, round(share * step_s / unit_s))
    elif variant == "slower_op":
        scaled = SCALED_BASE + max(1, round(share * step_s / scaled_unit_s))
    elif variant == "uniform":
        repeat = 2  # every computation twice: K is ignored, the step's work doubles
    elif variant == "input":
        sleep_s = share * step_s
    elif variant != "same":
        raise SystemExit(f"unknown variant {variant!r}")
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 0
    traced = []
    with jax.profiler.trace(str(out), profiler_options=options):
        for step in range(STEPS):
            started = time.perf_counter()
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                w = one_step(w, step, sleep_s, scaled, extra, repeat)
            traced.append(time.perf_counter() - started)
    (path,) = out.glob("plugins/profile/*/*.xplane.pb")
    print(
        f"DONE {path} {1e3 * step_s:.3f} {1e3 * unit_s:.3f} {extra or scaled} "
        f"{1e3 * float(np.median(traced)):.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
