"""A JAX training-like step on 4 forced CPU devices, a known share of it in collectives.

Usage: python communication_workload.py OUT_DIR SHARE_PCT [STEPS]

XLA's CPU client runs each of the 4 devices that
``--xla_force_host_platform_device_count=4`` makes on its own threads, and ``lax.psum``
under ``shard_map`` lowers to a real all-reduce between them (the threads meet in a
rendezvous and reduce each other's buffers), which the capture holds as ``psum.N`` ops
on the ``tf_XLAPjRtCpuClient`` threads. Each step (in ``StepTraceAnnotation("train")``)
runs, per device, ``n_mm`` iterations of a matmul (the compute) and then, data-dependent
on it, ``n_comm`` all-reduces of :data:`CHUNK` floats (the communication), in one jitted
program.

The workload calibrates itself before the trace, so the true share is known from outside
the capture: it times one matmul iteration and one all-reduce (each the slope of a
program with 17 against 1 of them), sets ``n_comm`` and ``n_mm`` so that the
collectives are ``SHARE_PCT`` % of a :data:`STEP_MS` step, then times the programs it
will trace: the step, its collectives alone and its compute alone (each program less
an empty one: dispatch is in neither part). ``SHARE_PCT`` 0 means one all-reduce of 8
floats a step (a step with almost no communication, as a single-device loop's gradient
sync of a scalar). It prints::

    DONE <path> <step_ms> <comm_alone_ms> <compute_alone_ms> <n_comm> <n_mm> <traced_step_ms>

``comm_alone_ms / step_ms`` is the reference share; ``traced_step_ms`` the median wall
clock step inside the trace (``time.perf_counter``), to tell a busy machine's slow
process from a product error.
"""

from __future__ import annotations

import os
import sys

# Before jax is imported: the CPU backend reads it once.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

DEVICES = 4
STEPS = 40
STEP_MS = 16.0  # the step the shares are set against (~0.7 s of capture)
WIDTH = 128  # the compute: a WIDTH x WIDTH matmul per iteration per device
CHUNK = 64 * 1024  # floats per all-reduce (256 KiB per device)
TINY = 8  # SHARE_PCT 0: one all-reduce of this many floats

Step = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def program(mesh: Mesh, n_mm: int, n_comm: int) -> Step:
    """One jitted step: n_mm matmuls, then n_comm all-reduces of what they made."""

    # check_vma=False: psum's result is replicated while the loop carry is per device;
    # the loop only needs the values, not JAX's replication tracking.
    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P("d"), P("d")),
        out_specs=(P("d"), P("d")),
        check_vma=False,
    )
    def step(a: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jax.lax.fori_loop(0, n_mm, lambda _, x: jnp.tanh(x @ x), a[0])
        # Data-dependent on the compute: the collectives cannot start before it ends.
        g = g + 1e-9 * x[0, 0]
        # Nothing but the all-reduce in the loop (its sum overflows to inf after ~60:
        # harmless, inf costs what a number costs; a rescaling op would be compute).
        g = jax.lax.fori_loop(0, n_comm, lambda _, y: jax.lax.psum(y, "d"), g)
        return x[None], g

    return step  # type: ignore[no-any-return]


def timed(fn: Callable[[], object], repeats: int = 9) -> float:
    """Median seconds of ``fn`` (compiled before: the first call is not timed)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def main() -> None:
    out, share = Path(sys.argv[1]), float(sys.argv[2]) / 100
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else STEPS
    devices = jax.devices()
    assert len(devices) == DEVICES, f"expected {DEVICES} forced CPU devices, got {devices}"
    mesh = Mesh(np.array(devices), ("d",))
    a = jnp.full((DEVICES, WIDTH, WIDTH), 0.01, jnp.float32)
    chunk = CHUNK if share > 0 else TINY
    g = jnp.ones((DEVICES, chunk), jnp.float32)

    def run(n_mm: int, n_comm: int) -> Callable[[], object]:
        step = program(mesh, n_mm, n_comm)
        return lambda: step(a, g)

    # Units: the slope of 17 against 1 (the program's fixed cost cancels).
    mm_s = (timed(run(17, 0)) - timed(run(1, 0))) / 16
    comm_s = (timed(run(0, 17)) - timed(run(0, 1))) / 16
    n_comm = max(1, round(share * STEP_MS / 1e3 / comm_s)) if share > 0 else 1
    n_mm = max(1, round((1 - share) * STEP_MS / 1e3 / mm_s))
    empty_s = timed(run(0, 0))
    step_s = timed(run(n_mm, n_comm))
    comm_alone_s = max(0.0, timed(run(0, n_comm)) - empty_s)
    compute_alone_s = max(0.0, timed(run(n_mm, 0)) - empty_s)

    step = program(mesh, n_mm, n_comm)
    # Twice: the first call's outputs are committed to the mesh, the inputs were not,
    # and the second call compiles for those (not inside the trace).
    a, g = jax.block_until_ready(step(*step(a, g)))
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 0
    traced = []
    with jax.profiler.trace(str(out), profiler_options=options):
        for i in range(steps):
            started = time.perf_counter()
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                a, g = jax.block_until_ready(step(a, g))
            traced.append(time.perf_counter() - started)
    (path,) = out.glob("plugins/profile/*/*.xplane.pb")
    print(
        f"DONE {path} {1e3 * step_s:.3f} {1e3 * comm_alone_s:.3f} {1e3 * compute_alone_s:.3f} "
        f"{n_comm} {n_mm} {1e3 * float(np.median(traced)):.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
