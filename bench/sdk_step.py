"""SDK per-step overhead: `with run.step()` against an empty context manager, same run.

Prints microseconds per step (median of repeats) and the ratio to the reference.
Target: a few microseconds per step.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable

from exporter import sdk


def per_call_us(body: Callable[[int], None], n: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        body(n)
        samples.append((time.perf_counter() - t0) / n * 1e6)
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


if __name__ == "__main__":
    main()
