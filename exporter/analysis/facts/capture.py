"""The measured facts of a capture (or a session's captures): what a report reasons on.

Gathered from the capture itself (step windows from the profiles layer; XLA execution
intervals from device planes, or on CPU from the XLA client threads; flame graphs) and
cross-checked with XProf's own converters where they work (:mod:`xprof_tools`). A fact
that cannot be had on the capture's backend is listed in ``unavailable`` with the
reason, never invented.

Step time is split per step *cycle* (one step's start to the next step's start):

* ``xla_pct``: time during which at least one XLA computation ran (on a TPU/GPU, per
  device, averaged over devices; on CPU, on any XLA client thread);
* ``input_wait_pct``: the rest, time inside a step when no XLA computation runs, split
  into ``data_phase_pct`` (inside host events named like a data phase, see
  :data:`DATA_PHASE_WORDS`; the names matched are ``data_phase_names``),
  ``between_steps_pct`` (outside the step annotations), ``compile_pct`` (XLA compiling
  inside the step) and ``host_other_pct``;
* ``communication_pct``: the part of ``xla_pct`` a collective op runs
  (:mod:`collectives`), ``compute_pct`` the rest of it; ``communication_overlap``, how
  much of the asynchronous collectives' windows other ops hide.

``hosts`` has one entry per capture file, with a straggler score over hosts
(:mod:`hosts`).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import numpy as np

from exporter.analysis.facts.intervals import covered, subtract, union
from exporter.analysis.facts.types import (
    Breakdown,
    CompilerFacts,
    GpuKernelFacts,
    HostFacts,
    MemoryFacts,
    OpCategories,
    Overlap,
    PeakAllocations,
    Recompilation,
    Roofline,
    StepFacts,
    TopOp,
)
from exporter.profiles.capture_files import capture_bytes
from exporter.profiles.flamegraph import FlameGraph

if TYPE_CHECKING:
    from exporter.profiles.xplane import Capture, OpLine, PlaneRef

__all__ = [
    "COMPILE_EVENT_RE",
    "DATA_PHASE_WORDS",
    "CaptureFacts",
    "GraphReader",
    "add_host_facts",
    "gather_facts",
    "graph_reader",
    "is_data_phase",
]

# How the facts read a capture's whole device (op lines handed to ``on_op_line``) and
# host graphs: (capture file, capture, kind) -> the graph, or None as the plain readers
# answer. Unset: ``device_flamegraph``/``host_flamegraph``. The sidecar's session child
# sets one that reads each as the capture's side (exporter.pipeline.job), so one pass
# serves the facts, the flame graphs it stores and the side cache.
GraphReader = Callable[[Path, "Capture", str], FlameGraph | None]
graph_reader: ContextVar[GraphReader | None] = ContextVar("graph_reader", default=None)

# Host events that are a data phase: the annotation users put around their input
# pipeline, and the names loaders trace under (PyTorch's DataLoader, tf.data's
# ``Iterator::...`` and ``IteratorGetNext``, grain's iterators, ``next_batch``). A name
# is split into words (snake_case, CamelCase, ``::``); one of these words makes it a
# data phase, unless it is a compilation (``backend_compile_and_load`` loads a program,
# not data) or an XLA pass.
DATA_PHASE_WORDS: Final = frozenset(
    {"data", "input", "batch", "load", "loader", "loading", "prefetch", "iterator",
     "dataset", "dataloader", "getnext", "grain", "infeed"}
)  # fmt: skip
NOT_DATA_WORDS: Final = frozenset(
    {"compile", "compilation", "compiler", "lowering", "lower", "pass", "hlo", "autotune",
     "executable", "pjit", "jit",
     # the PjRt runtime's own events about an executable's inputs and outputs
     "allocate", "buffer", "buffers", "reuse", "handle", "event", "execute", "donation"}
)  # fmt: skip
_WORDS: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def is_data_phase(name: str) -> bool:
    """Whether a host event named ``name`` is a data phase (see DATA_PHASE_WORDS)."""
    words = {w.lower() for w in _WORDS.findall(name)}
    if "get" in words and "next" in words:
        words.add("getnext")
    return bool(words & DATA_PHASE_WORDS) and not words & NOT_DATA_WORDS


# A compilation: JAX's own TraceMe around it, else the PjRt client's compile call.
COMPILE_EVENT_RE: Final = re.compile(r"^(backend_compile\w*|\w*Client::Compile)$")
TOP_OPS: Final = 10
# A step is an outlier above this modified z-score (Iglewicz & Hoaglin's 3.5, as XProf's
# straggler signal), with the MAD floored at this share of the median so that a capture
# of near-identical steps does not call a 2 % slower one an outlier.
STEP_OUTLIER_Z: Final = 3.5
STEP_MAD_FLOOR: Final = 0.05
_PS_PER_NS = 1000


@dataclass
class CaptureFacts:
    """Facts of one analysis input; ``to_json`` is the report's ``facts``."""

    backend: str = "unknown"
    # What was read: "xspace" (XProf captures) or "torch_trace" (torch.profiler traces,
    # facts/torch_traces.py); the report words its findings for it (report/rules.py).
    capture_format: str = "xspace"
    files: list[str] = field(default_factory=list)
    steps: StepFacts | None = None
    hosts: list[HostFacts] = field(default_factory=list)  # one per capture file
    breakdown: Breakdown | None = None
    top_ops: list[TopOp] = field(default_factory=list)
    compiler: CompilerFacts | None = None
    recompilation: Recompilation | None = None
    memory: MemoryFacts | None = None
    roofline: Roofline | None = None  # program_facts.roofline
    peak_allocations: PeakAllocations | None = None  # program_facts.peak_allocations
    op_categories: OpCategories | None = None  # program_facts.op_categories
    gpu_kernels: GpuKernelFacts | None = None  # gpu_kernels.gpu_kernel_facts
    xprof: dict[str, Any] = field(default_factory=dict)  # XProf's own answers, open-ended
    unavailable: dict[str, str] = field(default_factory=dict)
    graphs: dict[str, FlameGraph] = field(default_factory=dict)  # not in the JSON
    data_phase_names: set[str] = field(default_factory=set)  # host events matched as data

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "capture_format": self.capture_format,
            "files": self.files,
            "steps": self.steps,
            "hosts": self.hosts,
            "breakdown": self.breakdown,
            "data_phase_names": sorted(self.data_phase_names),
            "top_ops": self.top_ops,
            "compiler": self.compiler,
            "recompilation": self.recompilation,
            "memory": self.memory,
            "roofline": self.roofline,
            "peak_allocations": self.peak_allocations,
            "op_categories": self.op_categories,
            "gpu_kernels": self.gpu_kernels,
            "xprof": self.xprof,
            "unavailable": self.unavailable,
        }


@dataclass
class _Host:
    """What one capture file gives (one host)."""

    cycles: list[tuple[int, int]]
    annotations: list[tuple[int, int]]  # the step windows as the source marks them
    xla_busy: np.ndarray  # per cycle, ns with XLA running (mean over devices)
    data_phase: np.ndarray  # per cycle, ns inside data-phase host events with no XLA
    compile_events: list[tuple[int, int]]
    compile_phase: np.ndarray  # per cycle, ns compiling (no XLA running, no data phase)
    path: Path | None = None
    steps: list[int | None] = field(default_factory=list)  # each cycle's step number
    communication: np.ndarray | None = None  # per cycle, ns in collectives (mean/device)
    kinds: dict[str, float] = field(default_factory=dict)  # communication ns per op kind
    overlap: Overlap | None = None  # async collectives' windows (collectives.py)
    gpu: Any = None  # gpu_kernels.CaptureKernels of the GPU planes, None without any
    # program_facts.capture_hlo_ops of the capture (read once, here), the modules whose
    # proto did not parse (why each), and why none could be read at all.
    programs: dict[str, dict[str, Any]] = field(default_factory=dict)
    hlo_damaged: dict[str, str] = field(default_factory=dict)
    hlo_error: str | None = None


class _DeviceBusy:
    """Each device plane's XLA-busy ns per cycle, taken from the lines the device
    conversion reads (``Capture.on_op_line``): the op events are read once, not twice.

    A plane's only op line (TPU's ``XLA Ops``) arrives in pieces no event crosses, so
    each piece's busy time per cycle is added as it arrives and nothing of it is kept
    (kept, a 2.5 GB capture's intervals took 470 MB a plane). Lines that may overlap
    each other (GPU streams) keep their merged intervals until all are read.
    """

    def __init__(
        self,
        cycles: Sequence[tuple[int, int]],
        also: Callable[[OpLine, np.ndarray, np.ndarray], None] | None = None,
    ) -> None:
        self.cycles = cycles
        self.busy: dict[PlaneRef, np.ndarray] = {}  # ns per cycle, from sole lines
        self.planes: dict[PlaneRef, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.also = also  # another reader of the same lines (communication)

    def __call__(self, line: OpLine) -> None:
        start = line.base_ns + line.starts_ps // _PS_PER_NS
        end = start + (line.ends_ps - line.starts_ps) // _PS_PER_NS
        merged = union(start, end)
        if line.sole:
            before = self.busy.get(line.ref, np.zeros(len(self.cycles), np.int64))
            self.busy[line.ref] = before + covered(*merged, self.cycles)
        else:
            self.planes.setdefault(line.ref, []).append(merged)
        if self.also is not None:
            self.also(line, start, end)

    def per_cycle(self) -> np.ndarray:
        """Per cycle, XLA-busy ns averaged over the device planes."""
        per_device = dict(self.busy)
        for ref, lines in self.planes.items():
            starts = np.concatenate([s for s, _ in lines])
            ends = np.concatenate([e for _, e in lines])
            per_device[ref] = per_device.get(ref, 0) + covered(*union(starts, ends), self.cycles)
        if not per_device:
            return np.zeros(len(self.cycles), np.int64)
        return np.mean(list(per_device.values()), axis=0)  # type: ignore[no-any-return]


def _host_events(
    capture: Any, names: set[str]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Data-phase intervals and compile events on the host planes (absolute ns); the
    data-phase event names found go into ``names``."""
    from exporter.proto import xplane_pb2

    data: list[tuple[int, int]] = []
    compiles: list[tuple[int, int]] = []
    for ref in capture.host_planes:
        plane = capture.plane(ref)
        is_data = {}
        is_compile = {}
        for meta_id, meta in plane.event_metadata.items():
            name = meta.name or meta.display_name
            if name.startswith("$"):  # Python tracer frames: functions, not phases
                continue
            if COMPILE_EVENT_RE.match(name):
                pass  # a compilation is never data loading
            elif is_data_phase(name):
                is_data[meta_id] = True
                names.add(name)
            if COMPILE_EVENT_RE.match(name):
                is_compile[meta_id] = name.startswith("backend_compile")
        if not is_data and not is_compile:
            continue
        jax_compiles: list[tuple[int, int]] = []
        client_compiles: list[tuple[int, int]] = []
        for raw in plane.lines:
            line = xplane_pb2.XLine()
            line.ParseFromString(raw)
            base_ns = capture.line_start_ns(line.timestamp_ns)
            for event in line.events:
                meta_id = event.metadata_id
                if meta_id not in is_data and meta_id not in is_compile:
                    continue
                start = base_ns + event.offset_ps // _PS_PER_NS
                span = (start, start + event.duration_ps // _PS_PER_NS)
                if meta_id in is_data:
                    data.append(span)
                if meta_id in is_compile:
                    (jax_compiles if is_compile[meta_id] else client_compiles).append(span)
        compiles.extend(jax_compiles or client_compiles)
    return data, compiles


def _host_communication(
    events: Any, cycles: Sequence[tuple[int, int]], opcodes: dict[str, dict[str, str]]
) -> tuple[np.ndarray, dict[str, float]]:
    """On CPU: per cycle, ns a collective op runs on the XLA client threads while no
    device computes.

    An op is a collective by its HLO opcode (``opcodes``: program -> op name -> opcode,
    from the capture's HLO protos) or, without one, by its name. The opcode is needed:
    JAX names an instruction after its primitive, so the all-reduce of ``lax.psum`` is
    ``psum.7`` on the host threads, which no name rule can tell from a user's op.

    Only the time no other XLA op runs counts. A CPU "device" is a set of threads
    sharing the host's cores: a device that reaches an all-reduce first waits inside it
    (``Rendezvous``) while the others compute on those cores, often one after another;
    ``bench/communication.py`` measured a step with one all-reduce of 8 floats (0.5 %
    of the step when timed alone) at 42 % when any thread's collective time counted.
    Time the machine computes is not lost to communication; the rest of the
    collectives' time is (what the step would save without them).
    """
    from exporter.analysis.facts.collectives import COMMUNICATION_CATEGORIES, is_communication

    if not len(events):
        return np.zeros(len(cycles), float), {}

    def kind(program: str, op: str) -> str | None:
        opcode = opcodes.get(program, {}).get(op, "")
        if opcode in COMMUNICATION_CATEGORIES:
            return opcode
        return op.split(".", maxsplit=1)[0] if is_communication(op) else None

    kind_of: dict[int, str] = {}
    inside_paths: list[int] = []  # ops under a collective (a path is program, ops...)
    for i, path in enumerate(events.paths):
        if len(path) < 2:
            continue
        if (found := kind(path[0], path[-1])) is not None:
            kind_of[i] = found
        if any(kind(path[0], op) is not None for op in path[1:-1]):
            inside_paths.append(i)
    if not kind_of:
        return np.zeros(len(cycles), float), {}
    mask = np.isin(events.path_index, list(kind_of))
    # Compute: every other op but those that hold a collective (its loop) and those
    # inside one.
    holds = np.zeros(len(events), bool)
    parent = events.parent.tolist()
    for i in np.flatnonzero(mask).tolist():
        up = parent[i]
        while up >= 0 and not holds[up]:
            holds[up] = True
            up = parent[up]
    compute = ~mask & ~holds & ~np.isin(events.path_index, inside_paths)
    starts, ends = union(events.start[mask], events.end[mask])
    if compute.any():
        starts, ends = subtract(starts, ends, *union(events.start[compute], events.end[compute]))
    kinds: dict[str, float] = {}
    for i, ns in zip(events.path_index[mask].tolist(), (events.end - events.start)[mask].tolist(),
                     strict=True):  # fmt: skip
        kinds[kind_of[i]] = kinds.get(kind_of[i], 0.0) + ns
    # Each device's thread runs its own copy of a collective (4 overlapping ``psum.7``
    # on 4 forced CPU devices): scaled to the time counted above, the kinds split the
    # communication time the breakdown reports, not a multiple of it.
    total = float(sum(kinds.values()))
    counted = float((ends - starts).sum())
    kinds = {kind: ns * counted / total for kind, ns in kinds.items()} if total > 0 else {}
    return covered(starts, ends, cycles).astype(float), kinds


def _host_facts(path: Path, facts: CaptureFacts) -> _Host:
    from exporter.analysis.facts.collectives import CommunicationRecorder, overlap_facts
    from exporter.analysis.facts.gpu_kernels import kernel_tap, read_kernels
    from exporter.analysis.facts.programs import capture_hlo_ops, unreadable_hlo
    from exporter.analysis.sides import xla_host
    from exporter.analysis.sides.load import step_cycles
    from exporter.profiles.steps import step_windows
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

    with load_capture(path) as capture:
        hlo_damaged: dict[str, str] = {}
        hlo_error: str | None = None
        try:  # the capture's HLO is context (opcodes, sources), never a report's failure
            programs = capture_hlo_ops(capture, hlo_damaged)
        except Exception as exc:
            programs, hlo_error = {}, unreadable_hlo(exc)
        windows, source = step_windows(capture)
        step_list = step_cycles(windows)
        cycles = [(w.start_ns, w.end_ns) for w in step_list]
        annotations = sorted((w.start_ns, w.end_ns) for w in windows if w.end_ns > w.start_ns)
        start, duration = capture.time_range()
        device: FlameGraph | None = None
        kernels = None
        if capture.device_planes:
            facts.backend = next(
                (p.name.split(":")[1].lower() for p in capture.device_planes), "unknown"
            )
            recorder = CommunicationRecorder(capture)
            capture.on_op_line = device_busy = _DeviceBusy(cycles, recorder)
            # The kernel facts take the GPU stream lines' stats from the graph's read.
            capture.stream_tap = kernels = kernel_tap(capture)
            reader = graph_reader.get() or (lambda _path, read, _kind: device_flamegraph(read))
            try:
                device = reader(path, capture, "device")
            finally:
                capture.on_op_line = capture.stream_tap = None
            busy = device_busy.per_cycle()
            communication = recorder.per_cycle(cycles)
            kinds = recorder.kinds()
            overlap = overlap_facts(recorder, len(cycles))
            xla_starts = xla_ends = np.zeros(0, np.int64)
        else:
            facts.backend = "cpu"
            events = xla_host.xla_host_events(capture)
            xla_starts, xla_ends = union(events.start, events.end)
            busy = covered(xla_starts, xla_ends, cycles)
            opcodes = {
                program: {name: op.opcode for name, op in ops.items()}
                for program, ops in programs.items()
            }
            communication, kinds = _host_communication(events, cycles, opcodes)
            overlap = None
            if len(events):
                device = xla_host.graphs(events, None, start)[0]
        data, compiles = _host_events(capture, facts.data_phase_names)
        data_starts, data_ends = union(
            np.asarray([s for s, _ in data], np.int64), np.asarray([e for _, e in data], np.int64)
        )
        if len(xla_starts):
            data_starts, data_ends = subtract(data_starts, data_ends, xla_starts, xla_ends)
        data_phase = covered(data_starts, data_ends, cycles)
        # Compiling inside a step: host time with no XLA running that is neither input
        # nor other host work (counted once: not where a data phase already covers it).
        c_starts, c_ends = union(
            np.asarray([s for s, _ in compiles], np.int64),
            np.asarray([e for _, e in compiles], np.int64),
        )
        for starts, ends in ((xla_starts, xla_ends), (data_starts, data_ends)):
            if len(starts) and len(c_starts):
                c_starts, c_ends = subtract(c_starts, c_ends, starts, ends)
        compile_phase = covered(c_starts, c_ends, cycles)
        gpu = read_kernels(capture, cycles, kernels) if capture.device_planes else None
        given = graph_reader.get()
        host = host_flamegraph(capture) if given is None else given(path, capture, "host")
        graphs = {"device": device, "host": host}
        for kind, whole in graphs.items():
            if whole is None:
                continue
            whole.duration_nanos = whole.duration_nanos or duration
            graph = facts.graphs.get(kind)
            if graph is None:
                facts.graphs[kind] = whole
            else:
                graph.merge(whole)
        facts.files.append(str(path))
        if facts.steps is None and source != "none":
            facts.steps = {"source": source}
    return _Host(
        cycles,
        annotations,
        np.asarray(busy, float),
        data_phase.astype(float),
        compiles,
        compile_phase.astype(float),
        path,
        [w.step for w in step_list],
        np.asarray(communication, float),
        kinds,
        overlap,
        gpu,
        programs,
        hlo_damaged,
        hlo_error,
    )


def _step_facts(hosts: list[_Host]) -> StepFacts | None:
    """Step time: one definition, the step *cycle* (a step's start to the next's start,
    so input between annotations counts), beside the annotated steps and XProf's."""
    annotated = [(hi - lo) / 1e6 for h in hosts for lo, hi in h.annotations]
    durations = [(hi - lo) / 1e6 for h in hosts for lo, hi in h.cycles]
    if not annotated or not durations:
        return None
    mean = statistics.fmean(durations)
    median = statistics.median(durations)
    spread = statistics.pstdev(durations) if len(durations) > 1 else 0.0
    # Modified z-score (Iglewicz & Hoaglin) with a MAD floor, as XProf's straggler signal,
    # within each host: a host slower in every step is a straggler (hosts), not slow steps.
    outliers = []
    for h in hosts:
        own = [(hi - lo) / 1e6 for lo, hi in h.cycles]
        if not own:
            continue
        center = statistics.median(own)
        mad = statistics.median(abs(d - center) for d in own)
        mad = max(mad, STEP_MAD_FLOOR * center)
        outliers += [
            (d, d - center) for d in own if mad > 0 and 0.6745 * (d - center) / mad > STEP_OUTLIER_Z
        ]
    outliers.sort()
    # XProf's step time drops each host's first and last step (often partial).
    inner = [(hi - lo) / 1e6 for h in hosts for lo, hi in h.cycles[1:-1]]
    return {
        "definition": "step cycle: one step's start to the next step's start",
        "count": len(durations),
        "mean_ms": round(mean, 3),
        "median_ms": round(median, 3),
        "p90_ms": round(float(np.percentile(durations, 90)), 3),
        "min_ms": round(min(durations), 3),
        "max_ms": round(max(durations), 3),
        "stdev_ms": round(spread, 3),
        "cv": round(spread / mean, 3) if mean else 0.0,
        "outliers": len(outliers),
        "outlier_ms": [round(d, 3) for d, _ in outliers[-5:]],
        "outlier_excess_ms": round(sum(excess for _, excess in outliers), 3),
        "annotated_median_ms": round(statistics.median(annotated), 3),
        "xprof_mean_ms": round(statistics.fmean(inner), 3) if inner else None,
        "cycle_mean_ms": round(mean, 3),
    }


def _breakdown(hosts: list[_Host]) -> Breakdown | None:
    total = sum(hi - lo for h in hosts for lo, hi in h.cycles)
    if total <= 0:
        return None
    xla = float(sum(h.xla_busy.sum() for h in hosts))
    data = float(sum(h.data_phase.sum() for h in hosts))
    inside = 0
    for h in hosts:
        starts = np.asarray([s for s, _ in h.annotations], np.int64)
        ends = np.asarray([e for _, e in h.annotations], np.int64)
        merged = union(starts, ends)
        inside += int(covered(*merged, h.cycles).sum())
    between = total - inside
    idle = max(0.0, total - xla)
    # The gap between step annotations has no XLA work of this step in it (an
    # asynchronous dispatch finishing there is counted as XLA already).
    # The data phase first: a loader annotated between the steps (the demo's
    # input_pipeline) is the data phase, and the rest of the gap is "between steps".
    data = min(data, idle)
    between_idle = min(float(between), idle - data)
    compiling = float(sum(h.compile_phase.sum() for h in hosts))
    compiling = min(compiling, idle - between_idle - data)
    pct = 100.0 / total
    comm = float(sum(h.communication.sum() for h in hosts if h.communication is not None))
    comm = min(comm, xla)
    cycles = sum(len(h.cycles) for h in hosts)
    kinds: dict[str, float] = {}
    for h in hosts:
        for kind, ns in h.kinds.items():
            kinds[kind] = kinds.get(kind, 0.0) + ns
    overlaps = [h.overlap for h in hosts if h.overlap]
    return {
        "cycle_total_ms": round(total / 1e6, 3),
        "xla_pct": round(xla * pct, 2),
        "compute_pct": round((xla - comm) * pct, 2),
        "communication_pct": round(comm * pct, 2),
        "communication_ms_per_step": round(comm / cycles / 1e6, 4) if cycles else 0.0,
        "communication_by_kind_ms": {  # per step, the largest kinds
            k: round(v / cycles / 1e6, 4)
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:6]
            if cycles
        },
        "communication_overlap": _overlap(overlaps),
        "input_wait_pct": round(idle * pct, 2),
        "data_phase_pct": round(data * pct, 2),
        "between_steps_pct": round(between_idle * pct, 2),
        "compile_pct": round(compiling * pct, 2),
        "host_other_pct": round(max(0.0, idle - data - between_idle - compiling) * pct, 2),
    }


def _overlap(found: list[Overlap]) -> Overlap | None:
    """The hosts' async-collective overlap, pooled (weighted by their windows' time)."""
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    span = sum(o["async_ms_per_step"] for o in found)
    exposed = sum(o["exposed_ms_per_step"] for o in found)
    return {
        "async_ops": sum(o["async_ops"] for o in found),
        "source": " and ".join(sorted({o["source"] for o in found})),
        "async_ms_per_step": round(span / len(found), 4),
        "hidden_pct": round(100 * (1 - exposed / span), 2) if span else 0.0,
        "exposed_ms_per_step": round(exposed / len(found), 4),
    }


def _top_ops(graph: FlameGraph | None) -> list[TopOp]:
    if graph is None or graph.root.total <= 0:
        return []
    from exporter.analysis.sides.xla_host import RUNTIME_WAIT_RE

    leaves: dict[str, int] = {}
    for _, node in graph.paths():
        # The executor waiting for its thunks is XLA time, but no op: never the top op.
        if node.self_value and not RUNTIME_WAIT_RE.match(node.name):
            leaves[node.name] = leaves.get(node.name, 0) + node.self_value
    ranked = sorted(leaves.items(), key=lambda kv: -kv[1])[:TOP_OPS]
    total = graph.root.total
    return [
        {"name": name, "self_ms": round(value / 1e6, 3), "share_pct": round(100 * value / total, 2)}
        for name, value in ranked
    ]


def _compiler(graph: FlameGraph | None) -> CompilerFacts | None:
    from exporter.analysis.facts.programs import DATA_FORMATTING_CATEGORY, DATA_FORMATTING_RE

    if graph is None or graph.root.total <= 0:
        return None
    formatting = 0
    ops: dict[str, int] = {}
    for ancestors, node in graph.paths():
        if not node.self_value:
            continue
        in_category = any(a.name == DATA_FORMATTING_CATEGORY for a in ancestors)
        if in_category or DATA_FORMATTING_RE.match(node.name):
            formatting += node.self_value
            ops[node.name] = ops.get(node.name, 0) + node.self_value
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:5]
    return {
        "data_formatting_pct": round(100 * formatting / graph.root.total, 2),
        "data_formatting_ms": round(formatting / 1e6, 3),
        "ops": [{"name": n, "self_ms": round(v / 1e6, 3)} for n, v in top],
    }


def _recompilation(hosts: list[_Host]) -> Recompilation:
    events = [span for h in hosts for span in h.compile_events]
    inside = [
        (s, e)
        for h in hosts
        for s, e in h.compile_events
        if any(lo <= s < hi for lo, hi in h.cycles)
    ]
    window = sum(hi - lo for h in hosts for lo, hi in h.cycles)
    inside_ns = sum(e - s for s, e in inside)
    return {
        "compilations": len(events),
        "in_steps": len(inside),
        "compile_ms": round(sum(e - s for s, e in events) / 1e6, 3),
        "in_steps_pct": round(100 * inside_ns / window, 2) if window else 0.0,
    }


def _memory(facts: CaptureFacts, memory_samples: Sequence[dict[str, Any]]) -> None:
    """Peak against capacity: XProf's memory_profile, else the SDK's memory samples."""
    tools = facts.xprof.get("tools", {}) if facts.xprof.get("available") else {}
    allocators = tools.get("memory_profile", {}).get("summary", {}).get("allocators", {})
    skipped = (facts.xprof.get("skipped") or {}).get("memory")
    best = None
    for name, found in allocators.items():
        peak, capacity = found.get("peak_bytes_in_use"), found.get("capacity_bytes")
        if peak and capacity:
            share = peak / capacity
            if best is None or share > best[0]:
                best = (share, peak, capacity, f"XProf memory_profile ({name})")
    for sample in memory_samples:
        peak, capacity = sample.get("peak_bytes_in_use"), sample.get("bytes_limit")
        if peak and capacity:
            share = peak / capacity
            if best is None or share > best[0]:
                best = (share, peak, capacity, "SDK memory_stats samples")
    if best is None:
        xprof = (
            f"XProf's memory_profile did not run ({skipped})"
            if skipped
            else f"XProf's memory_profile found no allocator in this {facts.backend.upper()} "
            "capture"
        )
        facts.unavailable["memory"] = (
            f"no device memory peak and capacity: {xprof} and no memory_stats() samples were "
            "given" + (" (JAX reports none on CPU)" if facts.backend == "cpu" else "")
        )
        return
    share, peak, capacity, source = best
    facts.memory = {
        "peak_bytes": int(peak),
        "capacity_bytes": int(capacity),
        "peak_pct": round(100 * share, 2),
        "source": source,
    }


def add_host_facts(facts: CaptureFacts, hosts: list[_Host], no_steps: str) -> None:
    """The step facts, the breakdown and the per-host facts of ``hosts`` (each one capture
    file, however it was read); ``no_steps``: why there are no steps, if there are none."""
    steps = _step_facts(hosts)
    if steps is None:
        facts.unavailable["steps"] = (
            f"{no_steps}: step time, its spread and the input-wait share are unknown, not zero"
        )
    else:
        facts.steps = (facts.steps or {}) | steps
        facts.breakdown = _breakdown(hosts)
    _hosts(facts, hosts)


def gather_facts(
    paths: Sequence[Path],
    *,
    xprof: bool = True,
    memory_samples: Sequence[dict[str, Any]] = (),
    xprof_max_mb: float | None = None,
) -> CaptureFacts:
    """Every fact of one session's (or one file's) captures; see the module docstring.

    ``xprof_max_mb``: no XProf converter runs on captures larger than this (MB, all
    files together); default the setting ``MLPROF_REPORT_XPROF_MAX_CAPTURE_MB``.
    """
    from exporter.errors import InputError

    if not paths:
        raise InputError("nothing to analyse: no XProf capture (*.xplane.pb)")
    facts = CaptureFacts()
    hosts = [_host_facts(path, facts) for path in paths]
    add_host_facts(
        facts,
        hosts,
        "no step markers (no Steps line on a device, no StepTraceAnnotation on the host)",
    )
    device = facts.graphs.get("device")
    if device is None:
        facts.unavailable["device"] = "no XLA computations in this capture (no device plane, "
        "no XLA client thread events): device time and top ops are unknown"
    facts.top_ops = _top_ops(device)
    facts.compiler = _compiler(device)
    facts.recompilation = _recompilation(hosts)
    from exporter.analysis.facts.gpu_kernels import gpu_kernel_facts

    # gpu_kernels.py builds its JSON as a plain dict: its shape is GpuKernelFacts.
    facts.gpu_kernels = cast(
        GpuKernelFacts, gpu_kernel_facts([h.gpu for h in hosts], facts.backend)
    )
    from exporter.analysis.facts.programs import add_program_facts

    # Each capture's HLO, read with its host's facts: merged, not read again.
    merged: dict[str, dict[str, Any]] = {}
    damaged: dict[str, str] = {}
    for h in hosts:
        for program, found in h.programs.items():
            merged.setdefault(program, {}).update(found)
        damaged.update(h.hlo_damaged)
        if h.hlo_error is not None:
            facts.unavailable["hlo"] = h.hlo_error
    programs = (merged, damaged)
    started = time.perf_counter()
    if xprof:
        _xprof_facts(facts, paths, programs[0], bool(programs[0] or programs[1]), xprof_max_mb)
    else:
        facts.xprof = {"available": False, "reason": "not asked"}
    facts.xprof["seconds"] = round(time.perf_counter() - started, 3)
    _memory(facts, memory_samples)
    add_program_facts(facts, paths, programs)
    return facts


def _xprof_facts(
    facts: CaptureFacts,
    paths: Sequence[Path],
    programs: dict[str, Any],
    has_hlo_protos: bool,
    max_capture_mb: float | None,
) -> None:
    """``facts.xprof``: the converters whose facts this capture can have, if not too large."""
    from exporter.analysis.facts.xprof_tools import capture_limit_mb, plan_tools

    plan = plan_tools(
        backend=facts.backend,
        has_steps=facts.steps is not None,
        has_hlo_protos=has_hlo_protos,
        ops_without_hlo=sum(
            1 for top in facts.top_ops if not any(top["name"] in ops for ops in programs.values())
        ),
        capture_bytes=sum(capture_bytes(p) for p in paths),
        max_capture_mb=capture_limit_mb() if max_capture_mb is None else max_capture_mb,
    )
    facts.xprof = run_tools(paths, plan.tools) | plan.to_json()
    if plan.over_limit:
        facts.unavailable["xprof"] = (
            f"{plan.over_limit}; not checked with XProf: {', '.join(sorted(plan.skipped))}"
        )
    elif plan.tools and not facts.xprof.get("available"):
        facts.unavailable["xprof"] = str(facts.xprof.get("reason"))


def _hosts(facts: CaptureFacts, hosts: list[_Host], *, mad_floor: float | None = None) -> None:
    """``facts.hosts``; with 2 hosts the straggler verdict is said to be unknown.
    ``mad_floor``: the straggler score's, if not the shipped one (bench/stragglers.py)."""
    from exporter.analysis.facts.hosts import (
        STRAGGLER_MAD_FLOOR,
        STRAGGLER_MIN_HOSTS,
        host_entries,
        host_name,
    )

    facts.hosts = host_entries(
        [
            (h.path or Path("?"), h.cycles, h.steps or [None] * len(h.cycles), h.xla_busy,
             h.communication if h.communication is not None else np.zeros(len(h.cycles)))
            for h in hosts
        ],
        mad_floor=STRAGGLER_MAD_FLOOR if mad_floor is None else mad_floor,
    )  # fmt: skip
    names = {host_name(h["file"]) for h in facts.hosts}
    if len(names) < len(facts.hosts):
        facts.unavailable["stragglers"] = (
            f"{len(facts.hosts)} captures of {len(names)} hosts (a host captured more than "
            "once): stragglers are judged between the hosts of one session, so none is named"
        )
    elif 1 < len(facts.hosts) < STRAGGLER_MIN_HOSTS:
        facts.unavailable["stragglers"] = (
            f"{len(facts.hosts)} hosts: telling a straggler from the rest needs at least "
            f"{STRAGGLER_MIN_HOSTS} (XProf's rule), so none is named"
        )


def run_tools(paths: Sequence[Path], tools: Sequence[str]) -> dict[str, Any]:
    """XProf's ``tools`` on ``paths`` in a bounded child (xprof_tools.run_xprof_tools)."""
    from exporter.analysis.facts.xprof_tools import run_xprof_tools

    return run_xprof_tools(paths, tools)
