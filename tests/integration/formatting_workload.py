"""A jitted step whose matmuls are joined by a layout change XLA cannot fuse away.

``python tests/integration/formatting_workload.py OUT`` captures twenty steps of
``layout`` into OUT and prints ``DONE formatting <xplane.pb>``. On CPU the block
transpose between the two matmuls runs as its own copy fusion, between the first
matmul's fusion (its producer) and the second's (its consumer): what the data-formatting
finding names.

The matmuls are thin (a 32-wide contraction, then a 32-wide output) so that the copy of
the 512 x 512 matrix is most of the step's work by construction: about half of the XLA
time, idle or at load 9. With two square 512 x 512 matmuls the copy was about a third
when idle (28.5 % before the executor's waits were counted once), but 9.4-21 % at load
8-13 (the matmuls, split over pool threads, lose more time to a busy machine than the
single-threaded copy), under the finding's 10 %.
Twenty steps, not five, so that a few preempted ops do not decide the shares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

STEPS = 20
THIN = 32  # the matmuls' inner (first) and outer (second) width


@jax.jit
def layout(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    h = jnp.sin(a @ b)  # (512, THIN) @ (THIN, 512): a 512 x 512 result, cheaply
    t = jnp.transpose(h.reshape(64, 8, 64, 8), (0, 2, 1, 3)).reshape(512, 512)
    return jnp.tanh(t @ c)  # (512, 512) @ (512, THIN)


def main(out: Path) -> None:
    a = jnp.ones((512, THIN), jnp.float32) / 512
    b = jnp.ones((THIN, 512), jnp.float32) / 512
    c = jnp.ones((512, THIN), jnp.float32) / 512
    layout(a, b, c).block_until_ready()  # compiled before the capture
    jax.profiler.start_trace(str(out))
    for step in range(STEPS):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            layout(a, b, c).block_until_ready()
    jax.profiler.stop_trace()
    print("DONE formatting", next(out.rglob("*.xplane.pb")), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
