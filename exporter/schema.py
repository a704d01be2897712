"""The contract between the in-workload SDK and the sidecar: the shared directory.

The SDK imports this module and nothing else of the package, so it stays light.

Layout of the shared directory::

    run.json                      the newest run in this directory (identity + configs)
    runs/<run_id>.json            every run, so old step logs keep their identity
    steps/<host>-<pid>.jsonl      one JSON object per line, appended by the SDK
    sidecar/state.json            the sidecar's tail offsets and totals (sidecar only)

Every step-log line carries ``kind`` and the run identity (``run_id``, ``workload``,
``host``) so that the sidecar can tail any file without other state.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEMO_INPUT_DELAY_FILE",
    "KIND_END",
    "KIND_RECORD",
    "KIND_STEP",
    "RUNS_DIR",
    "RUN_FILE",
    "SCHEMA_VERSION",
    "SIDECAR_DIR",
    "STEPS_DIR",
    "STEP_LOG_SUFFIX",
]

SCHEMA_VERSION: Final = 1

RUN_FILE: Final = "run.json"
RUNS_DIR: Final = "runs"
STEPS_DIR: Final = "steps"
STEP_LOG_SUFFIX: Final = ".jsonl"
SIDECAR_DIR: Final = "sidecar"
# The demo workload reads its artificial input-pipeline delay (seconds) from this file.
DEMO_INPUT_DELAY_FILE: Final = "demo-input-delay"

# Step-log line kinds.
KIND_STEP: Final = "step"  # step, start, duration, wait (s), tokens
KIND_RECORD: Final = "record"  # name, value, step, time: a user-recorded gauge
KIND_END: Final = "end"  # time: the run ended cleanly
