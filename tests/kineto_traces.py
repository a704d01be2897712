"""torch.profiler (Kineto) Chrome-trace JSON built by hand, without torch or a GPU.

Events are shaped as ``ChromeTraceLogger`` writes them (``libkineto/src/output_json.cpp``):
complete events ``{"ph": "X", "cat", "name", "pid", "tid", "ts", "dur", "args"}`` with
times in microseconds and three decimals; host events on ``pid`` = the process and
``tid`` = the thread; GPU activities on ``pid`` = the device and ``tid`` = the stream,
their ``args`` holding ``device``, ``stream`` and ``correlation`` (the id of the
``cuda_runtime`` call that launched them, which carries the same ``correlation``);
``ac2g`` flow events link the two (``"s"`` on the launch, ``"f"`` with ``"bp": "e"`` on
the kernel, ``id`` = the correlation); ``[memory]`` instant events carry ``Bytes``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

PID = 4242
TID = 4242
BASE_TIME_NS = 1_790_000_000_000_000_000
# Kineto's trace clock: microseconds since boot, large enough to show rounding bugs.
T0_US = 5_556_654_649_000.0


def us(offset: float) -> float:
    """A trace timestamp ``offset`` microseconds after the trace's origin."""
    return round(T0_US + offset, 3)


def complete(cat: str, name: str, start: float, dur: float, *, pid: int = PID,
             tid: int = TID, **args: Any) -> dict[str, Any]:  # fmt: skip
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(start),
            "dur": round(dur, 3), "args": args}  # fmt: skip


def launch(
    start: float, dur: float, correlation: int, name: str = "cudaLaunchKernel"
) -> dict[str, Any]:
    return complete("cuda_runtime", name, start, dur, cbid=211, correlation=correlation)


def kernel(name: str, start: float, dur: float, correlation: int | None, *, device: int = 0,
           stream: int = 7, cat: str = "kernel") -> dict[str, Any]:  # fmt: skip
    args: dict[str, Any] = {"queued": 0, "device": device, "context": 1, "stream": stream}
    if correlation is not None:
        args["correlation"] = correlation
    return complete(cat, name, start, dur, pid=device, tid=stream, **args)


def flow(phase: str, flow_id: int, start: float, *, pid: int, tid: int) -> dict[str, Any]:
    event = {"ph": phase, "id": flow_id, "pid": pid, "tid": tid, "ts": us(start),
             "cat": "ac2g", "name": "ac2g"}  # fmt: skip
    if phase == "f":
        event["bp"] = "e"
    return event


def memory(start: float, size: int, addr: int, device: int = -1) -> dict[str, Any]:
    """An allocation (a free when ``size`` < 0) on the CPU, or on CUDA device ``device``."""
    kind = 0 if device < 0 else 1
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID,
            "tid": TID, "ts": us(start),
            "args": {"Device Type": kind, "Device Id": device, "Addr": addr, "Bytes": size,
                     "Total Allocated": 0, "Total Reserved": 0}}  # fmt: skip


def thread_name(name: str, *, pid: int = PID, tid: int = TID) -> dict[str, Any]:
    return {"ph": "M", "name": "thread_name", "ts": us(0), "pid": pid, "tid": tid,
            "args": {"name": name}}  # fmt: skip


def document(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A whole trace: Kineto's header, then the events and its closing markers."""
    tail = [
        {"ph": "X", "cat": "Trace", "ts": us(0), "dur": 1.0, "pid": "Spans",
         "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": us(0)},
    ]  # fmt: skip
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85 << 30}],
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
        "traceEvents": [thread_name(f"thread {TID} (python)"), *events, *tail],
        "traceName": "trace.pt.trace.json",
    }


def write(path: Path, events: list[dict[str, Any]], *, gz: bool = False) -> Path:
    data = json.dumps(document(events), indent=1).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def training_step(step: int, t: float, correlation: int) -> list[dict[str, Any]]:
    """One step at ``t`` µs (100 µs long): a Python frame, ``aten::mm`` launching a GEMM
    kernel and ``aten::relu`` launching an elementwise one, plus a host-to-device copy.
    Kernels run on stream 7 after the host has moved on (as on a real GPU)."""
    return [
        complete("user_annotation", f"ProfilerStep#{step}", t, 100.0),
        complete("python_function", "train.py(12): train_step", t + 1, 90.0),
        complete("cpu_op", "aten::mm", t + 10, 30.0),
        launch(t + 20, 5.0, correlation),
        complete("cpu_op", "aten::relu", t + 50, 20.0),
        launch(t + 55, 4.0, correlation + 1),
        complete("cpu_op", "aten::copy_", t + 75, 10.0),
        launch(t + 78, 3.0, correlation + 2, "cudaMemcpyAsync"),
        kernel("ampere_sgemm_128x64_nn", t + 60, 25.0, correlation),
        kernel(
            "void at::native::vectorized_elementwise_kernel<4, relu>", t + 86, 6.0, correlation + 1
        ),
        kernel(
            "Memcpy HtoD (Pageable -> Device)",
            t + 93,
            2.5,
            correlation + 2,
            cat="gpu_memcpy",
            stream=8,
        ),
        flow("s", correlation, t + 20, pid=PID, tid=TID),
        flow("f", correlation, t + 60, pid=0, tid=7),
    ]
