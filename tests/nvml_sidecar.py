"""``mlprof serve`` on a GPU host made of the NVML double: ``python -m tests.nvml_sidecar``.

There is no GPU here and the NVML double (tests/nvml_double.py: nvidia-ml-py's own
structures, constants and error codes) answers in-process only, so this puts it where
``import pynvml`` finds it and runs the real sidecar: its NVML source, instruments and
exposition are the product's. The end-to-end environment (tests/e2e/conftest.py) runs
it as a third host of the run, so the GPU panels of the dashboards query real series;
the process that starts it plays the run's workload process (its ``run.json`` names
that pid).
The values are the double's three boards (an H100 at its power cap, one in MIG mode, a
T4), fixed in time: counters do not move.
"""

from __future__ import annotations

import os
import sys

from tests.nvml_double import NvmlDouble

__all__ = ["RUN_PID", "main"]

# The pid the double's boards give the run's process (they run other processes too).
RUN_PID = 4242


def main() -> None:
    double = NvmlDouble()
    # The run's process is the one that started this sidecar: a live pid older than the
    # run, as a workload's is. A fixed pid could belong to a younger process on a busy
    # machine (pids wrap), which the sidecar rightly refuses to take for the run's.
    for board in double.boards:
        board.processes = [
            (os.getppid() if pid == RUN_PID else pid, n) for pid, n in board.processes
        ]
    sys.modules["pynvml"] = double  # type: ignore[assignment]
    from exporter.cli import main as mlprof

    mlprof(["serve"], prog_name="mlprof")


if __name__ == "__main__":
    main()
