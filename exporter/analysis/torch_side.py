"""A torch.profiler trace as one side of a comparison or an analysis, like a capture.

Read without ``--kind``, a trace with GPU kernels is the step view of
:mod:`exporter.analysis.sides` (kernels under their launching ops, and the host's own
threads under ``host``); a CPU-only trace is its host view. ``ProfilerStep#N``
annotations are the steps: each cycle runs from one step's start to the next one's, as
for XSpace captures, so the comparison's step verdict and per-step samples work alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from exporter.analysis.sides import (
    Kind,
    Side,
    join_step_view,
    sample_cycles,
    step_cycles,
)
from exporter.errors import InputError
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.torch_trace import (
    STEP_FRAME,
    TorchTrace,
    flamegraph_from_trace,
    load_torch_trace,
    step_windows,
    windowed_graphs,
)

__all__ = ["trace_side"]

_FAR_NS = 1 << 62
# The step source a comparison reports: the steps are host annotations (ProfilerStep#N).
STEP_SOURCE = "host_step_annotations"


def _one_kind(trace: TorchTrace, path: Path, spec: str, kind: Literal["device", "host"]) -> Side:
    from exporter.profiles.steps import StepWindow

    whole = flamegraph_from_trace(trace, kind)  # the reader's own error when it has none
    cycles = sample_cycles(step_cycles(step_windows(trace)))
    side = Side(spec, "torch_trace", kind, whole, files=[str(path)])
    side.step_names = {STEP_FRAME}
    if not cycles:
        return side
    if len(cycles) == len(step_cycles(step_windows(trace))):
        # Every cycle, plus what lies before the first and after the last: the whole
        # graph is their sum, so the steps add up to it exactly.
        edges = [StepWindow(-_FAR_NS, cycles[0].start_ns, None), *cycles,
                 StepWindow(cycles[-1].end_ns, _FAR_NS, None)]  # fmt: skip
        graphs = windowed_graphs(trace, kind, edges)
        steps = graphs[1:-1]
        merged = graphs[0].copy()
        for graph in graphs[1:]:
            merged.merge(graph)
        merged.time_nanos, merged.duration_nanos = whole.time_nanos, whole.duration_nanos
        side.whole = merged
    else:
        steps = windowed_graphs(trace, kind, cycles)
    side.steps = list(steps)
    side.step_ns = [w.end_ns - w.start_ns for w in cycles]
    side.step_source = STEP_SOURCE
    return side


def trace_side(path: Path, kind: Kind | None, spec: str) -> Side:
    """The side a torch.profiler trace at ``path`` makes (``spec`` as the user named it)."""
    trace = load_torch_trace(path)
    if kind == "memory":
        graph: FlameGraph = flamegraph_from_trace(trace, "memory")
        return Side(spec, "torch_trace", "memory", graph, files=[str(path)])
    if kind is not None:
        return _one_kind(trace, path, spec, kind)
    host = _one_kind(trace, path, spec, "host")
    if not trace.has_device:
        return host
    try:
        device = _one_kind(trace, path, spec, "device")
    except InputError:
        return host
    return join_step_view(device, host)
