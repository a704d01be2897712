"""Fan-out capture: wall time over N profiler servers vs the capture duration.

Starts N small JAX processes with profiler servers on loopback, then measures:

* fan-out wall time of one session over all N targets (submit -> session finished)
  against the capture duration (goal: duration + under 1 s), with a single-target
  session of the same duration as the reference measured in this run;
* the latency from ``POST /api/v1/captures`` (the real app under uvicorn) to the
  profiler client's trace call starting, and to the 202 answer.

    .venv/bin/python bench/capture_fanout.py            # 8 targets, 0.5/1/2 s, 3 rounds
    .venv/bin/python bench/capture_fanout.py --quick    # 4 targets, 0.5 s, 1 round
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.api.app import create_app  # noqa: E402
from exporter.capture.client import XprofClient  # noqa: E402
from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRequest  # noqa: E402
from exporter.capture.store import SessionStore  # noqa: E402
from exporter.capture.targets import ProfilerTarget, probe  # noqa: E402
from exporter.config import load_settings  # noqa: E402
from exporter.sidecar import Sidecar  # noqa: E402
from tests.harness import free_port, wait_until  # noqa: E402

# A light workload: a small jitted matmul every 20 ms, so traces have events but the
# N processes leave the cores to the capture path being measured.
SERVER = """
import sys, time, jax, jax.numpy as jnp, jax.profiler
jax.profiler.start_server(int(sys.argv[1]))
f = jax.jit(lambda x: jnp.tanh(x @ x))
x = jnp.ones((64, 64))
print("ready", flush=True)
while True:
    f(x).block_until_ready()
    time.sleep(0.02)
"""


class TimedClient(XprofClient):
    """XProf's client, noting when each trace call begins (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: dict[str, float] = {}

    def trace(
        self, address: str, logdir: str, duration_ms: int, options: Mapping[str, Any]
    ) -> None:
        self.starts[str(options["session_id"]) + "@" + address] = time.monotonic()
        super().trace(address, logdir, duration_ms, options)


def start_servers(count: int, tmp: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, addresses = [], []
    for index in range(count):
        port = free_port()
        log = (tmp / f"server{index}.log").open("wb")
        procs.append(
            subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=log, stderr=log)
        )
        addresses.append(f"127.0.0.1:{port}")
    for address in addresses:
        wait_until(lambda a=address: not probe(a), timeout=180, what=f"profiler server {address}")
    time.sleep(2.0)  # past JIT compilation
    return procs, addresses


def session_wall(engine: CaptureEngine, targets: list[ProfilerTarget], duration_ms: int) -> float:
    began = time.monotonic()
    record = engine.submit(CaptureRequest(duration_ms=duration_ms, host_tracer_level=1), targets)
    final = engine.wait(record.id, timeout=120)
    wall = time.monotonic() - began
    if final is None or final.status != "done":
        bad = [(t.address, t.status, t.error) for t in final.targets] if final else []
        raise SystemExit(f"session {record.id} did not finish done: {bad}")
    return wall


def api_latency(url: str, client: TimedClient, addresses: list[str]) -> tuple[float, float]:
    body = {"targets": addresses, "duration_ms": 200, "host_tracer_level": 1}
    began = time.monotonic()
    response = httpx.post(f"{url}/api/v1/captures", json=body, timeout=30)
    answered = time.monotonic() - began
    response.raise_for_status()
    session_id = response.json()["session_id"]
    key = f"{session_id}@{addresses[0]}"
    wait_until(lambda: key in client.starts, timeout=30, interval=0.005, what="trace start")
    wait_until(
        lambda: httpx.get(f"{url}/api/v1/captures/{session_id}").json()["status"] != "running",
        timeout=60,
        what="API session end",
    )
    return client.starts[key] - began, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--durations", default="500,1000,2000", help="ms, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 targets, 500 ms, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.targets, args.durations, args.rounds = 4, "500", 1
    durations = [int(d) for d in args.durations.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench-capture-") as tmp_text:
        tmp = Path(tmp_text)
        print(f"starting {args.targets} JAX profiler servers ...", flush=True)
        procs, addresses = start_servers(args.targets, tmp)
        targets = [ProfilerTarget(a, f"h{i}", None, "static") for i, a in enumerate(addresses)]
        try:
            store = SessionStore(str(tmp / "store"))
            limits = CaptureLimits(concurrency=max(16, args.targets), retention_count=0)
            engine = CaptureEngine(store, tmp / "captures", limits, TimedClient())
            session_wall(engine, targets[:1], 200)  # warm the client library
            print(f"\n{'duration':>9} {'1 target':>10} {f'{args.targets} targets':>11} "
                  f"{'overhead':>9} {'fan-out/1':>10} {'goal <1s':>9}")  # fmt: skip
            for duration_ms in durations:
                single = statistics.median(
                    session_wall(engine, targets[:1], duration_ms) for _ in range(args.rounds)
                )
                fan = statistics.median(
                    session_wall(engine, targets, duration_ms) for _ in range(args.rounds)
                )
                overhead = fan - duration_ms / 1000
                print(
                    f"{duration_ms / 1000:>8.1f}s {single:>9.2f}s {fan:>10.2f}s "
                    f"{overhead:>8.2f}s {fan / single:>9.2f}x {'yes' if overhead < 1 else 'NO':>9}"
                )
            engine.close()

            client = TimedClient()
            port = free_port()
            settings = load_settings(
                listen=f"127.0.0.1:{port}",
                shared_dir=str(tmp / "shared"),
                store=str(tmp / "api-store"),
                targets=addresses,
            )
            sidecar = Sidecar(settings)
            sidecar.captures._client = client
            server = uvicorn.Server(
                uvicorn.Config(create_app(sidecar), port=port, log_level="warning")
            )
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: httpx.get(f"{url}/healthz").is_success, what="sidecar")
            samples = [api_latency(url, client, addresses) for _ in range(max(3, args.rounds * 3))]
            server.should_exit = True
            thread.join(10)
            to_start = statistics.median(s for s, _ in samples)
            to_202 = statistics.median(a for _, a in samples)
            print(
                f"\nAPI call -> first trace call started: {to_start * 1000:.1f} ms median "
                f"(202 answered after {to_202 * 1000:.1f} ms; {len(samples)} calls, "
                f"{args.targets} targets each)"
            )
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)


if __name__ == "__main__":
    main()
