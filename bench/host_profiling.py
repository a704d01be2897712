"""Benchmark: CPU cost of host profiling on the demo workload (A/B, same machine, same run).

Runs the demo's model and input pipeline (``exporter.demo.workload``) in child processes,
alternating A (the SDK as before: steps timed, ``run.phase("data")`` a no-op) and B
(``host_profiling`` on: pyroscope-io sampling at 100 Hz, every step and data phase
tagged, profiles pushed every second to a local endpoint that accepts them). Each child
measures its own CPU time (all threads, the agent's sampler included) over the steps
after a warm-up. Prints CPU per step for A and B and B's extra cost; target <= 2 %.

    .venv/bin/python bench/host_profiling.py            # 3 pairs x 300 steps
    .venv/bin/python bench/host_profiling.py --quick    # 1 pair x 30 steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TARGET_OVERHEAD = 0.02  # extra CPU per step with host profiling (issue 13)
WARMUP_STEPS = 10


def child(profiled: bool, steps: int, url: str) -> None:
    """One workload process: warm up, then time ``steps`` steps; print JSON."""
    from exporter import schema, sdk
    from exporter.demo.workload import InputPipeline, build_model

    batch, features, hidden, classes = 512, 256, 1024, 10
    params, update = build_model(features, hidden, classes, seed=0)
    with tempfile.TemporaryDirectory() as shared:
        pipeline = InputPipeline(
            Path(shared) / schema.DEMO_INPUT_DELAY_FILE, batch, features, classes, seed=0
        )
        options = sdk.HostProfiling(server_address=url, upload_interval_s=1) if profiled else False
        with sdk.run("bench-demo", shared_dir=shared, host_profiling=options) as run:
            for step in range(WARMUP_STEPS + steps):
                if step == WARMUP_STEPS:
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                with run.phase("data"):
                    x, y = pipeline.next()
                with run.step(tokens=batch):
                    params, loss = update(params, x, y)
                    loss.block_until_ready()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "steps": steps}))


class _Accept(BaseHTTPRequestHandler):
    """Takes a push and answers an empty PushResponse, as Pyroscope does."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()


def run_child(profiled: bool, steps: int, url: str) -> dict[str, float]:
    args = [sys.executable, __file__, "--child", "B" if profiled else "A"]
    args += ["--steps", str(steps), "--url", url]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"workload child failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short pair")
    parser.add_argument("--child", choices=["A", "B"], help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child == "B", args.steps, args.url)
        return
    pairs, steps = (1, 30) if args.quick else (3, 300)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    plain: list[float] = []
    profiled: list[float] = []
    try:
        for _ in range(pairs):  # alternate, so load drifts on a shared machine hit both
            a = run_child(False, steps, url)
            b = run_child(True, steps, url)
            plain.append(a["cpu_s"] / a["steps"] * 1e3)
            profiled.append(b["cpu_s"] / b["steps"] * 1e3)
    finally:
        server.shutdown()
    a_ms, b_ms = statistics.median(plain), statistics.median(profiled)
    extra = b_ms / a_ms - 1
    verdict = "within" if extra <= TARGET_OVERHEAD else "OVER"
    print(f"demo workload, {pairs} A/B pairs x {steps} steps (CPU time of the process):")
    print(f"  A  SDK, no host profiling:       {a_ms:8.3f} ms CPU/step  {plain}")
    print(f"  B  host profiling, 100 Hz:       {b_ms:8.3f} ms CPU/step  {profiled}")
    print(f"  B/A: {b_ms / a_ms:.4f}  ({extra:+.2%}; {verdict} the {TARGET_OVERHEAD:.0%} target)")


if __name__ == "__main__":
    main()
