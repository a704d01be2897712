"""XProf's own web server (``xprof --logdir DIR --port N``) for differential tests.

``xprof.server.start_server`` is what the ``xprof`` command runs. It binds the web
server to the wildcard address (``_get_wildcard_address``; no option chooses another),
so the child started here replaces that one function with ``127.0.0.1`` before starting
it: the web server listens on loopback only. XProf's gRPC worker service
(``_pywrap_profiler_plugin.start_grpc_server``, C++) still listens on every interface of
its own free port; nothing in XProf's Python chooses its address. The child is stopped
by PID when the test ends, whatever happened.

    python -m tests.xprof_server LOGDIR PORT GRPC_PORT   # what the child runs
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.harness import ROOT, Proc, free_port, wait_until
from tests.xprof_cli import XPROF_ENV


@dataclass(frozen=True)
class XProfServer:
    """A running XProf server: ``data(run, tag, host)`` is its tool's JSON answer."""

    base: str
    proc: Proc

    def get(self, route: str, **params: str) -> Any:
        done = httpx.get(f"{self.base}/data/plugin/profile/{route}", params=params, timeout=120)
        assert done.status_code == 200, (route, params, done.status_code, done.text[:500])
        return done.json()

    def data(self, run: str, tag: str, host: str) -> Any:
        return self.get("data", run=run, tag=tag, host=host)


@contextmanager
def xprof_server(logdir: Path, scratch: Path) -> Iterator[XProfServer]:
    """XProf's server on ``logdir``, on a free loopback port; stopped by PID on exit."""
    port, grpc_port = free_port(), free_port()
    while grpc_port == port:
        grpc_port = free_port()
    tmp = scratch / "xprof-tmp"  # XProf's caches, kept out of the machine's TMPDIR
    tmp.mkdir(parents=True, exist_ok=True)
    proc = Proc.python(
        ["-m", "tests.xprof_server", str(logdir), str(port), str(grpc_port)],
        scratch / "xprof-server.log",
        env={**XPROF_ENV, "TMPDIR": str(tmp)},
        cwd=ROOT,
    )
    server = XProfServer(f"http://127.0.0.1:{port}", proc)
    try:

        def runs() -> Any:
            assert proc.alive(), proc.output()[-2000:]
            return server.get("runs")

        wait_until(runs, timeout=120, what=f"XProf's server on port {port}")
        yield server
    finally:
        proc.stop()


def _serve(logdir: str, port: int, grpc_port: int) -> None:
    from xprof import server

    # Fails loudly if XProf renames it: the server would otherwise bind every interface.
    assert callable(server._get_wildcard_address), "xprof.server changed: no bind hook"
    server._get_wildcard_address = lambda _port: "127.0.0.1"
    server.start_server(
        logdir=logdir,
        port=port,
        grpc_port=grpc_port,
        worker_service_address=f"127.0.0.1:{grpc_port}",
    )


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(json.dumps({"usage": "python -m tests.xprof_server LOGDIR PORT GRPC_PORT"}))
        sys.exit(2)
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
