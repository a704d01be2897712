"""A whole sidecar on a shared dir the workload booby-trapped (issue 22, attack round 3).

Planted before the sidecar starts: ``sidecar/runs-announced.json`` a FIFO (the start
hung), ``sidecar/.ingest.json.tmp`` a link to a file outside (it received the ingest
advertisement), ``runs/<id>.json`` of a run whose step log ends a FIFO (the step-log
tailer froze: every run's training metrics stopped and /readyz went 503), and a process
record with a NUL byte in ``host`` (its ValueError stopped discovery of every later run).

A FIFO is fed whenever some reader opens it (see :class:`FifoFeeder`): a sidecar that
opens one reads the fed record and shows it; one that skips FIFOs never sees it. No
assertion is on elapsed time; ``wait_until`` only waits for the sidecar's loops.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from exporter import schema
from exporter.api.app import create_app
from exporter.config import load_settings
from exporter.metrics.telemetry import build_telemetry
from exporter.sidecar import Sidecar
from exporter.sinks.events import LogEvents
from tests.harness import free_port, wait_until

pytestmark = pytest.mark.integration

TOKEN = "planted-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
VICTIM = b"the victim's own bytes\n"


class FifoFeeder:
    """Feeds ``payload`` then EOF to each FIFO whenever some reader has it open."""

    def __init__(self, fifos: dict[Path, bytes]) -> None:
        self.fifos = fifos
        self.fed: list[Path] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FifoFeeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            for fifo, payload in self.fifos.items():
                try:
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:  # no reader (ENXIO), or moved aside
                    if exc.errno not in (errno.ENXIO, errno.ENOENT):
                        raise
                    continue
                with contextlib.suppress(OSError):
                    os.write(fd, payload)
                os.close(fd)
                self.fed.append(fifo)


class _Lines(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            return super().write(text)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(line) for line in self.getvalue().splitlines()]


def _line(kind: str, run_id: str, host: str, **fields: Any) -> str:
    record = {"kind": kind, "run_id": run_id, "workload": "w", "host": host} | fields
    return json.dumps(record) + "\n"


def _steps(run_id: str, host: str, count: int, start: float) -> str:
    return "".join(
        _line("step", run_id, host, step=n, start=start + n, duration=0.5, wait=0.1, tokens=4)
        for n in range(count)
    )


def test_a_booby_trapped_shared_dir_neither_stops_the_sidecar_nor_reaches_outside(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(VICTIM)
    shared = tmp_path / "shared"
    for name in ("sidecar", "runs", "procs", "steps"):
        (shared / name).mkdir(parents=True)
    state = shared / "sidecar" / "runs-announced.json"
    os.mkfifo(state)
    (shared / "sidecar" / f".{schema.INGEST_FILE}.tmp").symlink_to(outside / "victim")
    os.mkfifo(shared / "runs" / "ended-run.json")
    now = time.time()
    bad = {"run_id": "nul", "name": "w", "host": "h\x00x", "pid": 11, "profiler_port": 9001,
           "start_unix": now}  # fmt: skip
    live = {"run_id": "live", "name": "w", "host": "h0", "pid": 12, "profiler_port": 9002,
            "start_unix": now}  # fmt: skip
    (shared / "procs" / "a-11.json").write_text(json.dumps(bad))
    (shared / "procs" / "h0-12.json").write_text(json.dumps(live))
    ended_log = shared / "steps" / "h0-11.jsonl"
    ended_log.write_text(
        _steps("ended-run", "h0", 3, now - 10) + _line("end", "ended-run", "h0", time=now - 5)
    )
    live_log = shared / "steps" / "h0-12.jsonl"
    live_log.write_text(_steps("live", "h0", 2, now - 2))

    settings = load_settings(
        shared_dir=str(shared),
        store=str(tmp_path / "store"),
        spool_dir=str(tmp_path / "spool"),
        auth_token=TOKEN,
        collect_interval_s=0.2,
        pyroscope_url=f"http://127.0.0.1:{free_port()}",  # on: the ingest URL is advertised
        sources="jax",
    )
    telemetry = build_telemetry()
    lines = _Lines()
    fed_state = json.dumps({"announced": ["live.json"]}).encode()
    fed_run = json.dumps({"run_id": "ended-run", "name": "w", "host": "h0",
                          "start_unix": now - 65}).encode()  # fmt: skip
    feeder = FifoFeeder({state: fed_state, shared / "runs" / "ended-run.json": fed_run})
    with feeder:
        sidecar = Sidecar(settings, telemetry, LogEvents(telemetry.meter, stream=lines))
        with TestClient(create_app(sidecar)) as client:
            ingest = shared / "sidecar" / schema.INGEST_FILE
            advertised = json.loads(ingest.read_bytes())
            assert advertised["url"].startswith("http://127.0.0.1:")
            assert (outside / "victim").read_bytes() == VICTIM

            def ended() -> dict[str, Any] | None:
                found = [e for e in lines.events() if e["type"] == "run_ended"]
                return found[0] if found else None

            event = wait_until(ended, timeout=30, what="run_ended of the run with a FIFO file")
            assert event["run_id"] == "ended-run" and event["data"]["steps"] == 3
            assert event["data"].get("duration_s") is None  # its FIFO run file was never read

            # The tailer went on after the end line: the live run's new steps count.
            with live_log.open("a") as log:
                log.write(_steps("live", "h0", 5, now)[len(_steps("live", "h0", 2, now)) :])

            def live_steps() -> bool:
                text = client.get("/metrics", headers=AUTH).text
                return any(
                    line.startswith("train_steps_total") and 'run_id="live"' in line
                    and line.endswith(" 5.0")
                    for line in text.splitlines()
                )  # fmt: skip

            wait_until(live_steps, timeout=30, what="the live run's fifth step in /metrics")
            assert client.get("/readyz").status_code == 200

            # The record with a NUL byte is skipped alone: the live process is a target.
            targets = client.get("/api/v1/targets", headers=AUTH).json()
            assert [t["run_id"] for t in targets["targets"]] == ["live"]
            assert not targets["discovery_errors"]

            # The FIFO state was set aside, not read: a run it "announced" is new.
            (shared / "runs" / "live.json").write_text(json.dumps(live))

            def started() -> bool:
                return any(e["type"] == "run_started" for e in lines.events())

            wait_until(started, timeout=30, what="run_started of the live run")
    assert (outside / "victim").read_bytes() == VICTIM
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
