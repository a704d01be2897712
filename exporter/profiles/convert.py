"""One entry point from a file or session to a flame graph and its rendering.

Inputs: an XProf capture (``*.xplane.pb``), a device-memory pprof (gzip), a PyTorch CUDA
memory snapshot (``*.pickle``, read by ``torch_memory``), a torch.profiler trace
(Kineto's Chrome-trace JSON, plain or gzipped, found by content: ``torch_trace``), or a
session directory (XProf's
``plugins/profile/<session>/<host>.xplane.pb`` layout, or any folder holding captures),
whose hosts are merged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from google.protobuf.message import DecodeError

from exporter.errors import InputError
from exporter.profiles.capture_files import CAPTURES_NAMED, find_captures, is_capture_name
from exporter.profiles.flamegraph import FlameGraph

# The readers and writers load when an input or format needs them: an XProf capture's
# graph imports neither PyTorch reader (their protobuf and JSON modules are a tenth of
# ``mlprof flamegraph``'s start-up on a small capture).
if TYPE_CHECKING:
    from exporter.profiles.pprof import InflateLimits
    from exporter.profiles.xplane import Capture

__all__ = [
    "FORMATS",
    "KINDS",
    "flamegraph_from_capture",
    "flamegraph_from_path",
    "is_pprof",
    "render",
]

Kind = Literal["device", "host", "memory"]
KINDS: tuple[Kind, ...] = ("device", "host", "memory")
FORMATS = ("folded", "pprof", "html")
PPROF_SUFFIXES = (".pprof.gz", ".pprof", ".pb.gz")
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")  # torch_memory.SNAPSHOT_SUFFIXES (a test holds them equal)
MEMORY_SUFFIXES = (*PPROF_SUFFIXES, *SNAPSHOT_SUFFIXES)
GZIP_MAGIC = b"\x1f\x8b"


def flamegraph_from_capture(
    capture: Capture, kind: Kind | None = None, per_step: bool = False
) -> FlameGraph:
    """The device or host flame graph of one capture (``None``: device when present).

    ``per_step`` divides device time by the number of steps on the ``Steps`` line.
    """
    if kind == "memory":
        raise InputError(
            f"{capture.source}: is an XProf capture; --kind memory needs a device-memory "
            "pprof (from jax.profiler.device_memory_profile())"
        )
    from exporter.profiles.xplane import device_flamegraph, host_flamegraph

    planes = ", ".join(capture.plane_names) or "none"
    if kind in (None, "device"):
        graph = device_flamegraph(capture)
        if graph is not None and per_step:
            if not capture.steps:
                raise InputError(f"{capture.source}: --per-step: no Steps line on the devices")
            return graph.scaled(1 / capture.steps)
        if graph is not None:
            return graph
        if kind == "device":
            raise InputError(
                f"{capture.source}: no device planes (/device:TPU:N or /device:GPU:N) in "
                f"this capture (planes: {planes}); try --kind host"
            )
    if per_step:
        raise InputError(f"{capture.source}: --per-step needs device planes (a Steps line)")
    graph = host_flamegraph(capture)
    if graph is not None:
        return graph
    raise InputError(
        f"{capture.source}: nothing to convert: no device planes (/device:TPU:N, "
        f"/device:GPU:N) and no host events (/host:CPU) in this capture (planes: {planes})"
    )


def is_pprof(path: Path) -> bool:
    """Whether ``path`` is a pprof: by its suffix, else by gzip's magic bytes."""
    if is_capture_name(path.name):
        return False
    if path.name.endswith(PPROF_SUFFIXES):
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _is_memory_file(path: Path) -> bool:
    if is_capture_name(path.name):
        return False
    from exporter.profiles.torch_memory import is_torch_snapshot

    return is_pprof(path) or is_torch_snapshot(path)


def _is_torch_trace(path: Path) -> bool:
    if is_capture_name(path.name):  # an XProf capture's name: read as one, as it always was
        return False
    from exporter.profiles.torch_trace import is_torch_trace

    return is_torch_trace(path)


def _session_files(directory: Path, kind: Kind | None) -> list[Path]:
    if kind == "memory":
        found = sorted(p for s in MEMORY_SUFFIXES for p in directory.rglob(f"*{s}"))
        what = "device-memory profiles (*.pprof.gz) or PyTorch memory snapshots (*.pickle)"
    else:
        from exporter.profiles.torch_trace import find_traces

        found = find_captures(directory) or find_traces(directory)
        what = f"XProf captures ({CAPTURES_NAMED}) or torch.profiler traces (*.json[.gz])"
    if not found:
        raise InputError(f"{directory}: no {what} in this session directory")
    return found


def flamegraph_from_path(
    path: Path,
    kind: Kind | None = None,
    per_step: bool = False,
    limits: InflateLimits | Callable[[], InflateLimits] | None = None,
) -> FlameGraph:
    """Build the flame graph of a capture, memory profile or session directory.

    ``limits`` (or a function giving them, called only for a memory profile) bound how
    far a compressed memory profile may inflate.
    """
    if not path.exists():
        raise InputError(f"{path}: no such file, directory or session in the store")
    try:
        if path.is_dir():
            files = _session_files(path, kind)
            graphs = [flamegraph_from_path(p, kind, per_step, limits) for p in files]
            merged = graphs[0]
            for other in graphs[1:]:
                merged.merge(other)
            return merged
        if _is_torch_trace(path):  # before pprof: a gzipped trace has gzip's magic too
            from exporter.profiles.torch_trace import flamegraph_from_trace, load_torch_trace

            return flamegraph_from_trace(load_torch_trace(path), kind, per_step)
        if _is_memory_file(path):
            if per_step:
                raise InputError(f"{path}: --per-step applies to device time, not memory")
            if kind not in (None, "memory"):
                raise InputError(
                    f"{path}: is a device-memory profile; it has no {kind} time (use --kind memory)"
                )
            from exporter.profiles.torch_memory import is_torch_snapshot

            if is_torch_snapshot(path):
                from exporter.profiles.torch_memory import load_torch_memory_profile

                return load_torch_memory_profile(path, follow_symlinks=True)  # the user's path
            from exporter.profiles.memory import load_memory_profile

            return load_memory_profile(path, limits() if callable(limits) else limits)
        from exporter.profiles.xplane import load_capture

        with load_capture(path) as capture:
            return flamegraph_from_capture(capture, kind, per_step)
    except (DecodeError, ValueError, IndexError, KeyError, UnicodeDecodeError) as exc:
        # Whatever slips past the readers' own checks is still a bad input, not a crash.
        raise InputError(f"{path}: cannot convert ({type(exc).__name__}: {exc})") from None


def render(graph: FlameGraph, fmt: str, title: str = "Flame graph") -> bytes:
    """``graph`` as folded text, gzip pprof or a self-contained HTML page."""
    if fmt == "folded":
        return graph.to_folded().encode("utf-8")
    if fmt == "pprof":
        from exporter.profiles.pprof import encode_pprof

        return encode_pprof(graph)
    if fmt == "html":
        from exporter.profiles.html import render_html

        return render_html(graph, title).encode("utf-8")
    raise ValueError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
