"""A small JAX workload for the profile tests: SDK run, a traced step, memory profiles.

Usage: python jax_profile_workload.py SHARED_DIR LOGDIR STOP_FILE
Prints ``READY <memory-profile-path> <live-bytes>`` once the capture and the first
memory profile are written, then keeps running (answering memory-profile requests)
until STOP_FILE exists.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from exporter import sdk


class Model:
    def __init__(self) -> None:
        self.weights = jnp.ones((128, 128), jnp.float32)

    def forward(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ self.weights).sum()


def train_step(model: Model, x: jax.Array, step: int) -> float:
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
        return float(model.forward(x).block_until_ready())


def main() -> None:
    shared, logdir, stop = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    model = Model()
    x = jnp.ones((64, 128), jnp.float32)
    with sdk.run(name="profile-test", shared_dir=shared, run_id="run-jax", host="host-a") as run:
        train_step(model, x, 0)  # compile outside the trace
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1
        options.host_tracer_level = 2
        with jax.profiler.trace(str(logdir), profiler_options=options):
            for step in range(1, 4):
                with run.step():
                    train_step(model, x, step)
        path = run.memory_profile()
        live = sum(a.nbytes for a in jax.live_arrays())
        print(f"READY {path} {live}", flush=True)
        deadline = time.monotonic() + 120
        while not stop.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


if __name__ == "__main__":
    main()
