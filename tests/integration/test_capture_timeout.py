"""Per-target timeout against a server that accepts TCP and never answers (no JAX)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRequest
from exporter.capture.store import SessionStore
from exporter.capture.targets import ProfilerTarget
from tests.harness import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never says a word (a hung or firewalled gRPC peer)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    sock.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[CaptureEngine]:
    store = SessionStore(f"memory://timeout-{time.monotonic_ns()}")
    engine = CaptureEngine(store, tmp_path / "logdir", CaptureLimits(timeout_s=1.0))
    yield engine
    engine.close()  # also when an assertion failed


def test_a_silent_target_times_out_and_stays_held_until_its_call_returns(
    silent_server: str, engine: CaptureEngine, tmp_path: Path
) -> None:
    target = ProfilerTarget(silent_server, "silent", None, "static")
    record = engine.wait(engine.submit(CaptureRequest(duration_ms=200), [target]).id, 60)
    assert record is not None and record.status == "failed"
    [result] = record.targets
    assert result.status == "timeout"
    assert result.error == (
        f"{silent_server}: no answer within 1.2s (delay + duration + MLPROF_CAPTURE_TIMEOUT_S)"
    )
    # The profiler client is still waiting on the silent peer: the target is not dialled
    # again until it returns.
    assert engine.busy(target)
    again = engine.submit(CaptureRequest(duration_ms=200), [target])
    assert again.targets[0].status == "busy"
    wait_until(lambda: not engine.busy(target), timeout=90, what="the hung call to return")
    assert not (tmp_path / "logdir" / "plugins" / "profile" / record.id).exists()
