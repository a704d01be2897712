"""scripts/device-check.sh stopped mid-run ends what it started.

Its sidecar, workload and checker run in the background; stopped by a signal (a CI job's
timeout, a GPU study part past its budget, a closed terminal), the script must end their
whole trees, not leave them scraping, stepping and holding the GPU.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port, wait_until

pytestmark = pytest.mark.integration


def _shims(directory: Path) -> Path:
    """A --venv whose python and mlprof are this interpreter (as the GPU study's)."""
    (directory / "bin").mkdir(parents=True)
    for name, args in (("python", ""), ("mlprof", " -m exporter.cli")):
        shim = directory / "bin" / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        shim.chmod(0o755)
    return directory


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_stopped_device_check_leaves_no_child_running(
    tmp_path: Path, sig: signal.Signals
) -> None:
    pytest.importorskip("jax")
    hide = tmp_path / "hide" / "xprof"  # the lent machine's case: capture in the workload
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text('raise ImportError("no xprof here")\n')
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "MLPROF_DEVICE_CHECK_PORT": str(free_port()),
        "MLPROF_DEVICE_CHECK_PROFILER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join([str(hide.parent), str(ROOT)]),
        "TMPDIR": str(tmp_path),
    }
    log = tmp_path / "device-check.log"
    command = ["bash", str(ROOT / "scripts" / "device-check.sh"), "--dry-run", "--no-install",
               "--venv", str(_shims(tmp_path / "venv"))]  # fmt: skip
    with log.open("w") as sink:
        script = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    started: list[int] = []
    try:
        # The sidecar, the workload and the checker all running: the checks have begun.
        wait_until(lambda: "== checks" in log.read_text() and len(_children(script.pid)) >= 3,
                   timeout=120)  # fmt: skip
        started = _children(script.pid)
        found = re.search(r"sidecar pid (\d+).*workload pid (\d+)", log.read_text())
        assert found is not None and {int(p) for p in found.groups()} <= set(started)
        # Their own children too (the checker's, the sidecar's), as far as they go now.
        started += [c for p in list(started) for c in _children(p)]
        script.send_signal(sig)
        assert script.wait(timeout=60) == -sig
        left = [p for p in started if _alive(p)]
        assert left == [], f"still running after the script ended: {left}\n{log.read_text()}"
        assert f"stopped by {sig.name}" in log.read_text()
    finally:
        if script.poll() is None:
            script.kill()
        for pid in started:  # what the old script left: ended here, by its id
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
