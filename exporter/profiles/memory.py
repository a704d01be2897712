"""Device-memory profiles -> in-use flame graphs (bytes, and live allocations).

Input is a pprof (gzip or raw) of live allocations: the one
``jax.profiler.device_memory_profile()`` returns (sample types ``allocations/count``
and ``space/bytes``, one sample per live buffer or loaded executable, its Python
allocation stack as locations, labels ``kind`` and ``device``), or one already in
Pyroscope's names (``inuse_objects/count``, ``inuse_space/bytes``, e.g. converted from
a PyTorch CUDA memory snapshot). The flame graph is stacked device > Python frames
(outermost first): ``inuse_space`` in bytes, with ``inuse_objects`` (live allocations)
as its companion, so "many small allocations" shows; both go into one pprof, which
Pyroscope splits into ``memory:inuse_space:bytes:space:bytes`` and
``memory:inuse_objects:count:space:bytes``.
"""

from __future__ import annotations

import os
from pathlib import Path

from exporter.errors import InputError
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.frames import FrameLabel, label_native, label_python
from exporter.profiles.pprof import InflateLimits, decode_pprof, graphs_from_pprof
from exporter.proto import profile_pb2
from exporter.regular_files import NotRegularFileError, open_regular

__all__ = ["in_use_bytes", "load_memory_profile", "memory_flamegraph"]

SPACE = "space"
SPACE_TYPES = (SPACE, "inuse_space")  # JAX's name, Pyroscope's name
OBJECT_TYPES = ("allocations", "inuse_objects")


def _relabel(label: FrameLabel) -> FrameLabel:
    if label.name.startswith("0x") or not label.file:
        return label_native(label.name, label.file, label.line)
    return label_python(label.name, label.file, label.line)


def _type_index(profile: profile_pb2.Profile, wanted: tuple[str, ...]) -> int | None:
    names = [profile.string_table[v.type] for v in profile.sample_type]
    return next((names.index(w) for w in wanted if w in names), None)


def _space_index(profile: profile_pb2.Profile, source: str) -> int:
    index = _type_index(profile, SPACE_TYPES)
    if index is None:
        names = [profile.string_table[v.type] for v in profile.sample_type]
        raise InputError(
            f"{source}: not a device-memory profile (sample types {names}, expected "
            "'space' or 'inuse_space')"
        )
    return index


def in_use_bytes(profile: profile_pb2.Profile, source: str = "profile") -> int:
    """Sum of the profile's ``space`` values: the bytes in use when it was taken."""
    index = _space_index(profile, source)
    return sum(s.value[index] for s in profile.sample if len(s.value) > index)


def memory_flamegraph(
    data: bytes, source: str = "profile", limits: InflateLimits | None = None
) -> FlameGraph:
    """The in-use-space flame graph (bytes) of a memory pprof, live allocations beside.

    The ``inuse_objects`` graph (count) is the result's companion when the profile
    counts allocations.
    """
    try:
        profile = decode_pprof(data, source, limits)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    index = _space_index(profile, source)
    table = profile.string_table
    device_key = next((i for i, s in enumerate(table) if s == "device"), -1)

    def device(sample: profile_pb2.Sample) -> list[str]:
        for label in sample.label:
            if label.key == device_key and label.str:
                return [table[label.str]]
        return []

    objects = _type_index(profile, OBJECT_TYPES)
    wanted = [index] if objects is None else [index, objects]
    try:
        graphs = graphs_from_pprof(
            profile,
            [profile.string_table[profile.sample_type[i].type] for i in wanted],
            profile_name="memory",
            relabel=_relabel,
            prefix=device,
        )
    except (IndexError, KeyError) as exc:
        # A string or table index past its table: the file is corrupt, not our bug.
        raise InputError(f"{source}: corrupt pprof profile ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:  # negative values, or more frames than MAX_PROFILE_FRAMES
        raise InputError(f"{source}: {exc}") from None
    # Pyroscope's memory profile types: memory:<name>:<unit>:space:bytes.
    for graph, (name, unit) in zip(
        graphs, (("inuse_space", "bytes"), ("inuse_objects", "count")), strict=False
    ):
        graph.sample_type, graph.unit = name, unit
        graph.period_type, graph.period_unit = "space", "bytes"
    space, *companions = graphs
    space.companions = companions
    return space


def load_memory_profile(
    path: Path,
    limits: InflateLimits | None = None,
    *,
    follow_symlinks: bool = True,
    below: Path | None = None,
) -> FlameGraph:
    """Read a memory pprof file and build its flame graph.

    Only a regular file is read (a FIFO or device in the shared directory would block
    or never end), and none larger than ``limits.max_bytes``; the sidecar's watcher
    refuses symbolic links too (``follow_symlinks=False``), and with ``below`` (the shared
    directory) a link in any directory between it and the file.
    """
    limits = limits or InflateLimits()
    try:
        with open_regular(path, follow_symlinks=follow_symlinks, below=below) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limits.max_bytes:
                raise InputError(
                    f"{path}: refused, {size} bytes is over MLPROF_MAX_PROFILE_BYTES="
                    f"{limits.max_bytes}"
                )
            # Its own size, not max_bytes: read(n) allocates n bytes first (64 MiB a file).
            data = handle.read(min(size, limits.max_bytes) + 1)
    except NotRegularFileError as exc:
        raise InputError(f"{exc}, expected a memory pprof") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read memory profile ({exc.strerror or exc})") from None
    if not data:
        raise InputError(f"{path}: empty file, expected a device-memory pprof")
    return memory_flamegraph(data, str(path), limits)
