"""A short JAX training loop with host profiling on, for the host-profiling tests.

Two functions do Python work the sampler must see: ``prepare_batch`` inside
``run.phase("data")`` and ``step_bookkeeping`` inside ``run.step()``. With
``--fork-child`` a forked child spends its time in ``child_work`` (subprocess profiling).
Prints ``ready <run_id>`` once the loop runs; exits 0 after ``--seconds``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

from exporter import sdk


def prepare_batch(n: int) -> list[float]:
    """Python-side input work (tokenising, augmenting): on CPU, holding the GIL."""
    return [((i * 7919) % 1013) / 1013.0 for i in range(n)]


def step_bookkeeping(values: list[float]) -> float:
    """Python-side work inside the step (metrics, logging)."""
    return sum(v * v for v in values)


def child_work(seconds: float) -> None:
    """What a forked worker does (a DataLoader worker, say)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        prepare_batch(2000)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--shared-dir", required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--fork-child", action="store_true")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    @jax.jit
    def update(w: jax.Array, x: jax.Array) -> jax.Array:
        return w - 0.01 * jnp.tanh(x @ w)

    w = jnp.ones((64, 64))
    options = sdk.HostProfiling(upload_interval_s=1, subprocesses=args.fork_child)
    with sdk.run(args.name, shared_dir=args.shared_dir, host_profiling=options) as run:
        print(f"ready {run.run_id}", flush=True)
        child = None
        if args.fork_child:
            child = multiprocessing.get_context("fork").Process(
                target=child_work, args=(min(3.0, args.seconds),)
            )
            child.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            with run.phase("data"):
                values = prepare_batch(20_000)
                x = jnp.asarray(values[:4096]).reshape(64, 64)
            with run.step(tokens=4096):
                w = update(w, x)
                w.block_until_ready()
                step_bookkeeping(values)
        if child is not None:
            child.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
