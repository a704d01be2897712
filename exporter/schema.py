"""The contract between the in-workload SDK and the sidecar: the shared directory.

The SDK imports this module and nothing else of the package, so it stays light.

Layout of the shared directory::

    run.json                      the newest run in this directory (identity + configs)
    runs/<run_id>.json            every run, so old step logs keep their identity;
                                  "ended_unix" is added when the run closes (the sidecar
                                  then stops treating its profiler port as a target)
    procs/<host>-<pid>.json       the same record for each process of a run (several
                                  processes of one run, e.g. one per GPU, share
                                  runs/<run_id>.json: each has its own profiler port
                                  and pid); "ended_unix" when that process closes
    steps/<host>-<pid>.jsonl      one JSON object per line, appended by the SDK
    sidecar/state.json            the sidecar's tail offsets and totals (sidecar only)
    memory/<host>-<pid>-<ms>-<n>.pprof.gz   a device-memory profile (gzip pprof), or
    memory/<host>-<pid>-<ms>-<n>.pickle     a PyTorch CUDA memory snapshot (the pickle of
                                  torch.cuda.memory._snapshot()), and
    memory/<host>-<pid>-<ms>-<n>.json       its identity: run_id, workload, host, pid,
                                  time, trigger, request_id (written before the profile)
    requests/memory-profile-<id>.json       the sidecar asks the workload for a memory
                                  profile: {"id", "time"}; each SDK process answers it
                                  once with a profile whose request_id is <id>
    torch_traces/<name>.pt.trace.json[.gz]  a torch.profiler trace (Kineto's Chrome-trace
                                  JSON): run.torch_profile() writes it (identity first,
                                  trace renamed in last), or tensorboard_trace_handler
                                  pointed here writes <worker>.<ms>.pt.trace.json; the
                                  sidecar takes each once (a file without identity once
                                  it has stopped changing) into its store as a session
    torch_traces/<name>.json      the SDK's identity of the trace <name>.pt.trace.json:
                                  run_id, workload, host, pid, time, trigger, name
    sidecar/ingest.json           where the sidecar accepts Pyroscope pushes from the
                                  workload's host profiler: {"url", "pid", "time"};
                                  written at start when Pyroscope is on, removed at stop

Every step-log line carries ``kind`` and the run identity (``run_id``, ``workload``,
``host``) so that the sidecar can tail any file without other state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "CAPTURES_DIR",
    "CAPTURE_LOGDIR_ENV",
    "DEMO_INPUT_DELAY_FILE",
    "HOST_PROFILE_NAME",
    "HOST_PROFILE_SOURCE",
    "HOST_PROFILING_ENV",
    "INGEST_FILE",
    "KIND_END",
    "KIND_MEMORY",
    "KIND_MFU_BASIS",
    "KIND_RECORD",
    "KIND_STEP",
    "MEMORY_DIR",
    "MEMORY_META_SUFFIX",
    "MEMORY_PROFILE_INTERVAL_ENV",
    "MEMORY_PROFILE_REQUEST_PREFIX",
    "MEMORY_PROFILE_SUFFIX",
    "MEMORY_SNAPSHOT_SUFFIX",
    "PHASE_LABEL",
    "PROCS_DIR",
    "PROFILE_SESSIONS_DIR",
    "REQUESTS_DIR",
    "REQUEST_SUFFIX",
    "RUNS_DIR",
    "RUN_FILE",
    "SCHEMA_VERSION",
    "SESSION_FILE",
    "SIDECAR_DIR",
    "STEPS_DIR",
    "STEP_LOG_SUFFIX",
    "STEP_PHASE",
    "TORCH_TRACES_DIR",
    "TORCH_TRACE_META_SUFFIX",
    "TORCH_TRACE_SUFFIXES",
    "TRIGGERS",
    "config_fingerprint",
]

SCHEMA_VERSION: Final = 1

RUN_FILE: Final = "run.json"
RUNS_DIR: Final = "runs"
PROCS_DIR: Final = "procs"
STEPS_DIR: Final = "steps"
STEP_LOG_SUFFIX: Final = ".jsonl"
SIDECAR_DIR: Final = "sidecar"
# The demo workload reads its artificial input-pipeline delay (seconds) from this file.
DEMO_INPUT_DELAY_FILE: Final = "demo-input-delay"

# Why a capture or profile was taken: a session's ``trigger`` and a Pyroscope label.
TRIGGERS: Final = ("manual", "alert", "programmatic", "snapshot", "periodic")

# Step-log line kinds.
KIND_STEP: Final = "step"  # step, start, duration, wait (s), tokens
KIND_RECORD: Final = "record"  # name, value, step, time: a user-recorded gauge
KIND_END: Final = "end"  # time: the run ended cleanly
# time, devices: [{chip, platform, bytes_in_use, bytes_limit, peak_bytes_in_use}],
# sampled from jax.Device.memory_stats() at most once per second.
KIND_MEMORY: Final = "memory"
# time, flops_per_step, flops_source ("user" | "xla_cost_analysis"), peak_flops,
# peak_source ("user" | "table"), peak_name, device_kind, note: what the SDK's MFU
# (the ``mfu`` records) is computed from; written when it changes, nulls when unknown.
KIND_MFU_BASIS: Final = "mfu_basis"

# Device-memory profiles (jax.profiler.device_memory_profile()) and requests for them.
MEMORY_DIR: Final = "memory"
MEMORY_PROFILE_SUFFIX: Final = ".pprof.gz"
# PyTorch CUDA allocator snapshots (run.memory_snapshot()), converted like the profiles.
MEMORY_SNAPSHOT_SUFFIX: Final = ".pickle"
MEMORY_META_SUFFIX: Final = ".json"
REQUESTS_DIR: Final = "requests"
MEMORY_PROFILE_REQUEST_PREFIX: Final = "memory-profile-"
REQUEST_SUFFIX: Final = ".json"
# Seconds between periodic memory profiles taken by the SDK (0 or unset = off).
MEMORY_PROFILE_INTERVAL_ENV: Final = "MLPROF_MEMORY_PROFILE_INTERVAL_S"

# Captures: the profiler server and ``run.profile()`` write XProf's logdir layout
# ``plugins/profile/<session_id>/<host>.xplane.pb`` under the capture logdir
# ($MLPROF_CAPTURE_LOGDIR, default <shared_dir>/captures); a programmatic session's
# ``session.json`` is written last (status "running" first), and the sidecar moves
# finished sessions into its store.
CAPTURE_LOGDIR_ENV: Final = "MLPROF_CAPTURE_LOGDIR"
CAPTURES_DIR: Final = "captures"
PROFILE_SESSIONS_DIR: Final = "plugins/profile"
SESSION_FILE: Final = "session.json"

# torch.profiler traces the sidecar takes into its store (see the layout above).
TORCH_TRACES_DIR: Final = "torch_traces"
# What tensorboard_trace_handler writes (use_gzip adds .gz) and run.torch_profile() too.
TORCH_TRACE_SUFFIXES: Final = (".pt.trace.json", ".pt.trace.json.gz")
TORCH_TRACE_META_SUFFIX: Final = ".json"  # <name>.json beside <name>.pt.trace.json

# Host CPU profiles: the workload's pyroscope-io agent samples its Python threads and
# pushes ``process_cpu`` profiles (cpu nanoseconds) with the run's identity as labels.
HOST_PROFILING_ENV: Final = "MLPROF_HOST_PROFILING"
HOST_PROFILE_NAME: Final = "process_cpu"
HOST_PROFILE_SOURCE: Final = "pyspy_cpu"  # the ``profile_source`` label of those profiles
PHASE_LABEL: Final = "phase"  # sample label: which part of the loop the thread was in
STEP_PHASE: Final = "step"  # the phase ``run.step()`` sets
INGEST_FILE: Final = "ingest.json"  # under SIDECAR_DIR


def config_fingerprint(configs: Mapping[str, Any] | None) -> str | None:
    """A run's configuration in one short name: with the run's name, what makes two runs
    the same workload, whose earlier runs' noise judges a comparison (docs/analysis.md,
    "Each frame's own history"). The SHA-256 of the configs as canonical JSON (keys
    sorted, no spaces, values JSON cannot hold as their ``str``), 16 hex digits; None
    when the run gave no configs at all (unknown: it matches only another unknown)."""
    if configs is None:
        return None
    # Through JSON once first, as run.json holds them: keys become strings (sorting
    # mixed keys such as 1 and "a" raised TypeError) and both sides hash the same text.
    plain = json.loads(json.dumps(configs, default=str))
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
