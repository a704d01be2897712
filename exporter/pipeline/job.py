"""One analysis or comparison in a child process, bounded in time and memory.

The sidecar never analyses a capture in its own process: a capture is written by the
workload (or by anyone with access to the shared directory), and a hostile or simply
huge file must not wedge or crash the sidecar. :func:`run_job` starts
``python -m exporter.pipeline.job`` in the sandbox (:mod:`exporter.sandbox`: an
address-space limit reserved from the memory budget, a deadline) and reads what it
wrote into an output directory.

    python -m exporter.pipeline.job analyze INPUT OUT_DIR [--baseline SPEC ...] [--replicate S ...]
    python -m exporter.pipeline.job compare BASE HEAD OUT_DIR [--kind K ...]
    python -m exporter.pipeline.job compare OUT_DIR --base SPEC ... --head SPEC ... [...]
    python -m exporter.pipeline.job subtree INPUT OUT_DIR [--frames JSON --kind K --limit N]
    python -m exporter.pipeline.job flamegraphs INPUT OUT_DIR --kind capture|memory|torch
    python -m exporter.pipeline.job sides INPUT OUT_DIR
    python -m exporter.pipeline.job session SESSION_DIR OUT_DIR --capture NAME ... [--report ...]

``flamegraphs`` is the sidecar's conversion of a session's capture or a workload's
memory profile (:func:`flamegraphs_in_child`): the graphs come back as pprof files.
``session`` is the sidecar's one child per finished session (:func:`run_session`): each
capture read once, into its side cache, its flame graphs written as the pprof the
sidecar stores and pushes, then (``--report``, with ``analyze``'s options) the session's
report from those reads. ``analyze``, ``compare`` and ``subtree`` run
:mod:`exporter.usecases` (the doors that serve others call them here, bounded).
``sides`` reads a session into its sides as a comparison would, so that each capture's
side cache is written beside it (:mod:`exporter.analysis.sides.cache`; nothing in
OUT_DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from exporter.sandbox import MemoryBudget, last_message, limit_memory, run_python

if TYPE_CHECKING:
    from exporter.analysis.sides.load import SideContext
    from exporter.config import Settings
    from exporter.profiles.flamegraph import FlameGraph

__all__ = [
    "ChildLimits",
    "Converted",
    "JobResult",
    "SessionRun",
    "child_context_args",
    "flamegraphs_in_child",
    "in_child",
    "last_message",
    "read_graphs",
    "run_job",
    "run_session",
]

REPORT_JSON = "analysis.json"
REPORT_HTML = "summary.html"
COMPARE_JSON = "comparison.json"
COMPARE_HTML = "comparison.html"
GRAPHS_JSON = "graphs.json"
SESSION_GRAPHS_JSON = "session-graphs.json"
# The gzip level of the pprof files stored beside a capture (encode_pprof's default).
STORED_PPROF_LEVEL: Final = 6
SUBTREE_JSON = "subtree.json"
# The child reads the Pyroscope credentials from its environment, never from its
# command line: /proc/<pid>/cmdline is readable by every user of the machine.
CHILD_HEADERS_ENV: Final = "MLPROF_CHILD_PYROSCOPE_HEADERS"
COMMANDS = ("analyze", "compare", "flamegraphs", "session", "sides", "subtree")
CONVERT_KINDS = ("capture", "memory", "torch")


@dataclass(frozen=True)
class JobResult:
    """What the child did: ``ok`` and its files, or the one-line error."""

    ok: bool
    error: str = ""
    seconds: float = 0.0
    # Stopped at its deadline or never started for want of memory budget: the input may
    # be fine, the sidecar was busy (a door answers 503, not "bad input").
    unavailable: bool = False


def run_job(
    args: Sequence[str],
    timeout_s: float,
    max_memory_mb: int,
    env: dict[str, str] | None = None,
    *,
    budget: MemoryBudget | None = None,
    cwd: Path | None = None,
) -> JobResult:
    """Run ``python -m exporter.pipeline.job ARGS`` under the limits, in the sandbox.

    The child's address-space limit is reserved from ``budget`` (default: the process's,
    :func:`exporter.sandbox.default_budget`) before it starts: it may wait there, within
    ``timeout_s``.
    """
    done = run_python(
        ["-m", "exporter.pipeline.job", *args],
        memory_mb=max_memory_mb,
        timeout_s=timeout_s,
        what=f"analysis job ({args[0] if args else 'none'})",
        env=env,
        budget=budget,
        cwd=cwd,
    )
    if done.ok:
        return JobResult(True, seconds=done.seconds)
    if done.timed_out:
        stopped = f"analysis took over {timeout_s:g}s and was stopped"
        return JobResult(False, stopped, done.seconds, unavailable=True)
    if done.no_budget:
        return JobResult(False, f"analysis not started: {done.error}", done.seconds, True)
    message = done.error
    if done.killed:
        message = f"analysis stopped (exit {done.returncode}; memory limit {done.memory_mb} MiB?)"
    return JobResult(
        False, message.removeprefix("mlprof: ")[:500] or f"exit {done.returncode}", done.seconds
    )


def flamegraphs_in_child(
    path: Path,
    kind: str,
    timeout_s: float,
    max_memory_mb: int,
    *,
    max_profile_bytes: int | None = None,
    max_profile_ratio: float | None = None,
    below: Path | None = None,
) -> dict[str, FlameGraph]:
    """``{profile_source: FlameGraph}`` of one file, converted in a bounded child.

    ``kind`` is ``capture`` (an ``.xplane.pb``: device and host graphs), ``memory`` (a
    device-memory pprof, symbolic links refused) or ``torch`` (a CUDA memory snapshot).
    A file the child cannot convert, or one that makes it run out of time or memory,
    raises InputError with the child's one-line reason; the sidecar never holds the
    conversion's memory itself. With ``below`` (the shared directory) the child opens a
    ``memory`` or ``torch`` file as ``open_regular(path, below=below)``: a directory
    between the two swapped for a symbolic link since the caller listed it is refused.
    """
    import tempfile

    from exporter.errors import InputError

    with tempfile.TemporaryDirectory(prefix="mlprof-convert-") as out:
        args = ["flamegraphs", str(path), out, "--kind", kind]
        if max_profile_bytes is not None:
            args += ["--max-profile-bytes", str(max_profile_bytes)]
        if max_profile_ratio is not None:
            args += ["--max-profile-ratio", repr(max_profile_ratio)]
        if below is not None:
            args += ["--shared-dir", str(below)]
        result = run_job(args, timeout_s, max_memory_mb)
        if not result.ok:
            error = result.error.replace("analysis", "conversion")
            raise InputError(error if str(path) in error else f"{path}: {error}")
        listing = json.loads((Path(out) / GRAPHS_JSON).read_text(encoding="utf-8"))
        return {source: made.graph for source, made in read_graphs(Path(out), listing).items()}


@dataclass(frozen=True)
class Converted:
    """One flame graph a child made, and its pprof as the child encoded it (stored as
    it is: a graph is encoded once)."""

    graph: FlameGraph
    pprof: bytes


def read_graphs(out: Path, listing: Sequence[dict[str, Any]]) -> dict[str, Converted]:
    """The graphs a child listed (``_write_graphs``) in ``out``, by profile source."""
    from exporter.profiles.pprof import InflateLimits, decode_pprof, graphs_from_pprof

    graphs: dict[str, Converted] = {}
    for entry in listing:
        data = (out / entry["file"]).read_bytes()
        # Our own child's output: its size is what it made, within its memory bound.
        profile = decode_pprof(data, entry["file"], InflateLimits(1 << 40, float(1 << 40)))
        table = profile.string_table
        types = [table[t.type] for t in profile.sample_type]
        *companions, graph = graphs_from_pprof(profile, types, entry["profile_name"])
        for part, (name, unit) in zip([*companions, graph], entry["types"], strict=True):
            part.sample_type, part.unit = name, unit
        graph.period_type, graph.period_unit = entry["period_type"], entry["period_unit"]
        for part in companions:
            part.period_type, part.period_unit = graph.period_type, graph.period_unit
        graph.companions = companions
        graphs[entry["source"]] = Converted(graph, data)
    return graphs


@dataclass
class SessionRun:
    """What a ``session`` child made: each capture's graphs (or its one-line error), the
    seconds it took to convert them, and the report when one was asked for (``report``:
    ``analysis.json`` parsed and ``summary.html``; None with ``result.error`` saying why).
    """

    result: JobResult
    graphs: dict[str, dict[str, Converted] | str]
    conversion_s: float = 0.0
    report: tuple[dict[str, Any], bytes] | None = None


def run_session(
    session_dir: Path,
    names: Sequence[str],
    timeout_s: float,
    max_memory_mb: int,
    report_args: Sequence[str] | None = None,
) -> SessionRun:
    """One bounded child for a finished session: its captures ``names`` (in
    ``session_dir``) converted, and with ``report_args`` (``analyze``'s options) its
    report, from one read of each capture.

    The child may run ``timeout_s`` for the conversion and as long again for the report
    (two children had each). A capture that did not convert, or that the child did not
    reach (it ran out of time or memory), maps to the one-line reason.
    """
    from exporter.errors import InputError

    with tempfile.TemporaryDirectory(prefix="mlprof-session-job-") as tmp:
        out = Path(tmp)
        args = ["session", str(session_dir), str(out), *[f"--capture={n}" for n in names]]
        if report_args is not None:
            args += ["--report", *report_args]
        deadline = timeout_s * (2 if report_args is not None else 1)
        result = run_job(args, deadline, max_memory_mb)
        graphs: dict[str, dict[str, Converted] | str] = {}
        conversion_s = 0.0
        listed = out / SESSION_GRAPHS_JSON
        if listed.is_file():  # our own child's output, written under its own bound
            found = json.loads(listed.read_text(encoding="utf-8"))
            conversion_s = float(found["seconds"])
            for entry in found["captures"]:
                if "error" in entry:
                    graphs[entry["capture"]] = str(entry["error"])
                else:
                    graphs[entry["capture"]] = read_graphs(out, entry["graphs"])
        for name in names:
            if name in graphs:
                continue
            if result.unavailable:  # its deadline, or no budget: another child would wait too
                reason = result.error.replace("analysis", "conversion")
                graphs[name] = f"{session_dir / name}: {reason}"
                continue
            # The child died before it converted this file (its report ran out of memory,
            # say): converted alone, as before the session child, so the graphs survive.
            try:
                alone = flamegraphs_in_child(
                    session_dir / name, "capture", timeout_s, max_memory_mb
                )
            except InputError as exc:
                graphs[name] = str(exc)
            else:
                graphs[name] = {s: Converted(g, _encode_stored(g)) for s, g in alone.items()}
        report = None
        if report_args is not None and result.ok:
            text = (out / REPORT_JSON).read_text(encoding="utf-8")
            report = (json.loads(text), (out / REPORT_HTML).read_bytes())
        return SessionRun(result, graphs, conversion_s, report)


def _encode_stored(graph: FlameGraph) -> bytes:
    from exporter.profiles.pprof import encode_pprof

    return encode_pprof(graph, level=STORED_PPROF_LEVEL)


@dataclass(frozen=True)
class ChildLimits:
    """A child's deadline and address space (``MLPROF_REPORT_TIMEOUT_S``,
    ``MLPROF_REPORT_MAX_MEMORY_MB``), and how far a pprof it reads may inflate
    (``MLPROF_MAX_PROFILE_BYTES``, ``_RATIO``; None: the child's own settings)."""

    timeout_s: float = 300.0
    max_memory_mb: int = 4096
    max_profile_bytes: int | None = None
    max_profile_ratio: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ChildLimits:
        return cls(
            settings.report_timeout_s,
            settings.report_max_memory_mb,
            settings.max_profile_bytes,
            settings.max_profile_ratio,
        )

    def args(self) -> list[str]:
        """The inflation bounds as the child's flags: a door's settings (a YAML file's
        too) reach the child as its other values do, not through its environment."""
        found = []
        if self.max_profile_bytes is not None:
            found.append(f"--max-profile-bytes={self.max_profile_bytes}")
        if self.max_profile_ratio is not None:
            found.append(f"--max-profile-ratio={self.max_profile_ratio!r}")
        return found


def child_context_args(context: SideContext) -> tuple[list[str], dict[str, str]]:
    """A SideContext as the job child's arguments and environment (credentials)."""
    args: list[str] = []
    store = context.store
    if store and "://" not in store:  # a local store: the child runs in another directory
        store = str(Path(store).absolute())
    for flag, value in (
        ("--store", store),
        ("--shared-dir", str(context.shared_dir.absolute()) if context.shared_dir else None),
        ("--pyroscope-url", context.pyroscope_url),
        ("--from", context.time_from),
        ("--until", context.time_until),
        ("--profile-type", context.profile_type),
    ):
        if value:
            args.append(f"{flag}={value}")  # one word: a value may begin with "-" (-1h)
    env = {CHILD_HEADERS_ENV: json.dumps(context.pyroscope_headers)}
    return args, env


def child_headers() -> dict[str, str]:
    """The Pyroscope credentials the parent handed this child (see CHILD_HEADERS_ENV)."""
    found = json.loads(os.environ.get(CHILD_HEADERS_ENV) or "{}")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def in_child(
    command: str,
    inputs: Sequence[str],
    context: SideContext,
    limits: ChildLimits,
    options: Sequence[str] = (),
    *,
    read: Sequence[str],
) -> dict[str, bytes]:
    """Run job ``command`` on ``inputs`` in a bounded child; the files it wrote that
    ``read`` names, as bytes. InputError with the child's one-line reason on failure;
    UnavailableError (a door's 503) when it ran out of time or found no memory budget."""
    from exporter.errors import InputError, UnavailableError

    context_args, env = child_context_args(context)
    with tempfile.TemporaryDirectory(prefix=f"mlprof-{command}-") as out:
        args = [command, *inputs, out, *context_args, *limits.args(), *options]
        # In an empty directory: a store's session id can never name a file of the
        # sidecar's working directory (the child's readers try a name as a path first).
        empty = Path(out) / "cwd"
        empty.mkdir()
        result = run_job(args, limits.timeout_s, limits.max_memory_mb, env=env, cwd=empty)
        if result.unavailable:
            raise UnavailableError(result.error)
        if not result.ok:
            raise InputError(result.error)
        found: dict[str, bytes] = {}
        for name in read:
            path = Path(out) / name
            if path.is_file():  # our own child's output, written under its own bound
                found[name] = path.read_bytes()
        return found


def _convert(path: Path, kind: str, ns: argparse.Namespace) -> dict[str, Any]:
    """The child's side of :func:`flamegraphs_in_child`."""
    below = Path(ns.shared_dir) if ns.shared_dir else None
    if kind == "capture":
        from exporter.profiles.torch_trace import is_torch_trace, trace_flamegraphs
        from exporter.profiles.xplane import xplane_flamegraphs

        if is_torch_trace(path):  # a torch.profiler trace (pipeline/torch_watcher.py)
            return trace_flamegraphs(path)
        return dict(xplane_flamegraphs(path))
    if kind == "memory":
        from exporter.profiles.memory import load_memory_profile
        from exporter.profiles.pprof import InflateLimits

        defaults = InflateLimits()
        limits = InflateLimits(
            ns.max_profile_bytes or defaults.max_bytes, ns.max_profile_ratio or defaults.max_ratio
        )
        graph = load_memory_profile(path, limits, follow_symlinks=False, below=below)
        return {"device_memory": graph}
    from exporter.profiles.torch_memory import load_torch_memory_profile

    return {"device_memory": load_torch_memory_profile(path, below=below)}


def _write_graphs(
    out: Path, graphs: dict[str, Any], prefix: str = "", level: int = 1
) -> list[dict[str, Any]]:
    """Each graph as pprof in ``out`` (``prefix``: before each file's name) at gzip
    ``level``; what :func:`read_graphs` reads back."""
    from exporter.profiles.pprof import MAX_PROFILE_FRAMES, encode_pprof

    listing = []
    for source, made in graphs.items():
        # What the sidecar reads back is bounded too: the smallest subtrees fold.
        graph = (
            made if made.node_count <= MAX_PROFILE_FRAMES else made.truncated(MAX_PROFILE_FRAMES)
        )
        name = f"{prefix}{source}.pb.gz"
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(encode_pprof(graph, level=level))
        listing.append(
            {
                "source": source,
                "file": name,
                "profile_name": graph.profile_name,
                "types": [[p.sample_type, p.unit] for p in [*graph.companions, graph]],
                "period_type": graph.period_type,
                "period_unit": graph.period_unit,
            }
        )
    return listing


class _SessionReads:
    """The ``session`` command: a session's files converted, each capture from one read.

    With a report, the report's facts read each capture's whole device and host graphs
    through :meth:`__call__` (``exporter.analysis.facts.capture.graph_reader``), which
    reads them as the capture's sides in the same pass (the device op lines still reach
    the facts, once): those reads are the capture's side cache, written beside it before
    the report compares the session, and their whole graphs are the conversion's
    (``xprof_device``, ``xprof_host``: the same frames and values). What the facts did
    not read so (a CPU capture's device view, a capture of more steps than a side
    samples, one the report failed before) is read after the report through the side
    cache (:meth:`finish`). Any other file (a torch.profiler trace) is converted first,
    as ``flamegraphs`` converts it. SESSION_GRAPHS_JSON lists each file's graphs or its
    one-line error; it is rewritten as each file is done, so a report that fails later
    keeps them.
    """

    def __init__(self, directory: Path, names: Sequence[str], out: Path, ns: Any) -> None:
        self.directory, self.out, self.ns = directory, out, ns
        self.names = list(names)
        self.listing: dict[str, dict[str, Any]] = {}
        self.seconds = 0.0
        # Per capture file (resolved path): its fingerprint, step windows and reads.
        self._reads: dict[Path, dict[str, Any]] = {}
        for name in self.names:
            if Path(name).name != name:  # a record's file names are the store's, not paths
                self.listing[name] = {"capture": name, "error": f"{name!r}: not a file name"}

    def convert_others(self) -> None:
        """Every file that is not an XProf capture (the facts read no graphs of it)."""
        from exporter.profiles.capture_files import is_capture_name

        for name in self.names:
            if name not in self.listing and not is_capture_name(name):
                self._convert(name, lambda path: _convert(path, "capture", self.ns))

    def finish(self) -> None:
        """Every file not converted yet, each capture through its side cache."""
        for name in self.names:
            if name not in self.listing:
                self._convert(name, self._graphs_of)

    def __call__(self, path: Path, capture: Any, kind: str) -> Any:
        """A whole graph for the facts, read as the capture's side (GraphReader)."""
        from exporter.analysis.sides import cache as side_cache
        from exporter.analysis.sides.load import capture_side
        from exporter.errors import InputError
        from exporter.profiles.steps import step_windows
        from exporter.profiles.xplane import device_flamegraph, host_flamegraph

        plain = device_flamegraph if kind == "device" else host_flamegraph
        key = path.resolve()
        name = path.name
        if path.parent.resolve() != self.directory.resolve() or name not in self.names:
            return plain(capture)
        state = self._reads.setdefault(key, {"cache": {}, "reads": {}})
        if "print" not in state:
            state["print"] = side_cache.fingerprint(path)
        cache = state["cache"]
        if "windows" not in cache:
            cache["step_names"] = set()
            cache["windows"] = step_windows(capture, cache["step_names"])
        started = time.perf_counter()
        try:
            chosen, whole, steps, step_ns, source, view = capture_side(
                capture,
                kind,  # type: ignore[arg-type]
                cache,
            )
        except InputError as exc:
            state["reads"][kind] = side_cache.CaptureRead(error=str(exc))
            hook, capture.on_op_line = capture.on_op_line, None  # its lines were read once
            try:
                return plain(capture)  # the plain reader's own answer (or error)
            finally:
                capture.on_op_line = hook
                self._done_kind(path, state, time.perf_counter() - started)
        read = side_cache.CaptureRead(chosen, whole, steps, step_ns, source, view)
        state["reads"][kind] = read
        self._done_kind(path, state, time.perf_counter() - started)
        if kind == "host" and whole.root.total <= 0:
            return None  # as host_flamegraph answers
        return whole.copy()  # the facts merge hosts into it; the read stays the capture's

    def _done_kind(self, path: Path, state: dict[str, Any], seconds: float) -> None:
        """After the host read (the facts' last of a capture): the side cache written
        with what was read, and the capture converted when both kinds were."""
        from exporter.analysis.sides import cache as side_cache

        self.seconds += seconds
        reads = state["reads"]
        if "host" not in reads:
            return
        print_ = state["print"]
        if print_ is not None and side_cache.fingerprint_unchanged(path, print_):
            side_cache.save(path, print_, reads, state["cache"].get("step_names") or set())
        if "device" in reads:
            self._convert(path.name, lambda _path: self._graphs_from(reads, path))
        state["reads"] = {}  # the cache holds them now; the report loads what it needs

    def _graphs_of(self, path: Path) -> dict[str, Any]:
        """A capture's conversion through its side cache (decoding only what it lacks)."""
        from exporter.analysis.sides import cache as side_cache
        from exporter.analysis.sides.load import decode_capture_kinds
        from exporter.profiles.capture_files import is_capture_name

        if not is_capture_name(path.name):
            return _convert(path, "capture", self.ns)
        reads, _ = side_cache.read_capture(path, ["device", "host"], decode_capture_kinds)
        return self._graphs_from(reads, path)

    def _graphs_from(self, reads: dict[str, Any], path: Path) -> dict[str, Any]:
        device, host = reads["device"], reads["host"]
        if device.error is not None or host.error is not None:
            # No device planes and no XLA work, no host events, or a plane that does not
            # convert: the plain reader decides (rare, and cheap on such captures).
            return _convert(path, "capture", self.ns)
        graphs: dict[str, Any] = {}
        if device.view == "device" and device.whole is not None:  # not a CPU's XLA view
            graphs["xprof_device"] = device.whole
        if host.whole is not None and host.whole.root.total > 0:
            graphs["xprof_host"] = host.whole
        return graphs

    def _convert(self, name: str, graphs_of: Callable[[Path], dict[str, Any]]) -> None:
        from exporter.errors import MlprofError

        path = self.directory / name
        started = time.perf_counter()
        try:
            graphs = graphs_of(path)
        except (MlprofError, ValueError) as exc:
            message = str(exc)
            error = message if str(path) in message else f"{path}: {message}"
            self.listing[name] = {"capture": name, "error": error}
        else:
            # The store's pprof, at its compression level: the sidecar stores these bytes.
            prefix = f"{self.names.index(name)}."
            found = _write_graphs(self.out, graphs, prefix=prefix, level=STORED_PPROF_LEVEL)
            self.listing[name] = {"capture": name, "graphs": found}
        self.seconds += time.perf_counter() - started
        listing = [self.listing[n] for n in self.names if n in self.listing]
        done = {"captures": listing, "seconds": round(self.seconds, 3)}
        _write(self.out, SESSION_GRAPHS_JSON, json.dumps(done))


def _context(ns: argparse.Namespace) -> Any:
    """The parent's SideContext (child_context_args), rebuilt."""
    from exporter.analysis.sides.load import SideContext

    return SideContext(
        store=ns.store,
        shared_dir=Path(ns.shared_dir) if ns.shared_dir else None,
        pyroscope_url=ns.pyroscope_url,
        pyroscope_headers=child_headers(),
        time_from=ns.time_from,
        time_until=ns.time_until,
        profile_type=ns.profile_type,
    )


def _write(out: Path, name: str, data: str) -> None:
    _write_bytes(out, name, data.encode())


def _write_bytes(out: Path, name: str, data: bytes) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(data)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exporter.pipeline.job")
    parser.add_argument("command", choices=[*COMMANDS])
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--kind")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--base", action="append", default=[], help="compare: a BASE replicate")
    parser.add_argument("--head", action="append", default=[], help="compare: a HEAD replicate")
    parser.add_argument("--history", action="append", default=[], help="an earlier run")
    parser.add_argument("--shown-as", help="analyze: the name the user gave the input")
    parser.add_argument("--frames", help="subtree: JSON list of frame names, root first")
    parser.add_argument("--limit", type=int, default=50, help="subtree: children shown")
    parser.add_argument("--baseline", action="append", help="analyze: a baseline replicate")
    parser.add_argument("--replicate", action="append", default=[], help="analyze: INPUT's")
    parser.add_argument("--baseline-session")
    parser.add_argument("--baseline-reason", default="given")
    parser.add_argument("--history-ns", help="JSON list: earlier runs' median step (ns)")
    parser.add_argument("--memory-samples")
    parser.add_argument("--links")
    parser.add_argument("--title")
    parser.add_argument("--store")
    parser.add_argument("--shared-dir")
    parser.add_argument("--pyroscope-url")
    parser.add_argument("--from", dest="time_from")
    parser.add_argument("--until", dest="time_until")
    parser.add_argument("--profile-type")
    parser.add_argument("--no-xprof", action="store_true")
    parser.add_argument("--max-profile-bytes", type=int)
    parser.add_argument("--max-profile-ratio", type=float)
    parser.add_argument("--max-memory-mb", type=int, help="address-space limit (RLIMIT_AS)")
    parser.add_argument("--capture", action="append", default=[], help="session: a file")
    parser.add_argument("--report", action="store_true", help="session: also its report")
    ns = parser.parse_args(argv)
    if ns.max_memory_mb:  # run by hand: run_job's sandbox has set its own limit already
        limit_memory(ns.max_memory_mb)
    from exporter.errors import MlprofError
    from exporter.heap import keep_freed_memory

    # This child converts or analyses one input and exits: its large numpy temporaries
    # reuse pages already faulted in (exporter.heap). The sidecar that starts it does not.
    keep_freed_memory()

    session: _SessionReads | None = None
    try:
        *specs, out_text = ns.inputs
        out = Path(out_text)
        if ns.command == "flamegraphs":
            if ns.kind not in CONVERT_KINDS:
                raise ValueError(f"--kind {ns.kind!r}: expected one of {', '.join(CONVERT_KINDS)}")
            listing = _write_graphs(out, _convert(Path(specs[0]), ns.kind, ns))
            _write(out, GRAPHS_JSON, json.dumps(listing))
            return 0
        if ns.command == "session":
            # One child per finished session: its files converted and, with --report,
            # its report as ``analyze`` makes it, from one read of each capture.
            session = _SessionReads(Path(specs[0]), ns.capture, out, ns)
            if not ns.report:
                session.finish()
                return 0
            session.convert_others()
            from exporter.analysis.facts.capture import graph_reader

            graph_reader.set(session)
            ns.command = "analyze"
        context = _context(ns)
        if ns.command == "sides":
            from exporter.analysis.sides.load import load_side

            load_side(specs[0], None, context)
            return 0
        from exporter import usecases

        if ns.command == "analyze":
            samples = json.loads(ns.memory_samples) if ns.memory_samples else []
            report = usecases.analyze(
                specs[0],
                context,
                baseline=ns.baseline,
                xprof=not ns.no_xprof,
                shown_as=ns.shown_as,
                baseline_session=ns.baseline_session,
                baseline_reason=ns.baseline_reason,
                memory_samples=samples,
                history=json.loads(ns.history_ns) if ns.history_ns else None,
                replicates=ns.replicate,
                history_specs=ns.history,
            )
            report.links = json.loads(ns.links) if ns.links else {}
            _write_bytes(out, REPORT_JSON, usecases.report_document(report, "json"))
            _write_bytes(out, REPORT_HTML, usecases.report_document(report, "html", ns.title))
        elif ns.command == "compare":
            # BASE HEAD OUT, or OUT with --base/--head replicates.
            base, head = (ns.base, ns.head) if ns.base or ns.head else ([specs[0]], specs[1:2])
            comparison = usecases.compare(base, head, context, kind=ns.kind, history=ns.history)
            document = usecases.comparison_document
            _write_bytes(out, COMPARE_JSON, document(comparison, "json", ns.top))
            _write_bytes(out, COMPARE_HTML, document(comparison, "html"))
        else:  # subtree
            from exporter.config import load_settings

            frames = json.loads(ns.frames) if ns.frames else []
            # The door's inflation bounds (ChildLimits.args) over the environment's.
            bounds = {"max_profile_bytes": ns.max_profile_bytes,
                      "max_profile_ratio": ns.max_profile_ratio}  # fmt: skip
            answer = usecases.flamegraph_subtree(
                specs[0], context, frames, ns.kind, ns.limit, settings=load_settings(None, **bounds)
            )
            _write(out, SUBTREE_JSON, json.dumps(answer))
    except (MlprofError, ValueError) as exc:
        print(f"mlprof: {exc}", file=sys.stderr)
        return 1
    finally:
        if session is not None:  # what the report's facts did not convert, failed or not
            session.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
