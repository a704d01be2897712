"""Test harness: free ports, polling, and child processes stopped by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

__all__ = ["ROOT", "Proc", "free_port", "wait_http", "wait_until"]

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # the service may not be up yet
            last_exc = exc
        else:
            if value:
                return value
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or predicate}: {last_exc!r}"
    )


def wait_http(url: str, timeout: float = 30.0, headers: Mapping[str, str] | None = None) -> None:
    """Wait until ``url`` answers 2xx."""
    wait_until(
        lambda: httpx.get(url, timeout=2, headers=headers).is_success,
        timeout=timeout,
        what=url,
    )


class Proc:
    """A child process with its output in a file; stopped by PID on ``stop``."""

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        full_env = {**os.environ, **(env or {})}
        self._out = log.open("wb")
        self.popen = subprocess.Popen(
            list(args), stdout=self._out, stderr=subprocess.STDOUT, env=full_env, cwd=cwd
        )

    @classmethod
    def python(cls, args: Sequence[str], log: Path, **kw: object) -> Proc:
        return cls([sys.executable, *args], log, **kw)  # type: ignore[arg-type]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._out.close()
        return self.popen.returncode
