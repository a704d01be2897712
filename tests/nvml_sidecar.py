"""``mlprof serve`` on a GPU host made of the NVML double: ``python -m tests.nvml_sidecar``.

There is no GPU here and the NVML double (tests/nvml_double.py: nvidia-ml-py's own
structures, constants and error codes) answers in-process only, so this puts it where
``import pynvml`` finds it and runs the real sidecar: its NVML source, instruments and
exposition are the product's. The end-to-end environment (tests/e2e/conftest.py) runs
it as a third host of the run, so the GPU panels of the dashboards query real series.
The values are the double's three boards (an H100 at its power cap, one in MIG mode, a
T4), fixed in time: counters do not move.
"""

from __future__ import annotations

import sys

from tests.nvml_double import NvmlDouble, h100

__all__ = ["RUN_PID", "main"]

# The pid the double's first H100 reports as a compute process: a run.json naming it
# maps that process's device memory to the run.
RUN_PID = h100().processes[0][0]


def main() -> None:
    sys.modules["pynvml"] = NvmlDouble()  # type: ignore[assignment]
    from exporter.cli import main as mlprof

    mlprof(["serve"], prog_name="mlprof")


if __name__ == "__main__":
    main()
