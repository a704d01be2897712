"""FlameGraph <-> pprof ``Profile`` (gzip-compressed protobuf, as Pyroscope ingests it).

Export writes one sample per node that has a self value (its stack leaf-first), with
function and location tables deduplicated; import folds samples back into a tree.

Functions are keyed as pprof's ``merge.go`` keys them (name, system name, file, start
line), so two frames of the same name in different files stay two functions. A frame's
line is the function's ``start_line`` (its definition) when the profile gives one, else
the line of its location; export writes it as both.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.frames import FrameLabel
from exporter.proto import profile_pb2

__all__ = ["InflateLimits", "decode_pprof", "encode_pprof", "from_pprof", "inflate", "to_pprof"]

Profile = profile_pb2.Profile
LabelFn = Callable[[profile_pb2.Sample, list[str]], list[FrameLabel]]


class _Strings:
    """pprof's string table: index 0 is the empty string."""

    def __init__(self, profile: profile_pb2.Profile) -> None:
        self._table = profile.string_table
        self._index: dict[str, int] = {"": 0}
        self._table.append("")

    def __call__(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self._table)
            self._table.append(text)
        return found


def to_pprof(graph: FlameGraph) -> profile_pb2.Profile:
    """Build a pprof Profile: one sample per stack with a self value, tables deduplicated.

    The graph's companions come first as further sample types and the graph's own
    sample type last (pprof's default); a stack missing from one of them has 0 there.
    """
    profile = profile_pb2.Profile()
    strings = _Strings(profile)
    parts = [*graph.companions, graph]
    for part in parts:
        sample_type = profile.sample_type.add()
        sample_type.type = strings(part.sample_type)
        sample_type.unit = strings(part.unit)
    profile.period_type.type = strings(graph.period_type)
    profile.period_type.unit = strings(graph.period_unit)
    profile.period = graph.period
    profile.time_nanos = graph.time_nanos
    profile.duration_nanos = graph.duration_nanos
    # One mapping: Pyroscope and `go tool pprof` expect locations to name one.
    mapping = profile.mapping.add()
    mapping.id = 1
    mapping.has_functions = True
    mapping.has_filenames = True
    mapping.has_line_numbers = True

    functions: dict[tuple[str, str, str, int], int] = {}
    locations: dict[tuple[int, int], int] = {}
    node_location: dict[int, int] = {}

    def location_of(node: Frame) -> int:
        loc_id = node_location.get(id(node))
        if loc_id is not None:
            return loc_id
        fkey = (node.name, node.name, node.file, node.line)  # name, system name, file, start
        fn_id = functions.get(fkey)
        if fn_id is None:
            fn_id = functions[fkey] = len(functions) + 1
            fn = profile.function.add()
            fn.id = fn_id
            fn.name = fn.system_name = strings(node.name)
            fn.filename = strings(node.file)
            fn.start_line = node.line
        lkey = (fn_id, node.line)
        loc_id = locations.get(lkey)
        if loc_id is None:
            loc_id = locations[lkey] = len(locations) + 1
            loc = profile.location.add()
            loc.id = loc_id
            loc.mapping_id = 1
            line = loc.line.add()
            line.function_id = fn_id
            line.line = node.line
        node_location[id(node)] = loc_id
        return loc_id

    if not graph.companions:
        for ancestors, node in graph.paths():
            if node.self_value:
                sample = profile.sample.add()
                sample.location_id.extend(location_of(f) for f in reversed((*ancestors, node)))
                sample.value.append(node.self_value)
        return profile
    # Several sample types: one sample per distinct stack (by frame identity).
    stacks: dict[tuple[tuple[str, str, int], ...], tuple[list[int], list[int]]] = {}
    for index, part in enumerate(parts):
        for ancestors, node in part.paths():
            if not node.self_value:
                continue
            frames = (*ancestors, node)
            key = tuple(f.key for f in frames)
            entry = stacks.get(key)
            if entry is None:
                entry = stacks[key] = ([location_of(f) for f in reversed(frames)], [0] * len(parts))
            entry[1][index] += node.self_value
    for locations_ids, values in stacks.values():
        sample = profile.sample.add()
        sample.location_id.extend(locations_ids)
        sample.value.extend(values)
    return profile


def encode_pprof(graph: FlameGraph, level: int = 6) -> bytes:
    """The gzip-compressed serialized pprof of ``graph``."""
    return gzip.compress(to_pprof(graph).SerializeToString(), compresslevel=level, mtime=0)


@dataclass(frozen=True, slots=True)
class InflateLimits:
    """How far a compressed profile may inflate (``MLPROF_MAX_PROFILE_BYTES``/``_RATIO``).

    A profile larger than ``max_bytes`` uncompressed, or inflating more than
    ``max_ratio`` times its compressed size (beyond ``RATIO_FLOOR`` bytes), is refused:
    a 1 MB gzip of zeros must not become gigabytes in the sidecar.
    """

    max_bytes: int = 64 * 1024 * 1024  # Pyroscope itself takes 4 MiB; JAX's are KBs
    max_ratio: float = 200.0  # pprof compresses 5-30x; zero-filled bombs 1000x


RATIO_FLOOR = 1 << 20  # below 1 MiB out, any ratio is fine (tiny gzip headers dominate)
_CHUNK = 1 << 20


def inflate(data: bytes, what: str, limits: InflateLimits | None = None) -> bytes:
    """Gunzip ``data`` in bounded chunks; ValueError (one line) past the limits."""
    limits = limits or InflateLimits()
    cap = min(limits.max_bytes, max(RATIO_FLOOR, int(len(data) * limits.max_ratio)))
    out = bytearray()
    rest = data
    try:
        while rest:  # a gzip file may hold several members, one after the other
            stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pending = rest
            while pending and not stream.eof:
                out += stream.decompress(pending, _CHUNK)
                pending = stream.unconsumed_tail
                if len(out) > cap:
                    raise ValueError(_too_big(what, len(data), cap, limits))
            if not stream.eof:
                raise ValueError(f"{what}: truncated or corrupt gzip data (ends early)")
            rest = stream.unused_data
            if rest[:2] != b"\x1f\x8b":
                break  # trailing padding after the last member, as gzip tolerates
    except zlib.error as exc:
        raise ValueError(f"{what}: truncated or corrupt gzip data ({exc})") from None
    return bytes(out)


def _too_big(what: str, size: int, cap: int, limits: InflateLimits) -> str:
    if cap == limits.max_bytes:
        why = f"over MLPROF_MAX_PROFILE_BYTES={limits.max_bytes}"
    else:
        why = f"over {limits.max_ratio:g}x its size (MLPROF_MAX_PROFILE_RATIO)"
    return f"{what}: refused, its {size} gzip bytes inflate to more than {cap} bytes ({why})"


def decode_pprof(
    data: bytes, what: str = "profile", limits: InflateLimits | None = None
) -> profile_pb2.Profile:
    """Parse pprof bytes (gzip or not); ValueError naming ``what`` when it is not pprof.

    Compressed input inflates in bounded chunks (``limits``); raw input larger than
    ``limits.max_bytes`` is refused before parsing.
    """
    raw = data
    if data[:2] == b"\x1f\x8b":
        raw = inflate(data, what, limits)
    elif len(data) > (limits or InflateLimits()).max_bytes:
        raise ValueError(
            f"{what}: refused, {len(data)} bytes is over MLPROF_MAX_PROFILE_BYTES="
            f"{(limits or InflateLimits()).max_bytes}"
        )
    profile = profile_pb2.Profile()
    try:
        profile.ParseFromString(raw)
    except DecodeError:
        raise ValueError(f"{what}: not a pprof profile (protobuf does not parse)") from None
    table = profile.string_table
    if not table or table[0] != "":
        raise ValueError(f"{what}: not a pprof profile (string table must start with '')")
    bad = [i for v in profile.sample_type for i in (v.type, v.unit) if not 0 <= i < len(table)]
    if bad or not profile.sample_type:
        raise ValueError(f"{what}: not a pprof profile (no valid sample types)")
    return profile


def _stack_labels(
    profile: profile_pb2.Profile,
) -> Callable[[profile_pb2.Sample], list[FrameLabel]]:
    table = profile.string_table
    functions = {f.id: f for f in profile.function}
    cache: dict[int, list[FrameLabel]] = {}

    def location_labels(loc: profile_pb2.Location) -> list[FrameLabel]:
        if not loc.line:
            return [FrameLabel(f"0x{loc.address:x}")]
        out = []
        # Inlined frames: line[0] is the innermost; we want outermost-first.
        for line in reversed(loc.line):
            fn = functions.get(line.function_id)
            name = table[fn.name] if fn is not None else ""
            file = table[fn.filename] if fn is not None else ""
            # Identity: the definition line where given, else the location's line.
            start = fn.start_line if fn is not None else 0
            out.append(FrameLabel(name or f"0x{loc.address:x}", file, start or line.line))
        return out

    locations = {loc.id: loc for loc in profile.location}

    def stack(sample: profile_pb2.Sample) -> list[FrameLabel]:
        frames: list[FrameLabel] = []
        for loc_id in reversed(sample.location_id):
            labels = cache.get(loc_id)
            if labels is None:
                loc = locations.get(loc_id)
                labels = cache[loc_id] = (
                    location_labels(loc) if loc else [FrameLabel(f"<location {loc_id}>")]
                )
            frames.extend(labels)
        return frames

    return stack


def from_pprof(
    profile: profile_pb2.Profile,
    sample_type: str | None = None,
    profile_name: str = "profile",
    relabel: Callable[[FrameLabel], FrameLabel] | None = None,
    prefix: Callable[[profile_pb2.Sample], list[str]] | None = None,
) -> FlameGraph:
    """Fold a pprof Profile into a FlameGraph of one sample type (default: the last one).

    ``relabel`` maps each frame label (e.g. to the house convention); ``prefix`` gives
    extra root-side frames per sample (e.g. the device a buffer lives on).
    """
    table = profile.string_table
    types = [(table[v.type], table[v.unit]) for v in profile.sample_type]
    names = [t for t, _ in types]
    if sample_type is None:
        index = len(types) - 1
    elif sample_type in names:
        index = names.index(sample_type)
    else:
        raise ValueError(f"sample type {sample_type!r} not in profile (has {names})")
    graph = FlameGraph(
        sample_type=types[index][0],
        unit=types[index][1],
        profile_name=profile_name,
        period_type=table[profile.period_type.type] if profile.HasField("period_type") else "",
        period_unit=table[profile.period_type.unit] if profile.HasField("period_type") else "",
        period=profile.period or 1,
        time_nanos=profile.time_nanos,
        duration_nanos=profile.duration_nanos,
    )
    stack_of = _stack_labels(profile)
    for sample in profile.sample:
        if index >= len(sample.value) or not sample.value[index]:
            continue  # zero-valued stacks would only add empty frames
        frames: list[str | FrameLabel] = list(prefix(sample)) if prefix else []
        labels = stack_of(sample)
        frames.extend(relabel(label) for label in labels) if relabel else frames.extend(labels)
        graph.add(frames, sample.value[index])
    return graph
