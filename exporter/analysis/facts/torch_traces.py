"""The facts of torch.profiler traces (``mlprof analyze trace.pt.trace.json``).

The same facts as a capture's, where a trace has them (:mod:`exporter.analysis.facts.capture`):

* steps: ``ProfilerStep#N`` cycles (a step's start to the next one's start);
* breakdown: the share of each cycle the *work* covers (GPU kernels, memcpy and memset
  on any stream of a device, averaged over devices; on a CPU-only trace the ``cpu_op``
  time of every host thread outside data phases), the data phase (annotations whose
  name is one, e.g. ``data_loader`` or torch's ``enumerate(DataLoader)#…``), the gap
  between step annotations and the rest of the host's time. The report names the work
  share ``xla_pct``, its key for compute in every capture;
* top ops: the kernels with the most device time; flame graphs for the rules.

Not had from a trace, and said so: XProf's converters and HLO (there is none), GPU kernel
statistics of XSpace planes, communication (NCCL kernels are not singled out yet),
compilations, and memory peak against capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exporter.analysis.facts import capture as capture_facts
from exporter.analysis.facts.intervals import covered, subtract, union
from exporter.analysis.sides.load import step_cycles
from exporter.profiles.torch_trace import (
    DEVICE_CATEGORIES,
    STEP_SOURCE,
    device_graphs,
    host_graphs,
    load_torch_trace,
    step_windows,
)

__all__ = ["trace_facts"]


def _intervals(trace: Any, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.asarray([trace.start_ns[i] for i in rows], np.int64)
    ends = starts + np.asarray([trace.dur_ns[i] for i in rows], np.int64)
    return union(starts, ends)


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
    if trace.has_device:
        facts.backend = "gpu"
        per_device = []
        for device in sorted(
            {trace.pid[i] for i, c in enumerate(trace.category) if c in DEVICE_CATEGORIES}
        ):
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
        zeros.copy(),
    )


def trace_facts(
    paths: Sequence[Path], memory_samples: Sequence[dict[str, Any]] = ()
) -> capture_facts.CaptureFacts:
    """The facts of torch.profiler traces (each one host), as ``gather_facts`` gives a
    capture's; what a trace cannot give is in ``unavailable``."""
    facts = capture_facts.CaptureFacts()
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
    facts.recompilation = capture_facts._recompilation(hosts)
    facts.xprof = {"available": False, "reason": "a torch.profiler trace: no XSpace for XProf"}
    facts.unavailable["hlo"] = "a torch.profiler trace holds no HLO"
    capture_facts._memory(facts, memory_samples)
    return facts
