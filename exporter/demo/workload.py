"""Demo workload: an MLP trained on synthetic data, instrumented with ``exporter.sdk``.

The input pipeline sleeps for the number of seconds written in
``<shared_dir>/demo-input-delay`` before each step (re-read while running), so an SRE can
make the run input-bound on purpose: the wait falls between steps, as in a real loop, so
the step time stays while the input wait (``train_step_wait_seconds``,
``train_input_wait_share``) rises and the duty cycle falls::

    echo 0.2 > mlprof-data/shared/demo-input-delay   # slow input pipeline
    rm mlprof-data/shared/demo-input-delay           # back to full speed

``<shared_dir>/demo-profile`` asks for a trace taken in the workload itself
(``run.profile``, no profiler client needed): the next N steps (the number in the file,
default 5) are traced and the file is removed; the sidecar stores the session::

    echo 5 > mlprof-data/shared/demo-profile
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from exporter import schema, sdk
from exporter.regular_files import read_regular

__all__ = ["PROFILE_FILE", "InputPipeline", "main", "profile_request"]


class InputPipeline:
    """Synthetic batches, delayed by the value in the knob file (checked by mtime)."""

    def __init__(self, knob: Path, batch: int, features: int, classes: int, seed: int) -> None:
        import jax

        self.knob = knob
        self.delay_s = 0.0
        self._mtime: float | None = None
        self._key = jax.random.PRNGKey(seed)
        self._shape = (batch, features)
        self._classes = classes

    def _refresh_delay(self) -> None:
        try:
            mtime = self.knob.stat().st_mtime
        except FileNotFoundError:
            self.delay_s, self._mtime = 0.0, None
            return
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self.delay_s = max(0.0, float(_knob_text(self.knob) or 0))
            except (OSError, ValueError):
                print(
                    f"demo: {self.knob}: expected seconds as a number in a regular file; ignoring",
                    flush=True,
                )
                self.delay_s = 0.0
            print(f"demo: input pipeline delay now {self.delay_s:.3f}s", flush=True)

    def next(self) -> tuple[Any, Any]:
        import jax

        self._refresh_delay()
        if self.delay_s:
            time.sleep(self.delay_s)
        self._key, kx, ky = jax.random.split(self._key, 3)
        x = jax.random.normal(kx, self._shape)
        y = jax.random.randint(ky, (self._shape[0],), 0, self._classes)
        return x, y


# In the shared dir: "trace the next N steps with run.profile" (see the module doc).
PROFILE_FILE = "demo-profile"
PROFILE_STEPS = 5


# A knob holds one number: anything longer is no knob.
MAX_KNOB_BYTES = 64


def _knob_text(knob: Path) -> str:
    """A knob file's text: a regular file of a few bytes, never a link, and never a
    blocking open (a FIFO under the knob's name would stop the step loop)."""
    return read_regular(knob, MAX_KNOB_BYTES).decode("utf-8", "replace").strip()


def profile_request(knob: Path) -> int:
    """The steps the knob file asks to trace (it is removed once read); 0 when none."""
    text: str | None
    try:
        text = _knob_text(knob)
    except FileNotFoundError:  # no request (the usual case: one open per step)
        return 0
    except OSError as exc:  # a link, a FIFO, a huge file: no request, and it is taken
        print(f"demo: {knob}: {exc}; ignored", flush=True)
        text = None
    knob.unlink(missing_ok=True)
    if text is None:
        return 0
    try:
        return min(max(1, int(text or PROFILE_STEPS)), 1000)
    except ValueError:
        print(f"demo: {knob}: expected a number of steps; tracing {PROFILE_STEPS}", flush=True)
        return PROFILE_STEPS


def build_model(features: int, hidden: int, classes: int, seed: int) -> tuple[Any, Any]:
    """Parameters and a jitted SGD update for a 2-hidden-layer MLP."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    sizes = [(features, hidden), (hidden, hidden), (hidden, classes)]
    params = [
        (jax.random.normal(k, shape) / jnp.sqrt(shape[0]), jnp.zeros(shape[1]))
        for k, shape in zip(keys, sizes, strict=True)
    ]

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        h = x
        for i, (w, b) in enumerate(params):
            with jax.named_scope(f"layer{i}"):
                h = h @ w + b
                if i < len(params) - 1:
                    h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def update(params: Any, x: Any, y: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
        return new, loss

    return params, update


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mlprof-demo-workload", description=__doc__)
    parser.add_argument(
        "--shared-dir", default=os.environ.get("MLPROF_SHARED_DIR", "./mlprof-data/shared")
    )
    parser.add_argument("--name", default="demo-mlp")
    parser.add_argument("--steps", type=int, default=0, help="0 = until stopped")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--profiler-port", type=int, default=9999, help="0 = no profiler server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help="one device's peak FLOP/s for MFU (default: the SDK's chip table; CPU has none)",
    )
    args = parser.parse_args(argv)

    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    import jax  # imported before sdk.run so that run.json records the backend
    import jax.profiler

    shared = Path(args.shared_dir)
    params, update = build_model(args.features, args.hidden, args.classes, args.seed)
    pipeline = InputPipeline(
        shared / schema.DEMO_INPUT_DELAY_FILE, args.batch, args.features, args.classes, args.seed
    )
    configs = {k: v for k, v in vars(args).items() if k not in ("shared_dir",)}
    with sdk.run(
        name=args.name,
        shared_dir=shared,
        configs=configs,
        profiler_port=args.profiler_port or None,
        peak_flops=args.peak_flops,
    ) as run:
        print(f"demo: run {run.run_id} on {run.host}, step log in {shared}", flush=True)
        # FLOPs per step from XLA's cost analysis of the compiled step: MFU needs no count.
        x, y = pipeline.next()
        run.step_function(update, params, x, y)
        step = 0
        tracing = contextlib.ExitStack()  # a run.profile asked for by PROFILE_FILE
        traced_until = 0
        while not stop and (args.steps == 0 or step < args.steps):
            if step >= traced_until and (wanted := profile_request(shared / PROFILE_FILE)):
                tracing.enter_context(run.profile("demo"))
                traced_until = step + wanted
            # A named phase, as tf.data and grain trace theirs: captures show the input
            # pipeline as a frame, reports tell its wait from other host work, and the
            # host profiler tags its samples phase="data".
            with run.phase("data"), jax.profiler.TraceAnnotation("input_pipeline"):
                x, y = pipeline.next()
            with (
                run.step(tokens=args.batch),
                jax.profiler.StepTraceAnnotation("train", step_num=step),
            ):
                params, loss = update(params, x, y)
                loss.block_until_ready()
            run.record("loss", float(loss))
            step += 1
            if step == traced_until:
                tracing.close()
        tracing.close()
        print(f"demo: stopped after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
