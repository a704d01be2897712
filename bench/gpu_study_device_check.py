"""GPU study part ``device_check``: the project's own device check, ``scripts/device-check.sh``.

It starts ``mlprof serve`` (NVML source) beside the demo JAX workload, scrapes
``/metrics`` while the GPU idles and works, checks every GPU metric and its range, then
captures once and looks for GPU kernels in the device flame graph
(``tests/device_check.py``). Here it runs without installing (``--no-install``): its
``--venv`` is a directory of two shims, ``bin/python`` and ``bin/mlprof``, that run this
interpreter (the lent machine's python3, with the carried wheels on ``PYTHONPATH``; a
venv made from that python3 would not see its torch and jax), on free ports. Each of its
PASS/FAIL/SKIP/INFO lines becomes a check here.

Remote capture needs XProf's profiler client (``mlprof-exporter[capture]``), which is
not carried to the lent machine (32 MB and heavy dependencies): there the script takes
its capture in the workload instead (``run.profile``, asked through the demo's
``demo-profile`` knob), and its flame-graph step reads that. A capture step that still
fails without ``xprof`` is recorded XFAIL. Dry run: ``--dry-run`` (CPU JAX, GPU checks
SKIP; the driver hides ``xprof`` there too).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_study_part import ROOT, Part, run_part, stop_group

LINE = re.compile(r"^(PASS|FAIL|SKIP|INFO)\s+(.+?)(?::\s(.*))?$")
# Its steps that need XProf's profiler client (remote capture).
NEEDS_XPROF = ("capture", "device flame graph has GPU kernels", "flame graph of the capture")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shims(directory: Path) -> Path:
    """A --venv for device-check.sh whose python and mlprof are this interpreter."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, args in (("python", ""), ("mlprof", " -m exporter.cli")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        shim.chmod(0o755)
    return directory


def body(part: Part) -> None:
    venv = shims(part.work / "venv")
    env = {
        **os.environ,
        "MLPROF_DEVICE_CHECK_PORT": str(free_port()),
        "MLPROF_DEVICE_CHECK_PROFILER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "TMPDIR": str(part.work),
    }
    if not part.gpu:
        env["JAX_PLATFORMS"] = "cpu"
    command = [
        "bash",
        str(ROOT / "scripts" / "device-check.sh"),
        "--no-install",
        "--venv",
        str(venv),
        *([] if part.gpu else ["--dry-run"]),
    ]
    log = part.work / "device-check.log"
    rc: int | None = None
    # Its own process group: the sidecar and workload it starts in the background go
    # with it when it is stopped (a killed bash runs no EXIT trap to end them).
    with log.open("w") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=max(10.0, part.left_s() - 5))
        except subprocess.TimeoutExpired:
            part.add(
                "FAIL",
                "device-check.sh finished",
                f"still running after {part.budget_s - part.left_s():.0f} s",
            )
        finally:
            stop_group(proc)
    output = log.read_text(errors="replace")
    try:
        import xprof  # noqa: F401
    except ImportError:
        has_xprof = False
    else:
        has_xprof = True
    for line in output.splitlines():
        found = LINE.match(line.strip())
        if not found:
            continue
        status, name, detail = found.group(1), found.group(2), found.group(3) or ""
        if status == "FAIL" and not has_xprof and name in NEEDS_XPROF:
            status, detail = "XFAIL", f"no xprof here (remote capture needs it): {detail}"
        part.add(status, f"device-check: {name}", detail[:300])
    summary = [x for x in output.splitlines() if x.startswith("DEVICE CHECK:")]
    part.figures["summary"] = summary[-1] if summary else None
    part.figures["rc"] = rc
    part.figures["log_tail"] = output[-4000:]
    if rc is not None:
        part.add(
            "INFO", "device-check.sh", f"exit {rc}: {summary[-1] if summary else 'no summary'}"
        )


if __name__ == "__main__":
    run_part("device_check", body)
