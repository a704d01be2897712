"""Benchmark: clients trickling request bodies against a served sidecar (issue 31, 4 and 7).

Starts the sidecar (``create_app`` under uvicorn with ``mlprof serve``'s protocol) in a
child process, from this checkout or from ``--code-root`` (another checkout, to measure
the code before a change in the same run), then:

1. reference: /metrics scrape latency with no other client, one scrape a second;
2. flood: ``--connections`` clients each send a webhook POST's headers and then one
   byte of its body every 3 s, while /metrics is scraped once a second: the scrapes'
   worst and median latency, and how many were answered, against the reference;
3. uploads: 8 clients trickle profile uploads (as many as the upload pool admitted
   before a slot was taken once the body is in) while a genuine upload is sent once a
   second: how many were accepted, and how long the trickling clients were held.

Wall times on a shared machine move with its load: read the ratios to the reference.

    .venv/bin/python bench/slow_bodies.py [--quick] [--connections 2000] [--code-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRICKLE_EVERY_S = 3.0
UPLOAD_CLIENTS = 8
_SERVER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from typing import Any
from tests.sidecar_app import ServedSidecar, settings_in
settings = settings_in(Path({tmp!r}), pyroscope_url="http://127.0.0.1:9")
with ServedSidecar(settings) as served:
    print(served.url, flush=True)
    time.sleep(3600)
"""


class Sidecar:
    """The served sidecar in a child process (its log discarded: one line per client)."""

    def __init__(self, code_root: Path) -> None:
        tmp = tempfile.mkdtemp(prefix="slow-bodies-")
        code = _SERVER.format(root=str(code_root), tmp=tmp)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, cwd=code_root,
        )  # fmt: skip
        assert self.proc.stdout is not None
        url = self.proc.stdout.readline().strip()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def _trickle(side: Sidecar, path: str, stop: asyncio.Event) -> str:
    """Headers, then a byte every TRICKLE_EVERY_S until stopped or closed by the server."""
    try:
        reader, writer = await asyncio.open_connection(side.host, side.port)
    except OSError:
        return "refused"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {side.host}:{side.port}\r\n"
        "Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
    )
    writer.write(head.encode())
    began = time.monotonic()
    try:
        while not stop.is_set():
            writer.write(b"x")
            await writer.drain()
            try:
                await asyncio.wait_for(reader.read(1), TRICKLE_EVERY_S)
                return f"closed {time.monotonic() - began:.0f}"
            except TimeoutError:
                continue
    except OSError:
        return f"closed {time.monotonic() - began:.0f}"
    finally:
        writer.close()
    return "held"


async def _request(side: Sidecar, what: str) -> tuple[str, float]:
    began = time.monotonic()
    reader, writer = await asyncio.open_connection(side.host, side.port)
    if what == "scrape":
        head = (
            f"GET /metrics HTTP/1.1\r\nHost: {side.host}:{side.port}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode())
    else:
        body = b"a;b 1\n"
        head = (
            f"POST /ingest?name=a&format=folded HTTP/1.1\r\nHost: {side.host}:{side.port}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer.split(b"\r\n", 1)[0].decode(errors="replace"), time.monotonic() - began


async def _probe(
    side: Sidecar, what: str, clients: int, path: str, window_s: float
) -> dict[str, Any]:
    stop = asyncio.Event()
    tricklers = [asyncio.create_task(_trickle(side, path, stop)) for _ in range(clients)]
    await asyncio.sleep(1.0 if clients else 0.0)
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        status, took = await _request(side, what)
        statuses[status] += 1
        latencies.append(took)
        await asyncio.sleep(1.0)
    stop.set()
    outcomes = await asyncio.gather(*tricklers)
    closed = [float(o.split()[1]) for o in outcomes if o.startswith("closed")]
    return {
        "statuses": dict(statuses),
        "worst_s": max(latencies),
        "median_s": statistics.median(latencies),
        "held": sum(o == "held" for o in outcomes),
        "closed": len(closed),
        "closed_after_s": statistics.median(closed) if closed else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 clients, 10 s windows")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--code-root", type=Path, default=ROOT,
                        help="checkout whose sidecar to run (default: this one)")  # fmt: skip
    args = parser.parse_args()
    clients = 200 if args.quick else args.connections
    window = 10.0 if args.quick else args.window_s
    side = Sidecar(args.code_root.resolve())
    try:
        ref = asyncio.run(_probe(side, "scrape", 0, "/", min(window, 10.0)))
        flood = asyncio.run(_probe(side, "scrape", clients, "/api/v1/alertmanager", window))
        uploads = asyncio.run(
            _probe(side, "upload", UPLOAD_CLIENTS, "/ingest?name=a&format=folded", window)
        )
    finally:
        side.close()
    print(f"sidecar code: {args.code_root.resolve()}")
    print(
        f"/metrics alone (reference):   median {ref['median_s']:.3f}s, worst {ref['worst_s']:.3f}s"
    )
    print(
        f"/metrics, {clients} trickling webhook clients: median {flood['median_s']:.3f}s "
        f"({flood['median_s'] / ref['median_s']:.1f}x reference), worst {flood['worst_s']:.2f}s, "
        f"answered {flood['statuses']}; clients closed by the server {flood['closed']} "
        f"(median after {flood['closed_after_s']}s), still held {flood['held']}"
    )
    print(
        f"uploads beside {UPLOAD_CLIENTS} trickling ones: {uploads['statuses']}; trickling "
        f"clients closed {uploads['closed']} (median after {uploads['closed_after_s']}s), "
        f"still held {uploads['held']}"
    )


if __name__ == "__main__":
    main()
