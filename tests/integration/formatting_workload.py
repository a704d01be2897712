"""A jitted step whose matmuls are joined by a layout change XLA cannot fuse away.

``python tests/integration/formatting_workload.py OUT`` captures five steps of
``layout`` into OUT and prints ``DONE formatting <xplane.pb>``. On CPU the block
transpose between the two matmuls runs as its own copy fusion (about a third of the
device time), between the first matmul's fusion (its producer) and the second's (its
consumer): what the data-formatting finding names.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp


@jax.jit
def layout(a: jax.Array, b: jax.Array) -> jax.Array:
    h = jnp.sin(a @ b)
    t = jnp.transpose(h.reshape(64, 8, 64, 8), (0, 2, 1, 3)).reshape(512, 512)
    return jnp.tanh(t @ b)


def main(out: Path) -> None:
    a = jnp.ones((512, 512), jnp.float32) / 512
    layout(a, a).block_until_ready()  # compiled before the capture
    jax.profiler.start_trace(str(out))
    for step in range(5):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            layout(a, a).block_until_ready()
    jax.profiler.stop_trace()
    print("DONE formatting", next(out.rglob("*.xplane.pb")), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
