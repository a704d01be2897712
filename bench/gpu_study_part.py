"""One part of the GPU study (``bench/gpu_study.py``): its checks and figures, as JSON.

Every part is a script run in its own process by the driver, with the same arguments
(``--json PATH --mode gpu|cpu --budget SECONDS --work DIR``). It records checks (PASS,
FAIL, SKIP, INFO, each with a one-line detail) and figures, and writes them to ``--json``
whatever happens: an exception inside the part becomes a FAIL check, so the driver
always has the part's result, and a failing part never stops the others.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@dataclass
class Part:
    name: str
    mode: str  # "gpu" on the lent machine; "cpu" for the dry run
    budget_s: float
    work: Path
    json_path: Path | None = None  # rewritten at each check: a killed part leaves its own
    started: float = field(default_factory=time.monotonic)
    checks: list[dict[str, str]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def add(self, status: str, name: str, detail: str = "") -> None:
        self.checks.append({"status": status, "name": name, "detail": detail})
        print(f"[{self.name}] {status:<4}  {name}" + (f": {detail}" if detail else ""), flush=True)
        self.save()

    def save(self) -> None:
        if self.json_path is not None:
            self.json_path.write_text(json.dumps(self.to_json(), indent=1, default=str))

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        self.add("PASS" if ok else "FAIL", name, detail)
        return ok

    def to_json(self) -> dict[str, Any]:
        counts = {
            s: sum(c["status"] == s for c in self.checks) for s in ("PASS", "FAIL", "XFAIL", "SKIP")
        }
        return {
            "part": self.name,
            "mode": self.mode,
            "seconds": round(time.monotonic() - self.started, 1),
            "counts": counts,
            "checks": self.checks,
            "figures": self.figures,
        }


def has_gpu() -> bool:
    """An NVIDIA GPU that ``nvidia-smi`` lists (the lent machine), else the dry run."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


def wait_line(proc: subprocess.Popen[bytes], token: bytes, timeout_s: float) -> bytes:
    """The first line of ``proc``'s stdout holding ``token``; b"" at its end or the timeout
    (a neighbour that never starts must not hang the part)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if not ready:
            break
        line = proc.stdout.readline()
        if not line or token in line:
            return line
    return b""


def stop_group(proc: subprocess.Popen[Any], term_wait_s: float = 5.0) -> None:
    """End ``proc``'s process group (started with ``start_new_session``): SIGTERM, which
    lets it end its children and write what it has, then SIGKILL for what is left."""
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def run_part(name: str, body: Callable[[Part], None]) -> None:
    """Parse the driver's arguments, run ``body`` and write its JSON, whatever happens."""
    parser = argparse.ArgumentParser(description=f"GPU study part {name!r}")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--mode", choices=("gpu", "cpu"), default="cpu")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    part = Part(name, args.mode, args.budget, args.work, args.json)

    def stopped(signum: int, _frame: Any) -> None:
        # The driver's timeout: unwind, so that the part's finally blocks end its children.
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stopped)
    try:
        body(part)
    except Exception as exc:  # a part's crash is its result, not the study's end
        part.add("FAIL", "part crashed", f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    except SystemExit as exc:
        part.add("FAIL", "part stopped", f"{exc} after {time.monotonic() - part.started:.0f} s")
    finally:
        part.save()
    sys.exit(0)
