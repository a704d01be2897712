"""torch.profiler traces (Kineto's Chrome-trace JSON) read as captures: bounded, by content.

``torch.profiler`` writes ``*.pt.trace.json`` (``export_chrome_trace``,
``tensorboard_trace_handler``, often gzipped): a JSON object whose ``traceEvents`` hold
complete events (``"ph": "X"``, times in microseconds with nanosecond decimals) written
by Kineto's ``ChromeTraceLogger`` (``libkineto/src/output_json.cpp``):

* on each host thread (``pid`` the process, ``tid`` the thread): ``python_function``
  (``with_stack=True``: ``file.py(12): func``, ``nn.Module: Linear_0``,
  ``<built-in method mm of type object at 0x…>``), ``cpu_op`` (``aten::mm``),
  ``user_annotation`` (``record_function`` ranges and ``ProfilerStep#N``),
  ``cuda_runtime`` / ``cuda_driver`` (``cudaLaunchKernel``, ``args.correlation``);
* on each GPU stream (``pid`` the device, ``tid`` the stream): ``kernel``,
  ``gpu_memcpy``, ``gpu_memset`` with ``args.correlation``, the id of the runtime call
  that launched them; ``ac2g`` flow events (``"ph": "s"`` on the launch, ``"f"`` with
  ``"bp": "e"`` on the kernel, ``id`` the correlation) link the same pair;
* ``[memory]`` instant events (``profile_memory=True``) with ``args.Bytes`` (negative:
  a free) and ``args.Addr``.

From them: the host flame graph (events nested by time on each thread under the
``split`` rule of :mod:`exporter.profiles.nesting`, as XSpace host planes are: self and
total wall time), the device flame graph (each kernel's time under ``GPU n > stream s``
and the host stack that launched it), the allocation graph, and the steps
(``ProfilerStep#N``). Frames keep torch's op names (``aten::mm``); Python frames follow
:mod:`exporter.profiles.frames` (``func`` with file and line; addresses dropped, so two
runs' frames match).

Bounds, so a hostile trace gets one line and no memory blow-up: the file (and what a
gzip inflates to) is read up to :data:`MAX_TRACE_BYTES`, the count of ``{`` in it (an
upper bound on the JSON objects, so on what ``json`` builds) up to
:data:`MAX_TRACE_OBJECTS`; ``json``'s own recursion limit bounds nesting, a refusal is
worded by :func:`exporter.json_limits.load_json`, and the strings kept (names) have any
lone surrogate escaped.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from exporter import schema
from exporter.errors import InputError
from exporter.json_limits import JSONInputError, load_json
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.frames import FrameLabel, label_python
from exporter.profiles.nesting import aggregate, nest
from exporter.regular_files import FileTooLargeError, NotRegularFileError, open_regular

__all__ = [
    "MAX_TRACE_BYTES",
    "MAX_TRACE_OBJECTS",
    "STEP_FRAME",
    "STEP_SOURCE",
    "TRACE_SOURCES",
    "TorchTrace",
    "device_graphs",
    "find_traces",
    "flamegraph_from_trace",
    "host_graphs",
    "is_torch_trace",
    "is_trace_name",
    "load_torch_trace",
    "memory_flamegraph",
    "step_graphs",
    "step_windows",
    "trace_flamegraphs",
    "trace_stem",
    "windowed_graphs",
]

# A long CUDA training trace with stacks is a few hundred MB of JSON. A conversion peaks
# at about 6x the JSON's size (bench/torch_trace_read.py: 86 MB, 500 MB RSS), so 512 MiB
# stays within the sidecar's 4 GiB analysis bound.
MAX_TRACE_BYTES: Final = 512 << 20
# Kineto writes about two objects per event (the event and its args): 16 M objects is
# ~8 M events, several minutes of a busy GPU, and bounds what json allocates.
MAX_TRACE_OBJECTS: Final = 16_000_000
# Kineto writes the header (schemaVersion, deviceProperties of every GPU) before the
# events: "traceEvents" appears within the first few KiB.
SNIFF_BYTES: Final = 64 << 10
GZIP_MAGIC: Final = b"\x1f\x8b"
# In a directory, the files looked into (a single file is read whatever its name).
TRACE_SUFFIXES: Final = (".json", ".json.gz")
# Frame names longer than this (C++ template kernel names run to kilobytes) are cut.
MAX_NAME_CHARS: Final = 1024
# ProfilerStep#N: the step annotation; its frame drops the number so steps merge.
STEP_FRAME: Final = "ProfilerStep"
# Where a comparison says its steps came from (as for XSpace host step annotations).
STEP_SOURCE: Final = "host_step_annotations"
_OPEN_NS = 1 << 62  # an open window edge, far beyond any trace clock
_STEP_RE = re.compile(r"^ProfilerStep#(\d{1,18})$")
# The ``profile_source`` label of each graph the sidecar pushes from a trace (XSpace
# captures push ``xprof_device`` / ``xprof_host``): device time, host wall time, bytes.
TRACE_SOURCES: Final = {"device": "torch_device", "host": "torch_host", "memory": "torch_memory"}

HOST_CATEGORIES: Final = frozenset(
    {"python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
)
# Calls that launch device work: a kernel goes under the op around them, not under them.
LAUNCH_CATEGORIES: Final = frozenset({"cuda_runtime", "cuda_driver"})
DEVICE_CATEGORIES: Final = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Kineto before 2022 (torch 1.8-1.10, the TensorBoard plugin's traces) named the
# categories so and wrote thread ids as strings ("tid": "stream 7", "tid": "123").
_OLD_CATEGORIES: Final = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
                          "Runtime": "cuda_runtime", "Driver": "cuda_driver",
                          "Operator": "cpu_op"}  # fmt: skip
_STREAM_TID_RE = re.compile(r"^(?:stream )?(\d{1,18})$", re.IGNORECASE)
MEMORY_EVENT = "[memory]"
_PS_PER_NS = 1000

# torch's Python tracer: "path/file.py(12): func"; C functions: "<built-in method mm of
# type object at 0x7f…>", "<built-in function len>", "<method 'append' of 'list' objects>".
_PY_FRAME_RE = re.compile(r"^(?P<file>.+)\((?P<line>\d{1,18})\): (?P<func>.+)$")
_BUILTIN_METHOD_RE = re.compile(
    r"^<built-in method (?P<func>\S*) of (?P<owner>.+?)(?: at 0x[0-9a-f]+)?>$"
)
_BUILTIN_FUNC_RE = re.compile(r"^<built-in function (?P<func>[^>]*)>$")
_METHOD_RE = re.compile(r"^<method '(?P<func>[^']*)' of '(?P<owner>[^']*)' objects>$")
_OWNER_OBJECT_RE = re.compile(r"^(?P<owner>[\w.]+) object$")
_THREAD_NAME_RE = re.compile(r"^thread \d+ \((?P<name>.*)\)$")


@dataclass
class TorchTrace:
    """The complete events of one trace, as columns (times in ns of the trace's clock)."""

    source: str
    base_time_ns: int  # baseTimeNanoseconds: trace clock + this = ns since the epoch
    category: list[str] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    pid: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    dur_ns: list[int] = field(default_factory=list)
    correlation: list[int] = field(default_factory=list)  # -1 when none
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    flow_starts: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # id -> pid, tid, ns
    flow_ends: dict[tuple[int, int, int], int] = field(default_factory=dict)  # pid, tid, ns -> id
    # [memory] events: pid, tid, ns, bytes (negative: freed), the device's frame
    memory: list[tuple[int, int, int, int, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.name)

    def time_range(self) -> tuple[int, int]:
        """(start in ns since the epoch, duration in ns) of the trace's events."""
        if not self.start_ns:
            return self.base_time_ns, 0
        first = min(self.start_ns)
        last = max(s + d for s, d in zip(self.start_ns, self.dur_ns, strict=True))
        return self.base_time_ns + first, last - first

    @property
    def has_device(self) -> bool:
        return any(c in DEVICE_CATEGORIES for c in self.category)


# -- reading -----------------------------------------------------------------------------
def _head(path: Path) -> bytes:
    """The first bytes of ``path`` (inflated when gzip), for detection; b"" if unreadable."""
    try:
        with open_regular(path, follow_symlinks=True) as fh:
            raw = fh.read(SNIFF_BYTES)
            if not raw.startswith(GZIP_MAGIC):
                return raw
            fh.seek(0)
            inflate = zlib.decompressobj(wbits=31)
            out = b""
            while len(out) < SNIFF_BYTES:
                chunk = fh.read(16 << 10)
                if not chunk:
                    break
                out += inflate.decompress(chunk, SNIFF_BYTES - len(out))
                if inflate.unconsumed_tail or inflate.eof:
                    break
            return out
    except (OSError, zlib.error, EOFError):
        return b""


def is_torch_trace(path: Path) -> bool:
    """Whether ``path`` is a Chrome-trace JSON object (Kineto's), plain or gzipped."""
    if path.is_dir():
        return False
    head = _head(path).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"{") and b'"traceEvents"' in head


def is_trace_name(name: str) -> bool:
    """Whether a file of this name is a trace the sidecar takes (``*.pt.trace.json``, as
    ``tensorboard_trace_handler`` and ``run.torch_profile()`` name them; ``.gz`` too).
    Only where names are all there is (a session's files); a file the user names is
    read by content (:func:`is_torch_trace`)."""
    return name.endswith(schema.TORCH_TRACE_SUFFIXES)


def trace_stem(name: str) -> str:
    """The name without its trace suffix (``w.17.pt.trace.json.gz`` -> ``w.17``)."""
    for suffix in sorted(schema.TORCH_TRACE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def find_traces(directory: Path) -> list[Path]:
    """The torch.profiler traces under ``directory`` (``*.json``, ``*.json.gz`` holding
    one, as ``tensorboard_trace_handler`` writes them), sorted; no link followed."""
    from exporter.profiles.capture_files import find_regular

    return [p for p in find_regular(directory, TRACE_SUFFIXES) if is_torch_trace(p)]


def _read_bounded(path: Path, follow_symlinks: bool) -> bytes:
    try:
        with open_regular(path, follow_symlinks=follow_symlinks) as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == GZIP_MAGIC:
                # read(n) inflates at most n bytes: a gzip bomb stops at the bound.
                with gzip.GzipFile(fileobj=fh, mode="rb") as inflated:
                    data = inflated.read(MAX_TRACE_BYTES + 1)
            else:
                data = fh.read(MAX_TRACE_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (NotRegularFileError, FileTooLargeError) as exc:
        raise InputError(str(exc)) from None
    except (OSError, EOFError, zlib.error) as exc:
        detail = getattr(exc, "strerror", None) or exc
        raise InputError(f"{path}: cannot read this torch.profiler trace ({detail})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise InputError(
            f"{path}: torch.profiler trace larger than {MAX_TRACE_BYTES} bytes "
            "(inflated): refused; profile fewer steps (schedule(active=...))"
        )
    return data


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if np.isfinite(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ident(value: Any) -> int | None:
    """A pid or tid: an integer, or the strings old Kineto wrote ("123", "stream 7")."""
    if isinstance(value, str):
        match = _STREAM_TID_RE.match(value)
        return int(match[1]) if match else None
    return _int(value)


def _ns(us: float) -> int:
    # Kineto writes µs with 3 decimals; a double holds them to well under 1 ns for any
    # trace clock below 2**53 ns (104 days of uptime in µs * 1000 is far below it).
    return round(us * 1000)


def _parse(data: bytes, what: str) -> Any:
    """``data`` parsed by ``json`` (nesting bounded by its recursion limit); a failure
    is worded by :func:`exporter.json_limits.load_json`.

    Its walk of every value (depth 64, lone surrogates) doubles the cost of a trace, whose
    deep ``args`` are never read: only the strings kept are made safe (:func:`_text`).
    """
    try:
        return json.loads(data)
    except (RecursionError, ValueError):
        pass
    try:
        load_json(data, what)
    except JSONInputError as exc:
        raise InputError(str(exc)) from None
    raise InputError(f"{what}: not valid JSON")  # json refused what load_json took: never


def _text(value: str) -> str:
    """``value`` cut to MAX_NAME_CHARS, a lone surrogate escaped (no UTF-8 encoder takes it)."""
    value = value[:MAX_NAME_CHARS]
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def load_torch_trace(path: Path, *, follow_symlinks: bool = True) -> TorchTrace:
    """Read ``path`` (bounded, see the module notes); InputError in one line if unusable.

    ``follow_symlinks``: True for a path the CLI user named; False for files a workload
    wrote into the shared directory.
    """
    data = _read_bounded(path, follow_symlinks)
    objects = data.count(b"{")
    if objects > MAX_TRACE_OBJECTS:
        raise InputError(
            f"{path}: torch.profiler trace with more than {MAX_TRACE_OBJECTS} JSON objects "
            f"({objects}): refused; profile fewer steps"
        )
    document = _parse(data, str(path))
    del data
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise InputError(f"{path}: not a torch.profiler trace (no traceEvents list)")
    base = _int(document.get("baseTimeNanoseconds")) or 0
    trace = TorchTrace(str(path), base)
    for event in document["traceEvents"]:
        if isinstance(event, dict):
            _add_event(trace, event)
    return trace


def _memory_device(args: dict[str, Any]) -> str:
    """The frame of a [memory] event's device: c10's DeviceType 0 is the CPU, 1 CUDA."""
    kind, index = _int(args.get("Device Type")), _int(args.get("Device Id"))
    if kind == 0:
        return "CPU"
    if kind == 1:
        return f"GPU {index}"
    return f"device type {kind} #{index}"


def _add_event(trace: TorchTrace, event: dict[str, Any]) -> None:
    phase = event.get("ph")
    pid, tid = _ident(event.get("pid")), _ident(event.get("tid"))
    ts = _number(event.get("ts"))
    if pid is None or tid is None:
        return  # Kineto's own spans ("pid": "Spans"), markers ("pid": "")
    args = event.get("args")
    args = args if isinstance(args, dict) else {}
    if phase == "M":
        if event.get("name") == "thread_name" and isinstance(args.get("name"), str):
            trace.thread_names[(pid, tid)] = _text(args["name"])
        return
    if ts is None:
        return
    if phase in ("s", "f") and event.get("cat") == "ac2g":
        flow = _int(event.get("id"))
        if flow is not None:
            if phase == "s":
                trace.flow_starts[flow] = (pid, tid, _ns(ts))
            else:
                trace.flow_ends[(pid, tid, _ns(ts))] = flow
        return
    if phase == "i" and event.get("name") == MEMORY_EVENT:
        size = _int(args.get("Bytes"))
        if size is not None:
            trace.memory.append((pid, tid, _ns(ts), size, _memory_device(args)))
        return
    if phase != "X":
        return
    category, name, dur = event.get("cat"), event.get("name"), _number(event.get("dur"))
    if not isinstance(category, str) or dur is None or dur < 0:
        return
    category = _OLD_CATEGORIES.get(category, category)
    if category not in HOST_CATEGORIES and category not in DEVICE_CATEGORIES:
        return
    trace.category.append(category)
    trace.name.append(_text(name) if isinstance(name, str) else _text(str(name)[:80]))
    trace.pid.append(pid)
    trace.tid.append(tid)
    trace.start_ns.append(_ns(ts))
    trace.dur_ns.append(_ns(dur))
    correlation = _int(args.get("correlation"))
    trace.correlation.append(-1 if correlation is None else correlation)


# -- frames --------------------------------------------------------------------------------
def host_label(category: str, name: str) -> FrameLabel:
    """The frame of one host event: torch's names for ops, the project's for Python."""
    if category != "python_function":
        step = _STEP_RE.match(name)
        return FrameLabel(STEP_FRAME if step else name)
    match = _PY_FRAME_RE.match(name)
    if match is not None:
        return label_python(match["func"], match["file"], int(match["line"]))
    match = _BUILTIN_METHOD_RE.match(name)
    if match is not None:
        owner = _OWNER_OBJECT_RE.match(match["owner"])
        func = match["func"] or "<built-in method>"
        # "of type object": a module-level function (torch.relu); pybind11 records and
        # other unnamed owners say nothing either.
        if owner is None or owner["owner"] == "type" or "pybind11" in owner["owner"]:
            return FrameLabel(func, "builtins")
        return FrameLabel(f"{owner['owner']} > {func}", "builtins")
    match = _BUILTIN_FUNC_RE.match(name)
    if match is not None:
        return FrameLabel(match["func"] or "<built-in function>", "builtins")
    match = _METHOD_RE.match(name)
    if match is not None:
        return FrameLabel(f"{match['owner']} > {match['func']}", "builtins")
    return FrameLabel(name)  # nn.Module: Linear_0, and anything else torch names


def _thread_labels(
    trace: TorchTrace, busy: dict[tuple[int, int], int]
) -> dict[tuple[int, int], str]:
    """A frame per thread: its name without the id (``python``), numbered busiest first
    when several share it (thread ids differ in every run; names match across runs)."""
    names: dict[tuple[int, int], str] = {}
    for key in busy:
        raw = trace.thread_names.get(key, "thread")
        match = _THREAD_NAME_RE.match(raw)
        names[key] = (match["name"] if match else raw) or "thread"
    groups: dict[str, list[tuple[int, int]]] = {}
    for key, name in names.items():
        groups.setdefault(name, []).append(key)
    for name, keys in groups.items():
        if len(keys) > 1:
            keys.sort(key=lambda k: (-busy[k], k))
            for ordinal, key in enumerate(keys, 1):
                names[key] = f"{name} #{ordinal}"
    return names


def _template(trace: TorchTrace, kind: str) -> FlameGraph:
    start, duration = trace.time_range()
    if kind == "device":
        return FlameGraph(
            sample_type="device_time", unit="nanoseconds", profile_name="device",
            time_nanos=start, duration_nanos=duration,
        )  # fmt: skip
    return FlameGraph(
        sample_type="wall", unit="nanoseconds", profile_name="wall",
        time_nanos=start, duration_nanos=duration,
    )  # fmt: skip


@dataclass
class _HostLine:
    key: tuple[int, int]
    start: np.ndarray  # ps after the trace's first event
    end: np.ndarray
    label: np.ndarray  # index into _Host.labels
    node: np.ndarray | None = None  # frame-tree node of each nested segment
    nested: Any = None


class _Host:
    """The host threads nested once; the frame tree shared by host and launch stacks."""

    def __init__(self, trace: TorchTrace, windows_ns: np.ndarray | None) -> None:
        from exporter.profiles.xplane import FrameTree  # the XSpace graphs' frame tree

        self.trace = trace
        self.base_ns = min(trace.start_ns) if trace.start_ns else 0
        self.frames = FrameTree(None if windows_ns is None else windows_ns)
        self.labels: list[FrameLabel] = []
        self.launch_label: list[bool] = []
        label_ids: dict[tuple[str, str], int] = {}
        by_thread: dict[tuple[int, int], list[int]] = {}
        for i, category in enumerate(trace.category):
            if category in HOST_CATEGORIES and trace.dur_ns[i] > 0:
                by_thread.setdefault((trace.pid[i], trace.tid[i]), []).append(i)
        start = np.asarray(trace.start_ns, np.int64) - self.base_ns
        dur = np.asarray(trace.dur_ns, np.int64)
        self.lines: list[_HostLine] = []
        busy: dict[tuple[int, int], int] = {}
        for key, rows in by_thread.items():
            ids = []
            for i in rows:
                lk = (trace.category[i], trace.name[i])
                found = label_ids.get(lk)
                if found is None:
                    found = label_ids[lk] = len(self.labels)
                    self.labels.append(host_label(*lk))
                    self.launch_label.append(lk[0] in LAUNCH_CATEGORIES)
                ids.append(found)
            idx = np.asarray(rows, np.int64)
            s = start[idx] * _PS_PER_NS
            self.lines.append(
                _HostLine(key, s, s + dur[idx] * _PS_PER_NS, np.asarray(ids, np.int64))
            )
            busy[key] = int(dur[idx].sum())
        self.by_key = {line.key: line for line in self.lines}
        self.thread_names = _thread_labels(trace, busy)
        self.tuple_of_label = np.asarray(
            [self.frames.tuple_id((label,)) for label in self.labels], np.int64
        )

    def build(self, keep_nodes: bool) -> None:
        """Nest every thread into the frame tree; ``keep_nodes`` keeps each segment's node
        (for launch stacks)."""
        frames = self.frames
        for line in self.lines:
            nested = nest(line.start, line.end, line.label, "split", frames.core)
            tuple_ids = self.tuple_of_label[nested.label]
            root = frames.node(0, frames.tuple_id((FrameLabel(self.thread_names[line.key]),)))
            frames.add_line(self.base_ns, nested, tuple_ids, root)
            if keep_nodes:
                line.nested = nested
                line.node = frames.assign(nested, tuple_ids, root)

    def stack_at(self, key: tuple[int, int], ns: int) -> tuple[FrameLabel, ...]:
        """The host frames (thread left out) open on thread ``key`` at ``ns``, innermost
        launch calls (``cudaLaunchKernel``) left out."""
        line = self.by_key.get(key)
        if line is None or line.nested is None or line.node is None:
            return ()
        nested = line.nested
        ps = (ns - self.base_ns) * _PS_PER_NS
        idx = int(np.searchsorted(nested.start, ps, side="right")) - 1
        while idx >= 0 and not (nested.start[idx] <= ps < nested.end[idx]):
            idx = int(nested.parent[idx])
        while idx >= 0 and self.launch_label[int(nested.label[idx])]:
            idx = int(nested.parent[idx])
        if idx < 0:
            return ()
        chain: list[FrameLabel] = []
        node = int(line.node[idx])
        frames = self.frames
        while frames.parent[node] > 0:  # stop below the thread's node
            chain.extend(reversed(frames.tuples[frames.tuple_of[node]]))
            node = frames.parent[node]
        return tuple(reversed(chain))


def host_graphs(trace: TorchTrace, windows_ns: np.ndarray | None = None) -> list[FlameGraph] | None:
    """Host wall-time graphs (ns), one per window of the trace clock (``None``: all the
    time); None when the trace has no host events."""
    host = _Host(trace, windows_ns)
    if not host.lines:
        return None
    host.build(keep_nodes=False)
    return host.frames.graphs(_template(trace, "host"))


def _launch_points(trace: TorchTrace) -> dict[int, tuple[int, int, int]]:
    """correlation id -> (pid, tid, ns) of the runtime call that launched it."""
    points = dict(trace.flow_starts)
    for i, category in enumerate(trace.category):
        if category in LAUNCH_CATEGORIES and trace.correlation[i] >= 0:
            points[trace.correlation[i]] = (trace.pid[i], trace.tid[i], trace.start_ns[i])
    return points


def device_graphs(
    trace: TorchTrace, windows_ns: np.ndarray | None = None
) -> list[FlameGraph] | None:
    """Device-time graphs (ns): each kernel, memcpy and memset under ``GPU n > stream s``
    and the host stack of the call that launched it (correlation id, else ``ac2g`` flow).

    With windows, an event belongs to the window of its launch (a step's kernels run
    after the host has moved on), else of its own start. None without device events.
    """
    rows = [i for i, c in enumerate(trace.category) if c in DEVICE_CATEGORIES]
    if not rows:
        return None
    host = _Host(trace, None)
    host.build(keep_nodes=True)
    points = _launch_points(trace)
    stacks: dict[tuple[FrameLabel, ...], int] = {}
    stack_of = np.zeros(len(rows), np.int64)
    when = np.zeros(len(rows), np.int64)
    launch_cache: dict[tuple[int, int, int], tuple[FrameLabel, ...]] = {}
    for j, i in enumerate(rows):
        correlation = trace.correlation[i]
        if correlation < 0:
            correlation = trace.flow_ends.get((trace.pid[i], trace.tid[i], trace.start_ns[i]), -1)
        point = points.get(correlation) if correlation >= 0 else None
        launched: tuple[FrameLabel, ...] = ()
        when[j] = trace.start_ns[i]
        if point is not None:
            launched = launch_cache.get(point, ())
            if point not in launch_cache:
                launched = launch_cache[point] = host.stack_at(point[:2], point[2])
            when[j] = point[2]
        stack = (
            FrameLabel(f"GPU {trace.pid[i]}"),
            FrameLabel(f"stream {trace.tid[i]}"),
            *launched,
            FrameLabel(trace.name[i]),
        )
        found = stacks.get(stack)
        if found is None:
            found = stacks[stack] = len(stacks)
        stack_of[j] = found
    dur = np.asarray([trace.dur_ns[i] for i in rows], np.int64)
    if windows_ns is None:
        window = np.zeros(len(rows), np.int64)
        count = 1
    else:
        count = len(windows_ns)
        pos = np.searchsorted(windows_ns[:, 0], when, side="right") - 1
        inside = (pos >= 0) & (when < windows_ns[np.maximum(pos, 0), 1])
        window = np.where(inside, pos, count)  # outside every window: dropped
    keep = window < count
    keys, sums = aggregate(stack_of[keep] * (count + 1) + window[keep], dur[keep])
    by_id = list(stacks)
    out = [_template(trace, "device") for _ in range(count)]
    for key, value in zip(keys.tolist(), sums.tolist(), strict=True):
        if value > 0:
            out[key % (count + 1)].add(by_id[key // (count + 1)], value)
    return out


def memory_flamegraph(trace: TorchTrace) -> FlameGraph | None:
    """Bytes allocated (``alloc_space``) per device (``CPU``, ``GPU 0``) under the host
    stack that allocated them, from ``profile_memory=True``'s ``[memory]`` events (frees
    left out); None when the trace has none."""
    allocs = [m for m in trace.memory if m[3] > 0]
    if not allocs:
        return None
    host = _Host(trace, None)
    host.build(keep_nodes=True)
    start, duration = trace.time_range()
    graph = FlameGraph(
        sample_type="alloc_space", unit="bytes", profile_name="memory",
        time_nanos=start, duration_nanos=duration,
    )  # fmt: skip
    for pid, tid, ns, size, device in allocs:
        thread = host.thread_names.get((pid, tid), "thread")
        graph.add((FrameLabel(device), FrameLabel(thread), *host.stack_at((pid, tid), ns)), size)
    return graph


# -- steps ---------------------------------------------------------------------------------
def step_windows(trace: TorchTrace) -> list[Any]:
    """``ProfilerStep#N`` annotations as :class:`~exporter.profiles.steps.StepWindow`
    (trace-clock ns), in start order."""
    from exporter.profiles.steps import StepWindow

    out = []
    for i, category in enumerate(trace.category):
        if category not in ("user_annotation", "cpu_op"):  # old Kineto: an "Operator"
            continue
        match = _STEP_RE.match(trace.name[i])
        if match is not None and trace.dur_ns[i] > 0:
            start = trace.start_ns[i]
            out.append(StepWindow(start, start + trace.dur_ns[i], int(match[1])))
    return sorted(out, key=lambda w: (w.start_ns, w.end_ns))


def windowed_graphs(
    trace: TorchTrace, kind: Literal["device", "host"], windows: Sequence[Any]
) -> list[FlameGraph]:
    """One graph of ``kind`` per step window (trace-clock ns)."""
    # Open edges (±2**62) stay in int64 after the frame tree subtracts the trace's start.
    spans = np.asarray([[w.start_ns, w.end_ns] for w in windows], np.int64).reshape(-1, 2)
    graphs = device_graphs(trace, spans) if kind == "device" else host_graphs(trace, spans)
    return graphs or [_template(trace, kind) for _ in windows]


def step_graphs(
    trace: TorchTrace,
    kind: Literal["device", "host"],
    cycles: Sequence[Any],
    every: bool,
) -> tuple[FlameGraph, list[FlameGraph]]:
    """The whole graph of ``kind`` and one per step cycle (``cycles``, trace-clock ns).

    ``every``: ``cycles`` are all the trace's, so the whole graph is read as their sum
    plus what lies before the first and after the last (one pass, and the steps add up
    to it exactly); else the whole and the cycles are read apart (a sample of them).
    """
    from exporter.profiles.steps import StepWindow

    whole = flamegraph_from_trace(trace, kind)  # the reader's own error when it has none
    if not cycles:
        return whole, []
    if not every:
        return whole, windowed_graphs(trace, kind, cycles)
    edges = [StepWindow(-_OPEN_NS, cycles[0].start_ns, None), *cycles,
             StepWindow(cycles[-1].end_ns, _OPEN_NS, None)]  # fmt: skip
    graphs = windowed_graphs(trace, kind, edges)
    merged = graphs[0].copy()
    for graph in graphs[1:]:
        merged.merge(graph)
    merged.time_nanos, merged.duration_nanos = whole.time_nanos, whole.duration_nanos
    return merged, graphs[1:-1]


def flamegraph_from_trace(
    trace: TorchTrace, kind: str | None = None, per_step: bool = False
) -> FlameGraph:
    """The device (default when kernels are present), host or memory graph of a trace."""
    if kind == "memory":
        if per_step:
            raise InputError(f"{trace.source}: --per-step applies to device time, not memory")
        graph = memory_flamegraph(trace)
        if graph is None:
            raise InputError(
                f"{trace.source}: no [memory] events in this torch.profiler trace "
                "(profile with profile_memory=True)"
            )
        return graph
    if kind in (None, "device"):
        graphs = device_graphs(trace)
        if graphs is not None:
            if per_step:
                steps = len(step_windows(trace))
                if not steps:
                    raise InputError(f"{trace.source}: --per-step: no ProfilerStep#N annotations")
                return graphs[0].scaled(1 / steps)
            return graphs[0]
        if kind == "device":
            raise InputError(
                f"{trace.source}: no GPU kernels in this torch.profiler trace (profile with "
                "ProfilerActivity.CUDA); try --kind host"
            )
    if per_step:
        raise InputError(f"{trace.source}: --per-step needs GPU kernels in the trace")
    host = host_graphs(trace)
    if host is None or host[0].root.total <= 0:
        raise InputError(f"{trace.source}: no host or GPU events in this torch.profiler trace")
    return host[0]


def trace_flamegraphs(path: Path) -> dict[str, FlameGraph]:
    """``{profile_source: graph}`` of a trace the sidecar took (a workload's file: no
    link followed): device time when it has kernels, host wall time when it has host
    events, allocated bytes when it has ``[memory]`` events; InputError if none."""
    trace = load_torch_trace(path, follow_symlinks=False)
    graphs: dict[str, FlameGraph] = {}
    device = device_graphs(trace)
    if device is not None and device[0].root.total > 0:
        graphs[TRACE_SOURCES["device"]] = device[0]
    host = host_graphs(trace)
    if host is not None and host[0].root.total > 0:
        graphs[TRACE_SOURCES["host"]] = host[0]
    memory = memory_flamegraph(trace)
    if memory is not None:
        graphs[TRACE_SOURCES["memory"]] = memory
    if not graphs:
        raise InputError(f"{path}: no host, GPU or memory events in this torch.profiler trace")
    return graphs
