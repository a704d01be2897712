"""The facts of torch.profiler traces (``mlprof analyze trace.pt.trace.json``).

The same facts as a capture's, where a trace has them (:mod:`exporter.analysis.facts.capture`):

* steps: ``ProfilerStep#N`` cycles (a step's start to the next one's start);
* breakdown: the share of each cycle the *work* covers (GPU kernels, memcpy and memset
  on any stream of a device, averaged over devices; on a CPU-only trace the ``cpu_op``
  time of every host thread outside data phases), the data phase (annotations whose
  name is one, e.g. ``data_loader`` or torch's ``enumerate(DataLoader)#…``), the gap
  between step annotations and the rest of the host's time. The report names the work
  share ``xla_pct``, its key for compute in every capture;
* communication: NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``: XProf's
  ``ClassifyGpuEvent`` rule, a kernel named ``nccl…``) are the collectives, as XLA's
  collective ops are in a capture: ``communication_pct`` is the share of each cycle an
  NCCL kernel runs on a device (averaged over devices), by kind (``all-reduce``,
  ``all-gather``, ``send-recv``…); ``communication_overlap`` is the part of the NCCL
  kernels' time that compute kernels on the device's other streams cover (HTA's
  communication/computation overlap, per kernel rather than per rank);
* top ops: the kernels with the most device time; flame graphs for the rules.

Not had from a trace, and said so: XProf's converters and HLO (there is none), GPU kernel
statistics of XSpace planes, compilations (torch.compile's are not read from the trace),
and memory peak against capacity.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exporter.analysis.facts import capture as capture_facts
from exporter.analysis.facts.collectives import is_communication
from exporter.analysis.facts.intervals import covered, subtract, union
from exporter.analysis.facts.types import Overlap
from exporter.analysis.sides.load import step_cycles
from exporter.profiles.torch_trace import (
    DEVICE_CATEGORIES,
    STEP_SOURCE,
    device_graphs,
    host_graphs,
    load_torch_trace,
    step_windows,
)

__all__ = ["TORCH_TRACE_FORMAT", "nccl_kind", "trace_facts"]

TORCH_TRACE_FORMAT = "torch_trace"  # CaptureFacts.capture_format of a trace
# ncclKernel_AllReduce_RING_LL_Sum_float(...), ncclDevKernel_SendRecv(...)
_NCCL_KIND_RE = re.compile(r"^nccl(?:Dev)?Kernel_(?P<kind>[A-Za-z]+)")
_OVERLAP_SOURCE = "NCCL kernels against compute kernels on the device's other streams"


def _intervals(trace: Any, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.asarray([trace.start_ns[i] for i in rows], np.int64)
    ends = starts + np.asarray([trace.dur_ns[i] for i in rows], np.int64)
    return union(starts, ends)


def nccl_kind(name: str) -> str:
    """An NCCL kernel's collective, named as XProf names XLA's (``all-reduce``)."""
    match = _NCCL_KIND_RE.match(name)
    if match is None:
        return "nccl"
    return re.sub(r"(?<!^)(?=[A-Z])", "-", match["kind"]).lower()


def _communication(
    trace: Any, devices: list[int], cycles: list[tuple[int, int]]
) -> tuple[np.ndarray, dict[str, float], Overlap | None]:
    """NCCL kernels per cycle (ns, mean over devices), ns per kind (mean over devices),
    and how much of their time compute kernels on the same device cover."""
    per_device: list[np.ndarray] = []
    kinds: defaultdict[str, float] = defaultdict(float)
    windows: list[tuple[int, int]] = []
    hidden = 0
    for device in devices:
        comm: list[int] = []
        compute: list[int] = []
        for i, category in enumerate(trace.category):
            if category != "kernel" or trace.pid[i] != device:
                continue
            (comm if is_communication(trace.name[i]) else compute).append(i)
        per_device.append(covered(*_intervals(trace, comm), cycles))
        for i in comm:
            kinds[nccl_kind(trace.name[i])] += trace.dur_ns[i] / len(devices)
        spans = [(trace.start_ns[i], trace.start_ns[i] + trace.dur_ns[i]) for i in comm]
        if spans and cycles:
            hidden += int(covered(*_intervals(trace, compute), spans).sum())
            windows += spans
    mean = np.mean(per_device, axis=0) if per_device else np.zeros(len(cycles))
    span = sum(e - s for s, e in windows)
    overlap: Overlap | None = None
    if span > 0:
        per_step = 1e6 * len(cycles) * len(devices)
        overlap = {
            "async_ops": len(windows),
            "source": _OVERLAP_SOURCE,
            "async_ms_per_step": round(span / per_step, 4),
            "hidden_pct": round(100 * hidden / span, 2),
            "exposed_ms_per_step": round((span - hidden) / per_step, 4),
        }
    return np.asarray(mean, float), dict(kinds), overlap


def _trace_host(path: Path, facts: capture_facts.CaptureFacts) -> Any:
    """One trace's ``facts._Host`` (a trace is one host's capture)."""
    trace = load_torch_trace(path)
    windows = step_windows(trace)
    step_list = step_cycles(windows)
    cycles = [(w.start_ns, w.end_ns) for w in step_list]
    annotations = sorted((w.start_ns, w.end_ns) for w in windows)
    data_rows = []
    for i, category in enumerate(trace.category):
        if category == "user_annotation" and capture_facts.is_data_phase(trace.name[i]):
            data_rows.append(i)
            facts.data_phase_names.add(trace.name[i])
    data_starts, data_ends = _intervals(trace, data_rows)
    communication: np.ndarray | None = None
    kinds: dict[str, float] = {}
    overlap: Overlap | None = None
    if trace.has_device:
        facts.backend = "gpu"
        per_device = []
        devices = sorted(
            {trace.pid[i] for i, c in enumerate(trace.category) if c in DEVICE_CATEGORIES}
        )
        communication, kinds, overlap = _communication(trace, devices, cycles)
        for device in devices:
            rows = [
                i
                for i, c in enumerate(trace.category)
                if c in DEVICE_CATEGORIES and trace.pid[i] == device
            ]
            per_device.append(covered(*_intervals(trace, rows), cycles))
        busy = np.mean(per_device, axis=0)
        work = None
    else:
        facts.backend = "cpu"
        rows = [i for i, c in enumerate(trace.category) if c == "cpu_op"]
        work = _intervals(trace, rows)
        if len(data_starts):  # ops inside the data phase are the data phase's
            work = subtract(*work, data_starts, data_ends)
        busy = covered(*work, cycles)
    if work is not None and len(work[0]) and len(data_starts):
        data_starts, data_ends = subtract(data_starts, data_ends, *work)
    data_phase = covered(data_starts, data_ends, cycles)
    graphs = {"device": device_graphs(trace), "host": host_graphs(trace)}
    for kind, found in graphs.items():
        if not found:
            continue
        graph = facts.graphs.get(kind)
        if graph is None:
            facts.graphs[kind] = found[0]
        else:
            graph.merge(found[0])
    facts.files.append(str(path))
    if facts.steps is None and cycles:
        facts.steps = {"source": STEP_SOURCE}
    zeros = np.zeros(len(cycles), float)
    return capture_facts._Host(
        cycles,
        annotations,
        np.asarray(busy, float),
        data_phase.astype(float),
        [],
        zeros,
        path,
        [w.step for w in step_list],
        zeros.copy() if communication is None else communication,
        kinds=kinds,
        overlap=overlap,
    )


def trace_facts(
    paths: Sequence[Path], memory_samples: Sequence[dict[str, Any]] = ()
) -> capture_facts.CaptureFacts:
    """The facts of torch.profiler traces (each one host), as ``gather_facts`` gives a
    capture's; what a trace cannot give is in ``unavailable``."""
    facts = capture_facts.CaptureFacts(capture_format=TORCH_TRACE_FORMAT)
    hosts = [_trace_host(path, facts) for path in paths]
    capture_facts.add_host_facts(
        facts,
        hosts,
        "no ProfilerStep#N annotations (profile with a schedule and call prof.step())",
    )
    device = facts.graphs.get("device")
    if device is None:
        facts.unavailable["device"] = (
            "no GPU kernels in this torch.profiler trace (profile with ProfilerActivity.CUDA): "
            "device time and top ops are unknown"
        )
    facts.top_ops = capture_facts._top_ops(device)
    # torch.compile's recompilations are not read from a trace: unknown, never "none".
    facts.recompilation = None
    facts.unavailable["recompilation"] = (
        "a torch.profiler trace: torch.compile recompilations are not read from it "
        "(TORCH_LOGS=recompiles lists them)"
    )
    facts.xprof = {"available": False, "reason": "a torch.profiler trace: no XSpace for XProf"}
    facts.unavailable["hlo"] = "a torch.profiler trace holds no HLO"
    capture_facts._memory(facts, memory_samples)
    if facts.memory is None and "memory" in facts.unavailable:
        facts.unavailable["memory"] = (
            "no device memory peak and capacity: a torch.profiler trace's [memory] events "
            "hold allocations, not the device's capacity (the torch_memory flame graph shows "
            "them), and no memory samples were given"
        )
    return facts
