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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.profiles.frames import FrameLabel
from exporter.proto import profile_pb2

__all__ = [
    "MAX_PROFILE_FRAMES",
    "InflateLimits",
    "decode_pprof",
    "encode_pprof",
    "from_pprof",
    "graphs_from_pprof",
    "inflate",
    "to_pprof",
]

Profile = profile_pb2.Profile
# Frames one profile may fold into (per graph). A location's inlined lines repeat under
# every distinct stack prefix that reaches it, so L lines under S prefixes make L*S
# frames from a file of L+S entries: 15.7 KB made 61 s and 4 GB. Real profiles (JAX
# device memory, agents' CPU) have thousands to tens of thousands; a frame costs ~400
# bytes, so this bound keeps one graph under ~400 MB.
MAX_PROFILE_FRAMES = 1_000_000


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
    if graph.companions:
        profile.default_sample_type = strings(graph.sample_type)
    profile.period = graph.period
    profile.time_nanos = graph.time_nanos
    profile.duration_nanos = graph.duration_nanos
    profile.comment.extend(strings(text) for text in graph.comments)
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

    # One sample per distinct stack: stacks are interned as (parent stack, location), so
    # each node costs O(1) and only a sample's own location list is O(depth).
    stack_ids: dict[tuple[int, int], int] = {}
    stack_parent: list[int] = [-1]
    stack_location: list[int] = [0]
    values: dict[int, list[int]] = {}
    for index, part in enumerate(parts):
        # Pre-order, children in graph order: samples come out as the tree reads.
        pending = [(c, 0) for c in reversed(list(part.root.children.values()))]
        while pending:
            node, parent = pending.pop()
            key = (parent, location_of(node))
            stack = stack_ids.get(key)
            if stack is None:
                stack = stack_ids[key] = len(stack_parent)
                stack_parent.append(parent)
                stack_location.append(key[1])
            if node.self_value:
                values.setdefault(stack, [0] * len(parts))[index] += node.self_value
            pending.extend((c, stack) for c in reversed(list(node.children.values())))
    for leaf, counts in values.items():
        sample = profile.sample.add()
        leaf_first = []
        stack = leaf
        while stack > 0:
            leaf_first.append(stack_location[stack])
            stack = stack_parent[stack]
        sample.location_id.extend(leaf_first)
        sample.value.extend(counts)
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


def _string(table: Sequence[str], index: int) -> str:
    """``table[index]``; ValueError (one line) for an index the table does not have."""
    if not 0 <= index < len(table):
        raise ValueError(f"corrupt pprof: string index {index} is past its {len(table)} strings")
    return table[index]


def _location_labels(
    profile: profile_pb2.Profile,
    relabel: Callable[[FrameLabel], FrameLabel] | None,
) -> Callable[[int], list[FrameLabel]]:
    """Labels of a location (root-most first), computed and relabelled once each."""
    table = profile.string_table
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    cache: dict[int, list[FrameLabel]] = {}

    def labels(loc_id: int) -> list[FrameLabel]:
        found = cache.get(loc_id)
        if found is not None:
            return found
        loc = locations.get(loc_id)
        if loc is None:
            out = [FrameLabel(f"<location {loc_id}>")]
        else:
            out = [] if loc.line else [FrameLabel(f"0x{loc.address:x}")]
            # Inlined frames: line[0] is the innermost; we want outermost-first.
            for line in reversed(loc.line):
                fn = functions.get(line.function_id)
                name = _string(table, fn.name) if fn is not None else ""
                file = _string(table, fn.filename) if fn is not None else ""
                # Identity: the definition line where given, else the location's line.
                start = fn.start_line if fn is not None else 0
                out.append(FrameLabel(name or f"0x{loc.address:x}", file, start or line.line))
        found = cache[loc_id] = [relabel(x) for x in out] if relabel else out
        return found

    return labels


def graphs_from_pprof(
    profile: profile_pb2.Profile,
    sample_types: Sequence[str],
    profile_name: str = "profile",
    relabel: Callable[[FrameLabel], FrameLabel] | None = None,
    prefix: Callable[[profile_pb2.Sample], list[str]] | None = None,
    max_frames: int = MAX_PROFILE_FRAMES,
) -> list[FlameGraph]:
    """Fold a pprof Profile into one FlameGraph per sample type named, in one pass.

    ``relabel`` maps each frame label (e.g. to the house convention); ``prefix`` gives
    extra root-side frames per sample (e.g. the device a buffer lives on). Stacks are
    first interned as (parent, location id) pairs, so the cost is one dictionary look-up
    per stack entry and one frame per distinct stack prefix; a stack with a zero value
    for a sample type adds no frames to that type's graph. Frames are counted before
    any is made: past ``max_frames`` (inlined lines repeated under many prefixes),
    ValueError in one line.
    """
    table = profile.string_table
    types = [(_string(table, v.type), _string(table, v.unit)) for v in profile.sample_type]
    names = [t for t, _ in types]
    for wanted in sample_types:
        if wanted not in names:
            raise ValueError(f"sample type {wanted!r} not in profile (has {names})")
    columns = [names.index(t) for t in sample_types]
    has_period = profile.HasField("period_type")
    graphs = [
        FlameGraph(
            sample_type=types[c][0],
            unit=types[c][1],
            profile_name=profile_name,
            period_type=_string(table, profile.period_type.type) if has_period else "",
            period_unit=_string(table, profile.period_type.unit) if has_period else "",
            period=profile.period or 1,
            time_nanos=profile.time_nanos,
            duration_nanos=profile.duration_nanos,
            comments=[table[i] for i in profile.comment if 0 <= i < len(table)],
        )
        for c in columns
    ]
    nodes: dict[tuple[int, int | str], int] = {}
    parent_of: list[int] = [-1]
    key_of: list[int | str] = [0]
    values: dict[int, list[int]] = {}
    for number, sample in enumerate(profile.sample):
        counts = [sample.value[c] if c < len(sample.value) else 0 for c in columns]
        if not any(counts):
            continue
        if min(counts) < 0:
            # A flame graph of negative time or bytes is a diff (pprof -diff_base), not a
            # profile: refuse it rather than show negative totals as if they were real.
            raise ValueError(
                f"sample {number} has a negative value ({min(counts)}): a diff profile? "
                "expected a profile of non-negative samples"
            )
        node = 0
        steps: list[int | str] = list(prefix(sample)) if prefix else []
        steps.extend(reversed(sample.location_id))
        for step in steps:
            key = (node, step)
            found = nodes.get(key)
            if found is None:
                found = nodes[key] = len(parent_of)
                parent_of.append(node)
                key_of.append(step)
            node = found
        total = values.get(node)
        if total is None:
            values[node] = counts
        else:
            for i, v in enumerate(counts):
                total[i] += v
    labels_of = _location_labels(profile, relabel)
    for index, graph in enumerate(graphs):
        # Frames only where this sample type has a value at or below the node.
        used = [False] * len(parent_of)
        for leaf, counts in values.items():
            node = leaf
            while counts[index] and node > 0 and not used[node]:
                used[node] = True
                node = parent_of[node]
        expanded = sum(
            1 if isinstance(key_of[node], str) else len(labels_of(int(key_of[node])))
            for node in range(1, len(parent_of))
            if used[node]
        )
        if expanded > max_frames:
            raise ValueError(
                f"its {len(profile.location)} locations at "
                f"{sum(used)} distinct stack positions expand to {expanded} frames "
                f"(inlined lines repeat under each prefix), more than {max_frames}: refused"
            )
        frames: dict[int, Frame] = {0: graph.root}
        for node in range(1, len(parent_of)):
            if not used[node]:
                continue
            frame = frames[parent_of[node]]
            step = key_of[node]
            for label in [FrameLabel(step)] if isinstance(step, str) else labels_of(step):
                frame = frame.child(label.name, label.file, label.line)
            frames[node] = frame
        for node, counts in values.items():
            if counts[index]:
                frames[node].self_value += counts[index]
        graph.recompute_totals()
        if graph.root.total >= 1 << 63:  # pprof values are int64: it could not be pushed
            raise ValueError(f"its {graph.sample_type} values sum past 2**63: refused")
    return graphs


def from_pprof(
    profile: profile_pb2.Profile,
    sample_type: str | None = None,
    profile_name: str = "profile",
    relabel: Callable[[FrameLabel], FrameLabel] | None = None,
    prefix: Callable[[profile_pb2.Sample], list[str]] | None = None,
) -> FlameGraph:
    """Fold a pprof Profile into a FlameGraph of one sample type (default: the last one).

    See :func:`graphs_from_pprof`.
    """
    table = profile.string_table
    names = [table[v.type] for v in profile.sample_type]
    wanted = names[-1] if sample_type is None else sample_type
    return graphs_from_pprof(profile, [wanted], profile_name, relabel, prefix)[0]
