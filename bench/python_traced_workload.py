"""A real JAX CPU capture with the Python tracer on: ~47,000 host events at 160 steps.

Usage: python bench/python_traced_workload.py OUT_DIR [STEPS]

Steps of a jitted MLP update (``StepTraceAnnotation("train", step_num=N)``), each making
its batch in a ``data_loading`` annotation, traced with ``host_tracer_level=2`` and
``python_tracer_level=1``: every Python call becomes a host event (about 290 a step), as
a user's capture with the Python tracer on has. Prints ``DONE <path>``. Used by
``bench/convert.py --real`` (the host flame graph CLI against XProf's ``trace_viewer``)
and ``bench/compare_read.py`` (a comparison's per-capture read).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

STEPS = 160  # ~47k events: the size the figure was measured on


@jax.jit
def update(w: jax.Array, x: jax.Array) -> jax.Array:
    h = x
    for _ in range(4):
        h = jnp.tanh(h @ w)
    return w - 1e-3 * (x.T @ h) / x.shape[0]


def data_loading(step: int) -> jax.Array:
    with jax.profiler.TraceAnnotation("data_loading"):
        return jnp.full((256, 256), step % 7, jnp.float32)


def main() -> None:
    out = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else STEPS
    w = jnp.eye(256, dtype=jnp.float32)
    update(w, data_loading(0)).block_until_ready()  # compile outside the trace
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 1
    with jax.profiler.trace(str(out), profiler_options=options):
        for step in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                w = update(w, data_loading(step))
                w.block_until_ready()
    (path,) = out.glob("plugins/profile/*/*.xplane.pb")
    print(f"DONE {path}", flush=True)


if __name__ == "__main__":
    main()
