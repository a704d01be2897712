"""A small causal-transformer training loop on JAX CPU, captured with XProf, with an
optional change of known size: ``bench/detection.py``'s second workload shape.

Usage: python transformer_workload.py OUT_DIR VARIANT K_PCT [UNITS]

Unlike ``detection_workload.py`` (an MLP whose data phase sleeps), the data phase here
is real CPU work in numpy (``TraceAnnotation("load_batch")``: token ids drawn, embedded
and mixed by numpy matmuls), so it competes for the cores as a real input pipeline
does; the step is one pre-norm transformer block's forward and backward pass
(``StepTraceAnnotation("train")``). Variants:

* ``same``: the workload unchanged;
* ``added``: one more jitted function (``extra_work``) every step, data-dependent on the
  step's output, costing ``K_PCT`` % of the calibrated step (new work);
* ``slower_op``: the step's own refinement loop (``block_step``'s ``while``) runs
  ``K_PCT`` % of the step longer (an existing op grown: the same program and ops);
* ``input``: the data phase does ``K_PCT`` % of the step more numpy work;
* ``uniform``: the batch is ``K_PCT`` % larger: every op (and the data phase) does
  that much more work, as a slower machine or clock would make it;
* ``calibrate``: no capture; prints ``CALIBRATED <step_ms> <loop_ms> <data_ms>``, the
  step and one unit of each change, for a caller to fix ``UNITS``.

It calibrates itself before the trace, as ``detection_workload.py`` does (K % of *this*
process's step), unless ``UNITS`` fixes the change's size in its own units (added or
loop iterations, data-phase rounds: what another process of the variant chose), and
prints ``DONE <path> <step_ms> <unit_ms> <units> <traced_step_ms>``, ``units`` being the
change's (0 for ``same`` and ``uniform``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# numpy's BLAS threads spinning against XLA's pool made the data phase 100x slower on
# 2 cores (measured: 2 rounds of mixing 221 ms, 2 ms with one thread).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

STEPS = 24
BATCH = 20
SEQ = 64
WIDTH = 128
VOCAB = 512
# The step's refinement loop: this many iterations of a small matmul (about a fifth of
# the step: ~0.2 ms an iteration, measured), so "an existing op grown" is that loop running longer.
LOOP_BASE = 50
LOOP_WIDTH = 128
# The data phase's own work: this many numpy matmuls of the batch's embeddings
# (~1 ms each: the data phase is about a fifth of the step).
DATA_BASE = 10


def init(seed: int = 0) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    scale = 1 / np.sqrt(WIDTH)
    return {
        "qkv": jax.random.normal(keys[0], (WIDTH, 3 * WIDTH)) * scale,
        "out": jax.random.normal(keys[1], (WIDTH, WIDTH)) * scale,
        "up": jax.random.normal(keys[2], (WIDTH, 4 * WIDTH)) * scale,
        "down": jax.random.normal(keys[3], (4 * WIDTH, WIDTH)) * scale / 2,
    }


def _norm(x: jax.Array) -> jax.Array:
    return (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5)


def _loss(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = _norm(x)
    q, k, v = jnp.split(h @ params["qkv"], 3, axis=-1)
    scores = (q @ k.swapaxes(-1, -2)) / np.sqrt(WIDTH)
    mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    x = x + (attn @ v) @ params["out"]
    x = x + jax.nn.gelu(_norm(x) @ params["up"]) @ params["down"]
    return jnp.mean(x[:, 1:] ** 2)


@jax.jit
def block_step(params: dict[str, jax.Array], x: jax.Array, n: jax.Array) -> dict[str, jax.Array]:
    grads = jax.grad(_loss)(params, x)
    params = jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)
    # The step's own refinement loop: n iterations of a small matmul.
    small = lax.fori_loop(
        0, n, lambda _, a: jnp.cos(a @ a) * 0.5, params["out"][:LOOP_WIDTH, :LOOP_WIDTH]
    )
    return {**params, "out": params["out"].at[:LOOP_WIDTH, :LOOP_WIDTH].add(1e-6 * small)}


@jax.jit
def extra_work(params: dict[str, jax.Array], n: jax.Array) -> dict[str, jax.Array]:
    small = lax.fori_loop(
        0, n, lambda _, a: jnp.sin(a @ a) * 0.5, params["out"][:LOOP_WIDTH, :LOOP_WIDTH]
    )
    return {**params, "out": params["out"].at[:LOOP_WIDTH, :LOOP_WIDTH].add(1e-6 * small)}


_TABLE = np.random.default_rng(1).standard_normal((VOCAB, WIDTH)).astype(np.float32)
_MIX = np.random.default_rng(2).standard_normal((WIDTH, WIDTH)).astype(np.float32) / WIDTH


def load_batch(step: int, batch: int, rounds: int) -> jax.Array:
    """The data phase: numpy work on the host (token ids, embeddings, mixing)."""
    with jax.profiler.TraceAnnotation("load_batch"):
        ids = np.random.default_rng(step).integers(0, VOCAB, (batch, SEQ))
        x = _TABLE[ids]
        for _ in range(rounds):
            x = np.tanh(x @ _MIX) + x
        return jnp.asarray(x)


def one_step(
    params: dict[str, jax.Array], step: int, batch: int, rounds: int, loop: int, extra: int
) -> dict[str, jax.Array]:
    x = load_batch(step, batch, rounds)
    params = block_step(params, x, jnp.int32(loop))
    if extra:
        params = extra_work(params, jnp.int32(extra))  # data-dependent: no overlap
    return jax.block_until_ready(params)


def timed(fn, repeats: int = 9) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


@dataclass
class Setup:
    """A calibrated workload: the step's arguments for one variant of K % of the step."""

    params: dict[str, jax.Array]
    batch: int
    rounds: int
    loop: int
    extra: int
    step_s: float
    unit_s: float
    loop_s: float = 0.0  # one loop iteration (added or grown work), as calibrated
    data_s: float = 0.0  # one data-phase round, as calibrated

    def step(self, step: int) -> None:
        self.params = one_step(self.params, step, self.batch, self.rounds, self.loop, self.extra)


def setup(variant: str, k_pct: float, units: int | None = None) -> Setup:
    """Compile and calibrate in this process (K is a share of *its* step); ``units``: the
    change's size in its own units instead (added or loop iterations, data rounds), so
    that every process of a variant runs the same work, as a user's changed code does."""
    params = init()
    share = k_pct / 100
    batch = round(BATCH * (1 + share)) if variant == "uniform" else BATCH
    one_step(params, 0, batch, DATA_BASE, LOOP_BASE, 1)  # compile outside the trace
    step_s = timed(lambda: one_step(params, 0, batch, DATA_BASE, LOOP_BASE, 0))

    def per_unit(fn) -> float:  # type: ignore[no-untyped-def]
        return (timed(lambda: fn(17)) - timed(lambda: fn(1))) / 16

    loop_s = per_unit(lambda n: jax.block_until_ready(extra_work(params, jnp.int32(n))))
    data_s = per_unit(lambda n: load_batch(0, batch, n))
    rounds, loop, extra, unit_s = DATA_BASE, LOOP_BASE, 0, loop_s

    def size(unit: float) -> int:
        return units if units is not None else max(1, round(share * step_s / unit))

    if variant == "added":
        extra = size(loop_s)
    elif variant == "slower_op":
        loop = LOOP_BASE + size(loop_s)
    elif variant == "input":
        rounds, unit_s = DATA_BASE + size(data_s), data_s
    elif variant not in ("same", "uniform", "calibrate"):
        raise SystemExit(f"unknown variant {variant!r}")
    return Setup(params, batch, rounds, loop, extra, step_s, unit_s, loop_s, data_s)


def calibrate(run: Setup) -> tuple[float, float, float]:
    """The step and one unit of each change (ms), over spans long enough that a loaded
    machine's timer noise does not swamp them (setup's 16 units came out negative)."""

    def per_unit(fn, span: int) -> float:  # type: ignore[no-untyped-def]
        return (timed(lambda: fn(1 + span)) - timed(lambda: fn(1))) / span

    loop_s = per_unit(lambda n: jax.block_until_ready(extra_work(run.params, jnp.int32(n))), 400)
    data_s = per_unit(lambda n: load_batch(0, run.batch, n), 40)
    return 1e3 * run.step_s, 1e3 * loop_s, 1e3 * data_s


def main() -> None:
    out, variant, k_pct = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    run = setup(variant, k_pct, int(sys.argv[4]) if len(sys.argv) > 4 else None)
    if variant == "calibrate":  # no capture: the units' costs, for a caller to fix sizes
        step_ms, loop_ms, data_ms = calibrate(run)
        print(f"CALIBRATED {step_ms:.3f} {loop_ms:.4f} {data_ms:.4f}")
        return
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 0
    traced = []
    with jax.profiler.trace(str(out), profiler_options=options):
        for step in range(STEPS):
            started = time.perf_counter()
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                run.step(step)
            traced.append(time.perf_counter() - started)
    (path,) = out.glob("plugins/profile/*/*.xplane.pb")
    # The change's own units (UNITS above; 0 unchanged): what a later process repeats.
    iterations = {
        "added": run.extra,
        "slower_op": run.loop - LOOP_BASE,
        "input": run.rounds - DATA_BASE,
    }.get(variant, 0)
    print(
        f"DONE {path} {1e3 * run.step_s:.3f} {1e3 * run.unit_s:.3f} {iterations} "
        f"{1e3 * float(np.median(traced)):.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
