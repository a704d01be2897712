"""What BASE or HEAD names, read into flame graphs: whole, and one per step when it can.

A side is any of:

* an XProf capture (``*.xplane.pb``);
* a device-memory pprof (JAX's ``device_memory_profile()``) or a pprof this project
  wrote (``<capture>.xprof_device.pb.gz`` beside a session's capture, ``mlprof
  flamegraph --format pprof``);
* a session: its directory, or its id in the session store (every host's capture);
* ``run:<run_id>``: every finished session of the run in the store, merged (for
  ``--kind memory``, the run's device-memory profiles in the shared directory);
* ``run:<run_id>~N``: the run's N newest finished sessions, each its own side: a
  comparison's replicates (:func:`expand_replicates`);
* a torch.profiler trace (Kineto JSON, plain or gzipped; :mod:`exporter.profiles.torch_trace`);
* ``pyroscope:{service_name="…",run_id="…"}``: a Pyroscope selection over
  ``--from``/``--until``, fetched with ``SelectMergeProfile`` (``MLPROF_PYROSCOPE_URL``).

Read without ``--kind``, a capture is the **step view**: the device work (XLA ops on
device planes, or on a CPU capture the XLA computations on its host threads) and,
beside it under one ``host`` frame, what the host's own threads did (the Python
thread's annotated phases, ``input_pipeline``, and its dispatch and waits) without the
XLA thread pools, whose time the device part already holds. It is what explains a
step: a slow input pipeline and a slow kernel both show in it. ``--kind`` narrows.

Captures with step markers also give one graph per *step cycle*: from one step's start
to the next step's start (the last step ends with its own end), so that time spent
between two step annotations (an input pipeline that is not annotated as part of the
step) still belongs to a step. Each host's steps are separate samples.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from exporter.errors import ConfigError, InputError
from exporter.profiles.capture_files import (
    CAPTURES_NAMED,
    find_captures,
    find_regular,
    is_capture_name,
)
from exporter.profiles.convert import KINDS, Kind, is_pprof
from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.torch_trace import find_traces, is_torch_trace, is_trace_name
from exporter.profiles.tree_graphs import FRAME_SLOTS, frame_maker

if TYPE_CHECKING:
    from exporter.analysis.sides import cache as side_cache
    from exporter.capture.session import SessionRecord
    from exporter.profiles.steps import StepWindow
    from exporter.profiles.xplane import Capture

__all__ = [
    "KINDS",
    "MAX_STEP_SAMPLES",
    "XLA_THREAD",
    "Kind",
    "Side",
    "SideContext",
    "capture_side",
    "decode_capture_kinds",
    "expand_replicates",
    "join_step_view",
    "load_side",
    "load_sides",
    "one_kind_of_run",
    "run_session_files",
    "run_spec",
    "sample_cycles",
    "step_cycles",
    "step_view",
    "step_views",
]

log = logging.getLogger(__name__)

RUN_PREFIX = "run:"
PYROSCOPE_PREFIX = "pyroscope:"
# Steps kept as samples per capture. A rank test across 200 steps a side already
# resolves a fraction of a point of share; a fast workload's capture can hold thousands
# of steps, and each sample is a flame graph to build. More are spread evenly.
MAX_STEP_SAMPLES = 200
# Sessions one run:<run_id>~N side may name: each is a capture to read.
MAX_REPLICATES = 32
# What a run id may be (the SDK's, or $MLPROF_RUN_ID): one path component, bounded.
RUN_ID_RE = _RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$")
# The step view's frame holding the host threads' own time.
HOST_FRAME = "host"
# Host threads that run XLA's own work (the CPU client, Eigen and runtime pools): the
# device part of the step view already holds their time.
XLA_THREAD = re.compile(r"^(tf_)?(xla|pjrt|pjrtcpu)|eigen", re.IGNORECASE)
# pprof sample types -> the kind of flame graph they are.
_SAMPLE_KINDS: dict[str, Kind] = {
    "device_time": "device",
    "wall": "host",
    "cpu": "host",
    "samples": "host",
    "inuse_space": "memory",
    "space": "memory",
    "alloc_space": "memory",
}


@dataclass
class Side:
    """One side of a comparison (or the input of an analysis).

    ``whole`` holds all of the side's time (or bytes); ``steps`` one graph per step
    cycle of every host (empty when the side has no step markers); ``step_ns`` the
    length of each cycle.
    """

    spec: str
    source: str  # what was read: capture, session, run, memory_profile, pprof, pyroscope
    kind: Kind
    whole: FlameGraph
    steps: list[FlameGraph] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    step_source: str = "none"  # device_steps | host_step_annotations | none
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Which noise model fits the values (see analysis.noise): the kind, or "xla_host"
    # for the device view of a CPU capture (XLA thunks on host threads).
    view: str = ""
    # "step": the step view (device work and the host's phases, see the module doc);
    # "" for one kind alone.
    scope: str = ""
    # Names of the host's step annotations (their self time is the host waiting inside
    # the step, not work of its own).
    step_names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.view = self.view or self.kind

    def describe(self) -> dict[str, object]:
        """The side as the comparison JSON shows it (``base``/``head``)."""
        return {
            "spec": self.spec,
            "source": self.source,
            "files": self.files,
            "steps": len(self.steps),
            "step_source": self.step_source,
            "view": "step" if self.scope == "step" else self.kind,
            "total": self.whole.root.total,
            "notes": self.notes,
        }


@dataclass
class SideContext:
    """Where names are looked up: the session store, the shared dir, Pyroscope."""

    store: str | None = None
    shared_dir: Path | None = None
    pyroscope_url: str | None = None
    pyroscope_headers: dict[str, str] = field(default_factory=dict)
    time_from: str | None = None
    time_until: str | None = None
    profile_type: str | None = None
    fetch: Callable[..., FlameGraph] | None = None  # tests may hand in their own


def step_cycles(windows: Sequence[StepWindow]) -> list[StepWindow]:
    """Step windows widened to cycles: each ends where the next step starts.

    Windows of the same step number (several devices of one host) are merged first;
    overlapping windows keep their own end.
    """
    from exporter.profiles.steps import StepWindow

    merged: dict[object, StepWindow] = {}
    loose: list[StepWindow] = []
    for window in windows:
        if window.end_ns <= window.start_ns:
            continue
        if window.step is None:
            loose.append(window)
            continue
        seen = merged.get(window.step)
        merged[window.step] = (
            window
            if seen is None
            else StepWindow(
                min(seen.start_ns, window.start_ns), max(seen.end_ns, window.end_ns), window.step
            )
        )
    ordered = sorted([*merged.values(), *loose], key=lambda w: (w.start_ns, w.end_ns))
    cycles = []
    for i, window in enumerate(ordered):
        end = window.end_ns
        if i + 1 < len(ordered):
            end = max(end, ordered[i + 1].start_ns)
        cycles.append(StepWindow(window.start_ns, end, window.step))
    return cycles


def sample_cycles(cycles: list[StepWindow], limit: int = MAX_STEP_SAMPLES) -> list[StepWindow]:
    """At most ``limit`` cycles, evenly spread over the capture (every one when fewer)."""
    if len(cycles) <= limit:
        return cycles
    picks = sorted({round(i * (len(cycles) - 1) / (limit - 1)) for i in range(limit)})
    return [cycles[i] for i in picks]


def capture_side(
    capture: Capture, kind: Kind | None = None, cache: dict[str, Any] | None = None
) -> tuple[Literal["device", "host"], FlameGraph, list[FlameGraph], list[int], str, str]:
    """One capture's kind, whole graph, per-cycle graphs, cycle lengths, step source and
    noise view (``xla_host`` for the device view of a CPU capture, else the kind).

    ``device`` on a capture without device planes (JAX on CPU) is the XLA computations
    that ran on its host threads (:mod:`exporter.analysis.sides.xla_host`); it is also the
    default there when such computations exist, as the steadiest view to compare (the
    host view attributes waiting time to different frames from one process to the next).
    ``cache`` keeps the step windows and XLA events between calls for several kinds.
    """
    from exporter.profiles.convert import flamegraph_from_capture
    from exporter.profiles.steps import step_windows, whole_and_windowed_flamegraphs

    if kind == "memory":
        raise InputError(
            f"{capture.source}: is an XProf capture; --kind memory needs device-memory "
            "profiles (from jax.profiler.device_memory_profile())"
        )
    cache = {} if cache is None else cache
    if "windows" not in cache:
        cache["step_names"] = set()
        cache["windows"] = step_windows(capture, cache["step_names"])
    windows, source = cache["windows"]
    cycles = sample_cycles(step_cycles(windows))
    spans = [(w.start_ns, w.end_ns) for w in cycles]
    lengths = [hi - lo for lo, hi in spans]
    if kind != "host" and not capture.device_planes:
        from exporter.analysis.sides import xla_host

        if "events" not in cache:
            cache["events"] = xla_host.xla_host_events(capture)
        events = cache["events"]
        if len(events):
            start, duration = capture.time_range()
            [whole] = xla_host.graphs(events, None, start)
            whole.duration_nanos = duration
            steps = xla_host.graphs(events, spans, start) if spans else []
            return "device", whole, steps, lengths, source if spans else "none", "xla_host"
        if kind == "device":
            flamegraph_from_capture(capture, "device")  # raises the reader's own error
    chosen: Literal["device", "host"] = kind or ("device" if capture.device_planes else "host")
    if not cycles:
        return chosen, flamegraph_from_capture(capture, chosen), [], [], "none", chosen
    # One pass over the capture: the (sampled) cycles, and the time around them for the
    # whole graph.
    whole, graphs = whole_and_windowed_flamegraphs(capture, chosen, cycles)
    if whole.root.total == 0:
        flamegraph_from_capture(capture, chosen)  # raises the reader's own error
    return chosen, whole, graphs, lengths, source, chosen


def step_view(device: FlameGraph, host: FlameGraph) -> FlameGraph:
    """The step view of one graph pair: device frames, and the host's own threads under
    :data:`HOST_FRAME` (threads of XLA's pools left out: the device part holds them)."""
    return step_views([device], [host])[0]


def step_views(devices: Sequence[FlameGraph], hosts: Sequence[FlameGraph]) -> list[FlameGraph]:
    """:func:`step_view` of each pair, the device graphs copied together.

    A report builds the view of each of hundreds of step graphs: the device graphs are
    copied (as ``FlameGraph.copy`` does, the root named "root") by the compiled frame
    maker in one call where their values are integers, frame by frame otherwise, and
    only the totals the host part changes are recomputed (a device graph's are already
    self plus children, as every reader builds them: ``FlameGraph.check``).
    ``tests/unit/test_diff_align.py`` holds this equal to copy, merge and recompute.
    """
    if any(d.companions for d in devices):  # none from a capture: the long way
        outs = [d.copy() for d in devices]
    else:
        outs = [replace(d, root=Frame("root"), comments=list(d.comments)) for d in devices]
        _copy_trees(devices, outs)
    for out, host in zip(outs, hosts, strict=True):
        own = [t for t in host.root.children.values() if not XLA_THREAD.search(t.name)]
        if not own:
            continue
        top = out.root.child(HOST_FRAME)
        stack = [(top, thread) for thread in own]
        while stack:
            mine, theirs = stack.pop()
            node = mine.child(theirs.name, theirs.file, theirs.line)
            node.self_value += theirs.self_value
            stack.extend((node, child) for child in theirs.children.values())
        if out.companions:
            out.recompute_totals()
            continue
        _retotal(top)
        root = out.root
        root.total = root.self_value + sum(c.total for c in root.children.values())
    return outs


def _copy_trees(sources: Sequence[FlameGraph], outs: list[FlameGraph]) -> None:
    """Each source's frames copied below the matching out's root (values, children in
    order); the roots take the sources' root values."""
    nodes: list[Frame] = []
    keys: list[tuple[str, str, int]] = []
    parents: list[int] = []
    sizes: list[int] = []
    for graph in sources:  # rows: each graph's root, then its frames parents first
        start = len(nodes)
        nodes.append(graph.root)
        keys.append(("root", "", 0))  # a root row's key is not read
        parents.append(0)
        stack = [(graph.root, start)]
        pop, push = stack.pop, stack.append
        while stack:
            node, row = pop()
            for key, child in node.children.items():
                push((child, len(nodes)))
                nodes.append(child)
                keys.append(key)
                parents.append(row)
        sizes.append(len(nodes) - start)
    own = np.array([n.self_value for n in nodes])
    total = np.array([n.total for n in nodes])
    maker = frame_maker()
    if maker is None or own.dtype != np.int64 or total.dtype != np.int64:
        for graph, out in zip(sources, outs, strict=True):
            _copied(graph.root, out.root)
        return
    window = np.repeat(np.arange(len(sources), dtype=np.int64), sizes)
    frame = np.arange(len(nodes), dtype=np.int64)
    frame[np.cumsum([0, *sizes[:-1]], dtype=np.int64)] = 0  # 0: the window's root
    rows = (window, frame, own, total, np.asarray(parents, np.int64))
    maker.make(Frame, FRAME_SLOTS, [out.root for out in outs], keys, *rows)


def _copied(source: Frame, root: Frame) -> None:
    """``root`` given ``source``'s values and a copy of its subtree (children in order)."""
    root.self_value += source.self_value
    root.total += source.total
    stack = [(source, root)]
    pop, push = stack.pop, stack.append
    while stack:
        theirs, mine = pop()
        kids = mine.children
        for key, child in theirs.children.items():
            made = kids[key] = Frame(*key)
            made.self_value = child.self_value
            made.total = child.total
            push((child, made))


def _retotal(top: Frame) -> None:
    """Every total under and at ``top`` set to self plus children (deepest first)."""
    order = [top]
    for node in order:  # breadth first: each node after its parent
        order.extend(node.children.values())
    for node in reversed(order):
        node.total = node.self_value + sum(c.total for c in node.children.values())


def join_step_view(device: Side, host: Side) -> Side:
    """Two kinds of one input joined into its step view (each graph pair by position)."""
    if device.kind != "device" or len(device.steps) != len(host.steps):
        return device  # nothing to join, or steps that do not pair up: the device alone
    views = step_views([device.whole, *device.steps], [host.whole, *host.steps])
    return Side(
        device.spec,
        device.source,
        "device",
        views[0],
        views[1:],
        list(device.step_ns),
        device.step_source,
        list(device.files),
        [*device.notes, *(n for n in host.notes if n not in device.notes)],
        view=device.view,
        scope="step",
        step_names=device.step_names | host.step_names,
    )


def _read_capture(path: Path, kind: Kind | None, side: Side | None) -> Side:
    if kind is None and (side is None or side.scope == "step"):
        try:
            device, host = _read_capture_kinds(path, ["device", "host"], [None, None])
        except InputError:  # no device work at all: the host view is the whole story
            return _read_capture_kinds(path, [None], [side])[0]
        one = join_step_view(device, host)
        return one if side is None else _merge_sides(side, one)
    return _read_capture_kinds(path, [kind], [side])[0]


def _merge_sides(side: Side, one: Side) -> Side:
    side.whole.merge(one.whole)
    side.steps.extend(one.steps)
    side.step_ns.extend(one.step_ns)
    side.files.extend(one.files)
    side.step_names |= one.step_names
    if one.step_source != "none" and side.step_source == "none":
        side.step_source = one.step_source
    return side


def _read_capture_kinds(
    path: Path, kinds: Sequence[Kind | None], sides: Sequence[Side | None]
) -> list[Side]:
    """One capture read once into a side per kind (each new, or merged into ``sides``).

    The reads come from the capture's side cache where it holds them
    (:mod:`exporter.analysis.sides.cache`), else from decoding the capture, once for
    every kind missing (the cache is then rewritten beside a session's capture).
    """
    from exporter.analysis.sides import cache as side_cache

    asked = [
        side.kind if side is not None else kind for kind, side in zip(kinds, sides, strict=True)
    ]
    reads, step_names = side_cache.read_capture(path, asked, decode_capture_kinds)
    chosen_reads = [reads[side_cache.key_of(kind)] for kind in asked]
    for read in chosen_reads:
        side_cache.raise_error(read)  # the first kind's error first, as decoding raised it
    out = []
    used: set[int] = set()
    for read, side in zip(chosen_reads, sides, strict=True):
        assert read.whole is not None
        whole, steps = read.whole, read.steps
        if id(read) in used:  # one read asked for twice: each side gets its own graphs
            whole, steps = whole.copy(), [g.copy() for g in steps]
        used.add(id(read))
        chosen: Kind = "device" if read.chosen == "device" else "host"
        merged = _merge_capture(path, side, chosen, whole, steps, list(read.step_ns), read.source)
        if side is None or read.view != side.kind:
            merged.view = read.view  # one CPU capture makes the whole side as noisy
        merged.step_names |= step_names  # read with the step windows
        out.append(merged)
    return out


def decode_capture_kinds(
    path: Path, kinds: list[str | None]
) -> tuple[dict[str, side_cache.CaptureRead], set[str] | None]:
    """Decode ``path`` once into a read per kind (an InputError of a kind is its read)."""
    from exporter.analysis.sides import cache as side_cache
    from exporter.profiles.xplane import load_capture

    reads: dict[str, side_cache.CaptureRead] = {}
    cache: dict[str, Any] = {}
    with load_capture(path) as capture:
        for kind in kinds:
            key = side_cache.key_of(kind)
            try:
                chosen, whole, steps, step_ns, source, view = capture_side(
                    capture,
                    kind,  # type: ignore[arg-type]
                    cache,
                )
            except InputError as exc:
                reads[key] = side_cache.CaptureRead(error=str(exc))
                continue
            reads[key] = side_cache.CaptureRead(chosen, whole, steps, step_ns, source, view)
    return reads, cache.get("step_names")


def _merge_capture(
    path: Path,
    side: Side | None,
    chosen: Kind,
    whole: FlameGraph,
    steps: list[FlameGraph],
    step_ns: list[int],
    source: str,
) -> Side:
    if side is None:
        return Side(str(path), "capture", chosen, whole, steps, step_ns, source, [str(path)])
    side.whole.merge(whole)
    side.steps.extend(steps)
    side.step_ns.extend(step_ns)
    side.files.append(str(path))
    if source != "none" and side.step_source == "none":
        side.step_source = source
    elif source == "none" and side.step_source != "none":
        side.notes.append(f"{path.name}: no step markers; its time is not in the steps")
    return side


def load_sides(
    spec: str, kinds: Sequence[Kind], context: SideContext | None = None
) -> dict[Kind, Side]:
    """``load_side`` for several kinds; a capture file or directory is read once."""
    from exporter.capture.inputs import resolve_input

    context = context or SideContext()
    path = resolve_input(spec, context.store)
    plain = not spec.startswith((RUN_PREFIX, PYROSCOPE_PREFIX)) and path.exists()
    captures = (
        find_captures(path)
        if plain and path.is_dir()
        else [path]
        if plain and not is_pprof(path) and not is_torch_trace(path)
        else []
    )
    if not captures or "memory" in kinds:
        return {kind: load_side(spec, kind, context) for kind in kinds}
    sides: list[Side | None] = [None] * len(kinds)
    for capture in captures:
        sides = list(_read_capture_kinds(capture, kinds, sides))
    out: dict[Kind, Side] = {}
    for kind, side in zip(kinds, sides, strict=True):
        assert side is not None
        if path.is_dir():
            side.spec, side.source = spec, "session"
        out[kind] = side
    return out


def _read_torch_trace(path: Path, kind: Kind | None, spec: str) -> Side:
    """A torch.profiler trace (:mod:`exporter.profiles.torch_trace`): the step view of its
    kernels and host threads (its host view without kernels), or ``kind``; its
    ``ProfilerStep#N`` cycles are the steps."""
    from exporter.profiles import torch_trace

    trace = torch_trace.load_torch_trace(path)
    if kind == "memory":
        graph = torch_trace.flamegraph_from_trace(trace, "memory")
        return Side(spec, "torch_trace", "memory", graph, files=[str(path)])
    kinds: list[Literal["device", "host"]] = (
        [kind] if kind else ["device", "host"] if trace.has_device else ["host"]
    )
    cycles = step_cycles(torch_trace.step_windows(trace))
    picked = sample_cycles(cycles)
    read = []
    for one in kinds:
        whole, steps = torch_trace.step_graphs(trace, one, picked, len(picked) == len(cycles))
        source = torch_trace.STEP_SOURCE if picked else "none"
        lengths = [w.end_ns - w.start_ns for w in picked]
        read.append(Side(spec, "torch_trace", one, whole, steps, lengths, source, [str(path)],
                         step_names={torch_trace.STEP_FRAME}))  # fmt: skip
    return read[0] if len(read) == 1 else join_step_view(*read)


def _pprof_kind(graph: FlameGraph) -> Kind:
    return _SAMPLE_KINDS.get(graph.sample_type, "host")


def _read_pprof(path: Path, kind: Kind | None) -> Side:
    from exporter.profiles.memory import load_memory_profile
    from exporter.profiles.pprof import decode_pprof, from_pprof

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not data:
        raise InputError(f"{path}: empty file, expected a pprof profile")
    try:
        profile = decode_pprof(data, str(path))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    table = profile.string_table
    types = [table[v.type] for v in profile.sample_type]
    if {"space", "inuse_space"} & set(types):
        graph, source = load_memory_profile(path), "memory_profile"
    else:
        try:
            graph, source = from_pprof(profile), "pprof"
        except (IndexError, KeyError, ValueError) as exc:
            raise InputError(f"{path}: corrupt pprof profile ({exc})") from None
    found = _pprof_kind(graph)
    if kind is not None and kind != found:
        raise InputError(
            f"{path}: is a {graph.sample_type} profile ({found}); it has no {kind} values "
            f"(use --kind {found})"
        )
    return Side(str(path), source, found, graph, files=[str(path)])


def _read_directory(directory: Path, kind: Kind | None, spec: str, source: str) -> Side:
    if kind == "memory":
        # Regular files only, no link followed: a session's directory is the store's.
        found = find_regular(directory, (".pprof.gz", ".pprof"))
        if not found:
            raise InputError(f"{directory}: no device-memory profiles (*.pprof.gz) here")
        return _merge_pprofs(found, kind, spec, source)
    captures = find_captures(directory)
    traces = [] if captures else find_traces(directory)  # tensorboard_trace_handler's
    if traces:
        merged = _read_torch_trace(traces[0], kind, spec)
        for path in traces[1:]:
            merged = _merge_sides(merged, _read_torch_trace(path, kind, spec))
        merged.spec, merged.source = spec, source
        return merged
    if not captures:
        raise InputError(f"{directory}: no XProf captures ({CAPTURES_NAMED}) in this directory")
    side: Side | None = None
    for path in captures:
        side = _read_capture(path, kind, side)
    assert side is not None
    side.spec, side.source = spec, source
    return side


def _merge_pprofs(paths: Sequence[Path], kind: Kind | None, spec: str, source: str) -> Side:
    merged: Side | None = None
    for path in paths:
        one = _read_pprof(path, kind)
        if merged is None:
            merged = one
            continue
        try:
            merged.whole.merge(one.whole)
        except ValueError as exc:
            raise InputError(f"{path}: {exc}") from None
        merged.files.append(str(path))
    assert merged is not None
    merged.spec, merged.source = spec, source
    return merged


def _read_run(run_id: str, kind: Kind | None, context: SideContext, spec: str) -> Side:
    if not _RUN_ID.fullmatch(run_id):
        raise ConfigError(f"{spec}: expected run:<run_id> (letters, digits, . _ : -)")
    if kind == "memory":
        return _read_run_memory(run_id, context, spec)
    from exporter.capture.store import SessionStore

    if context.store is None:
        raise ConfigError(f"{spec}: needs the session store (--store or MLPROF_STORE)")
    store = SessionStore(context.store)
    records, other_kind = one_kind_of_run(store.run_sessions(run_id), spec)
    if not records:
        raise InputError(f"{spec}: no finished capture session of run {run_id!r} in {store.url}")
    side: Side | None = None
    merged: list[str] = []
    skipped: list[str] = []
    for record in records:
        for name in run_session_files(record):
            try:
                # A remote session is copied once (the side's files stay readable).
                path = store.local_copy_file(record.id, name)
                if path is None:
                    raise InputError(f"{record.id}: no longer in the store")
                if is_trace_name(name):  # a torch.profiler trace the sidecar took
                    one = _read_torch_trace(path, kind, spec)
                    side = one if side is None else _merge_sides(side, one)
                else:
                    side = _read_capture(path, kind, side)
            except (InputError, ValueError, OSError) as exc:
                # One unreadable capture must not hide the rest of the run.
                skipped.append(f"{record.id}/{name} ({str(exc)[:120]})")
                continue
            if record.id not in merged:
                merged.append(record.id)
    if side is None:
        detail = f": {'; '.join(skipped)}" if skipped else ""
        raise InputError(f"{spec}: the run's sessions hold no readable XProf capture{detail}")
    side.spec, side.source = spec, "run"
    side.notes.append(f"{len(merged)} sessions merged: {', '.join(merged)}")
    if other_kind:
        side.notes.append(other_kind)
    side.notes.extend(f"skipped {s}" for s in skipped)
    return side


def _read_run_memory(run_id: str, context: SideContext, spec: str) -> Side:
    import os
    import tempfile

    from exporter import schema
    from exporter.profiles.pprof import InflateLimits
    from exporter.regular_files import open_directory, read_regular_at

    if context.shared_dir is None:
        raise ConfigError(f"{spec} --kind memory: needs the shared dir (MLPROF_SHARED_DIR)")
    directory = context.shared_dir / schema.MEMORY_DIR
    suffix, meta_suffix = schema.MEMORY_PROFILE_SUFFIX, schema.MEMORY_META_SUFFIX
    # The workload writes memory/: the directory made a link elsewhere is refused, and
    # each profile is read once from it, no link followed, into a private copy that the
    # pprof readers then open (they follow links: they also read the CLI user's paths).
    try:
        dir_fd: int | None = open_directory(directory, below=context.shared_dir)
    except FileNotFoundError:
        dir_fd = None
    except OSError as exc:
        raise InputError(f"{spec}: {exc}") from None
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mlprof-memory-") as tmp:
        copies: dict[str, str] = {}  # private copy -> the profile it was read from
        if dir_fd is not None:
            try:
                with os.scandir(dir_fd) as listing:
                    names = sorted(e.name for e in listing if e.name.endswith(suffix))
                for name in names:
                    stem = name[: -len(suffix)]
                    meta_path = directory / (stem + meta_suffix)
                    try:
                        meta = json.loads(read_regular_at(dir_fd, meta_path.name, meta_path))
                    except (OSError, ValueError, RecursionError):
                        continue
                    if not isinstance(meta, dict) or meta.get("run_id") != run_id:
                        continue
                    try:
                        data = read_regular_at(
                            dir_fd, name, directory / name, InflateLimits().max_bytes
                        )
                    except OSError as exc:
                        skipped.append(f"{name} ({exc})")
                        continue
                    copy = Path(tmp) / name
                    copy.write_bytes(data)
                    copies[str(copy)] = str(directory / name)
            finally:
                os.close(dir_fd)
        if not copies:
            detail = f" ({'; '.join(skipped)[:300]})" if skipped else ""
            raise InputError(
                f"{spec}: no device-memory profiles of run {run_id!r} in {directory}{detail}"
            )
        try:
            side = _merge_pprofs([Path(c) for c in copies], "memory", spec, "run")
        except InputError as exc:
            raise InputError(str(exc).replace(tmp, str(directory))) from None
    side.files = [copies.get(f, f) for f in side.files]
    side.notes.extend(f"skipped {s}" for s in skipped)
    return side


# What a run's session holds, as a run side says it.
_SESSION_KINDS: Final = {"xprof": "XProf captures", "torch_trace": "torch.profiler traces"}


def run_session_files(record: SessionRecord) -> list[str]:
    """The files a run side reads of a session: its XProf captures, else its torch.profiler
    traces (one side merges one kind; see :func:`one_kind_of_run`)."""
    names = [n for t in record.targets for n in t.files]
    return [n for n in names if is_capture_name(n)] or [n for n in names if is_trace_name(n)]


def _session_kind(record: SessionRecord) -> str | None:
    """The kind of files a session holds, as they are read: "xprof", "torch_trace" or None."""
    names = run_session_files(record)
    return None if not names else "xprof" if is_capture_name(names[0]) else "torch_trace"


def one_kind_of_run(
    records: Sequence[SessionRecord], spec: str
) -> tuple[list[SessionRecord], str | None]:
    """The capture sessions of a run that one side reads, oldest first, and a note naming
    those it skipped (None when the run holds one kind).

    XProf captures and torch.profiler traces name different frames (XLA's ops, PyTorch's
    operators and kernels), so a side merging both compares nothing with anything: a run
    of both kinds (a torch_xla workload both captured and traced) is read as the kind most
    of its sessions hold, the newest session's kind on a tie. One stray capture of the
    other kind (an alert's, say) then never turns what the run reads.
    """
    kinds = {r.id: kind for r in records if (kind := _session_kind(r)) is not None}
    sessions = [r for r in records if r.id in kinds]
    counts = Counter(kinds.values())
    if len(counts) < 2:
        return sessions, None
    newest = kinds[sessions[-1].id]
    chosen = max(counts, key=lambda kind: (counts[kind], kind == newest))
    skipped = [r.id for r in sessions if kinds[r.id] != chosen]
    other = next(kind for kind in counts if kind != chosen)
    shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
    note = (
        f"{spec}: read its {counts[chosen]} sessions of {_SESSION_KINDS[chosen]}; skipped its "
        f"{len(skipped)} of {_SESSION_KINDS[other]}, which one side cannot merge ({shown})"
    )
    return [r for r in sessions if kinds[r.id] == chosen], note


def run_spec(spec: str) -> tuple[str, int | None]:
    """``run:<run_id>`` or ``run:<run_id>~N`` as (run id, N or None); ConfigError else."""
    run_id, tilde, count = spec.removeprefix(RUN_PREFIX).partition("~")
    if not _RUN_ID.fullmatch(run_id):
        raise ConfigError(f"{spec}: expected run:<run_id> (letters, digits, . _ : -)")
    if not tilde:
        return run_id, None
    if not (count.isascii() and count.isdigit() and 0 < int(count) <= MAX_REPLICATES):
        raise ConfigError(f"{spec}: expected run:<run_id>~N with N of 1-{MAX_REPLICATES}")
    return run_id, int(count)


def expand_replicates(spec: str, context: SideContext) -> list[str]:
    """The specs ``spec`` stands for as replicates (one capture session each):
    ``run:<run_id>~N`` is the run's N newest finished capture sessions (InputError if it
    has fewer); anything else is itself."""
    if not spec.startswith(RUN_PREFIX):
        return [spec]
    run_id, wanted = run_spec(spec)
    if wanted is None:
        return [spec]
    if context.store is None:
        raise ConfigError(f"{spec}: needs the session store (--store or MLPROF_STORE)")
    from exporter.capture.store import SessionStore

    store = SessionStore(context.store)
    records, skipped = one_kind_of_run(store.run_sessions(run_id), spec)
    if len(records) < wanted:
        besides = f" ({skipped})" if skipped else ""
        raise InputError(
            f"{spec}: run {run_id!r} has {len(records)} finished capture sessions in "
            f"{store.url}, not {wanted}{besides}"
        )
    if skipped:  # the replicates are session ids: no side of a run:<id> to note it in
        log.warning("%s", skipped)
    return [r.id for r in records[-wanted:]]


def load_side(spec: str, kind: Kind | None = None, context: SideContext | None = None) -> Side:
    """Read what ``spec`` names (see the module docstring)."""
    context = context or SideContext()
    if spec.startswith(RUN_PREFIX):
        return _read_run(spec[len(RUN_PREFIX) :], kind, context, spec)
    if spec.startswith(PYROSCOPE_PREFIX):
        from exporter.analysis.sides.pyroscope import select_merged

        chosen, graph, profile_type = select_merged(
            spec[len(PYROSCOPE_PREFIX) :], kind, context, spec
        )
        side = Side(spec, "pyroscope", chosen, graph, files=[])
        side.notes.append(f"profile type {profile_type}")
        return side
    from exporter.capture.inputs import existing_input

    path = existing_input(spec, context.store)
    try:
        if path.is_dir():
            source = (
                "session" if (path / "session.json").exists() or path != Path(spec) else "directory"
            )
            return _read_directory(path, kind, spec, source)
        if is_torch_trace(path):  # before pprof: a gzipped trace has gzip's magic too
            return _read_torch_trace(path, kind, spec)
        if is_pprof(path):
            return _read_pprof(path, kind)
        return _read_capture(path, kind, None)
    except (ValueError, IndexError, KeyError, UnicodeDecodeError) as exc:
        # Whatever slips past the readers' own checks is still a bad input, not a crash.
        raise InputError(f"{spec}: cannot read ({type(exc).__name__}: {exc})") from None
