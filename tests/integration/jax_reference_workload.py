"""A JAX (CPU) workload shaped for the reference tests; writes one capture and one
device-memory profile, then exits.

Usage: python jax_reference_workload.py OUT_DIR

It has what the flame-graph readers must get right: a function ``make`` defined in two
files (same name, different file and line), two Python threads both named ``python``,
step annotations, a jitted ``fori_loop`` (a ``while`` with its body), and TraceMes
nested in TraceMes of the same name (``PjitFunction(...)``).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp

SOURCES = {
    "alloc_a.py": "import jax.numpy as jnp\n\n\ndef make(n):\n    return jnp.ones((n, 128))\n",
    "alloc_b.py": "import jax.numpy as jnp\n\n\n\n\ndef make(n):\n    return jnp.zeros((n, 64))\n",
}


@jax.jit
def loop(x: jax.Array) -> jax.Array:
    return jax.lax.fori_loop(0, 3, lambda i, a: jnp.tanh(a @ a.T @ a), x)


def step(x: jax.Array, number: int) -> float:
    with jax.profiler.StepTraceAnnotation("train", step_num=number):
        return float(loop(x).sum())


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in SOURCES.items():
        (out / name).write_text(text)
    sys.path.insert(0, str(out))
    import alloc_a  # type: ignore[import-not-found]
    import alloc_b  # type: ignore[import-not-found]

    x = jnp.ones((32, 32), jnp.float32)
    step(x, 0)  # compile outside the trace
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1
    options.host_tracer_level = 2
    with jax.profiler.trace(str(out / "logs"), profiler_options=options):
        for number in (1, 2):
            step(x, number)
        # Alive together, so their ids differ (one name, two threads): neither ends before
        # both have stepped. Python's threads are detached, so an ended thread's id can be
        # the next one's, which a loaded machine made happen when the first ended early.
        together = threading.Barrier(2, timeout=60)

        def worker(number: int) -> None:
            together.wait()
            step(x, number)
            together.wait()

        workers = [threading.Thread(target=worker, args=(10 + i,), name="python") for i in range(2)]
        for worker_thread in workers:
            worker_thread.start()
        for worker_thread in workers:
            worker_thread.join()
    kept = [alloc_a.make(256), alloc_b.make(128), alloc_b.make(64)]
    jax.profiler.save_device_memory_profile(str(out / "memory.prof"))
    print("READY", sum(a.nbytes for a in kept), flush=True)


if __name__ == "__main__":
    main()
