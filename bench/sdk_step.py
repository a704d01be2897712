"""SDK per-step overhead: `with run.step()` against an empty context manager, same run.

Prints microseconds per step (median of repeats) and the ratio to the reference.
Target: a few microseconds per step.

With host profiling on, every step also sets and clears the pyroscope agent's
``phase`` tag. A/B in one process: blocks alternate between the agent stopped (A, the
plain step) and running with tagging (B, pushing to a closed port); the tagged step's
overhead must stay within 2x the plain one's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable

from exporter import sdk

TAGGED_BUDGET = 2.0  # tagged step overhead as a multiple of the plain one (issue 13)


def per_call_us(
    body: Callable[[int], None],
    n: int,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    samples = []
    for _ in range(repeats):
        t0 = clock()
        body(n)
        samples.append((clock() - t0) / n * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    args = parser.parse_args()
    n, repeats = (20_000, 3) if args.quick else (200_000, 7)

    with tempfile.TemporaryDirectory() as shared, sdk.run("bench", shared_dir=shared) as run:
        null = contextlib.nullcontext()

        def reference(count: int) -> None:
            for _ in range(count):
                with null:
                    pass

        def step(count: int) -> None:
            for _ in range(count):
                with run.step(tokens=4096):
                    pass

        def record(count: int) -> None:
            for _ in range(count):
                run.record("loss", 0.5)

        ref = per_call_us(reference, n, repeats)
        stp = per_call_us(step, n, repeats)
        rec = per_call_us(record, n, repeats)
        run.flush()

    print(f"empty context manager (reference): {ref:.3f} us/step")
    print(f"run.step(tokens=...):              {stp:.3f} us/step  ({stp / ref:.1f}x reference)")
    print(f"run.record('loss', x):             {rec:.3f} us/call")
    print(f"SDK overhead per step:             {stp - ref:.3f} us")
    tagged_ab(n, repeats)


def tagged_ab(n: int, repeats: int) -> None:
    """Plain vs phase-tagged step, alternating blocks so that load drifts hit both.

    Timed with this thread's CPU clock: on a shared machine the wall clock also counts
    time the thread waited for a core. The agent's sampler thread is not counted here:
    bench/host_profiling.py measures the whole process.
    """
    clock = time.thread_time
    null = contextlib.nullcontext()
    closed = "http://127.0.0.1:9"  # discard port: pushes fail at once, sampling runs
    options = sdk.HostProfiling(server_address=closed)
    plain_over, tagged_over, phase_over = [], [], []
    with (
        tempfile.TemporaryDirectory() as shared_a,
        tempfile.TemporaryDirectory() as shared_b,
        sdk.run("bench-a", shared_dir=shared_a) as plain,
        sdk.run("bench-b", shared_dir=shared_b, host_profiling=options) as tagged,
    ):
        profiler = tagged.host_profiler
        assert profiler is not None

        def reference(count: int) -> None:
            for _ in range(count):
                with null:
                    pass

        def steps(run: sdk.Run) -> Callable[[int], None]:
            def body(count: int) -> None:
                for _ in range(count):
                    with run.step(tokens=4096):
                        pass

            return body

        def data_phase(count: int) -> None:
            for _ in range(count):
                with tagged.phase("data"):
                    pass

        for _ in range(repeats):
            profiler.stop()  # A: no agent in the process, as before host profiling
            ref = per_call_us(reference, n, 1, clock)
            plain_over.append(per_call_us(steps(plain), n, 1, clock) - ref)
            profiler.start()  # B: agent sampling, steps tagged phase="step"
            ref = per_call_us(reference, n, 1, clock)
            tagged_over.append(per_call_us(steps(tagged), n, 1, clock) - ref)
            phase_over.append(per_call_us(data_phase, n, 1, clock) - ref)
    a = statistics.median(plain_over)
    b = statistics.median(tagged_over)
    ratio = b / a if a > 0 else float("inf")
    verdict = "within" if ratio <= TAGGED_BUDGET else "OVER"
    print(f"A/B, {repeats} alternating blocks (thread CPU time):")
    print(f"  plain step overhead (A):         {a:.3f} us")
    print(f"  tagged step overhead (B):        {b:.3f} us  ({ratio:.2f}x A; {verdict} the "
          f"{TAGGED_BUDGET:.0f}x budget)")  # fmt: skip
    print(f"  run.phase('data') overhead:      {statistics.median(phase_over):.3f} us")


if __name__ == "__main__":
    main()
