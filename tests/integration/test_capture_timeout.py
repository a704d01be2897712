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


class SilentServer:
    """Accepts connections and never says a word (a hung or firewalled gRPC peer), until
    it hangs up."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                self.held.append(self.sock.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    def hang_up(self) -> None:
        """Close every connection and the listener: a call waiting on it returns now."""
        self._stop.set()
        self._thread.join(2)
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.hang_up()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[CaptureEngine]:
    store = SessionStore(f"memory://timeout-{time.monotonic_ns()}")
    engine = CaptureEngine(store, tmp_path / "logdir", CaptureLimits(timeout_s=1.0))
    yield engine
    engine.close()  # also when an assertion failed


def test_a_silent_target_times_out_and_stays_held_until_its_call_returns(
    silent_server: SilentServer, engine: CaptureEngine, tmp_path: Path
) -> None:
    address = silent_server.address
    target = ProfilerTarget(address, "silent", None, "static")
    record = engine.wait(engine.submit(CaptureRequest(duration_ms=200), [target]).id, 60)
    assert record is not None and record.status == "failed"
    [result] = record.targets
    assert result.status == "timeout"
    assert result.error == (
        f"{address}: no answer within 1.2s (delay + duration + MLPROF_CAPTURE_TIMEOUT_S)"
    )
    # The profiler client is still waiting on the silent peer: the target is not dialled
    # again until it returns.
    assert engine.busy(target)
    again = engine.submit(CaptureRequest(duration_ms=200), [target])
    assert again.targets[0].status == "busy"
    assert engine.busy(target)  # still, after the second request was refused
    # The call returns when the peer hangs up (else at the client's own deadline, ~18 s
    # later: the same return, waited for); only then is the target free again.
    silent_server.hang_up()
    wait_until(lambda: not engine.busy(target), timeout=90, what="the hung call to return")
    assert not (tmp_path / "logdir" / "plugins" / "profile" / record.id).exists()
