"""A capture's per-step sides kept beside it: a comparison reads the baseline once.

Reading a capture into sides (:func:`exporter.analysis.sides.load.capture_side`: the whole
graph, one graph per step cycle, the cycle lengths, for each kind asked for) decodes
every event of it, seconds for a real capture. The result is small: a few thousand
distinct frames and at most :data:`~exporter.analysis.sides.load.MAX_STEP_SAMPLES` steps.
It is kept in ``<capture>.sides.json.gz`` (:data:`SUFFIX`) beside the capture, and a
later read of the same capture (the baseline of every alert-started report, ``mlprof
compare`` against a session) loads it instead of decoding.

Format (``format: mlprof-sides``, ``version:`` :data:`VERSION`), gzip-compressed JSON::

    {"format": "mlprof-sides", "version": 1,
     "capture": {"size": bytes, "blake2b": hex digest of the whole capture},
     "strings": [...],            # every name, file and label, once
     "frames": [parent, name, file, line, ...],   # the union of every graph's frames
     "step_names": [string index, ...],
     "reads": {"device" | "host" | "default": {"chosen", "source", "view", "step_ns",
               "whole": graph, "steps": [graph, ...]} | {"error": message}}}
    graph = {"attrs": [sample_type, unit, profile_name, period_type, period_unit] (string
             indices), "period", "time_nanos", "duration_nanos", "comments": [...],
             "nodes": [frame, self, total, ...] in pre-order, "companions": [graph, ...]}

Why this shape: the step graphs of one capture share their frames, so each frame is
written once (``frames``, a trie by parent index) and a step graph is three numbers per
node; gzip then takes the repetition out (tens to hundreds of KiB for a capture of
hundreds of MB). JSON of flat integer lists has no nesting to recurse into, loads with
the standard library in milliseconds, and a person can read it with ``zcat``; a binary
format would load a little faster and need its own reader to audit.

Trust: the file lies in a session directory, which the workload may write to (the
profiler server writes its capture there). Loading is bounded (:data:`MAX_FILE_BYTES`
read, :data:`MAX_JSON_BYTES` inflated, :data:`MAX_NODES` built), opens the file and the
capture without following a symbolic link (:func:`~exporter.regular_files.open_regular`),
checks every index, and answers None, never an exception, for anything that is not a
cache of *this* capture: another version, another capture (size and content hash:
a copy of a session elsewhere keeps its cache, a rewritten capture loses it), a
truncated, huge or garbage file. A workload that can forge this file can as well forge
the capture itself: the checks keep the reader from crashing or exhausting memory,
they do not make the capture's numbers more true.

Where it is written (:func:`writable`): beside a capture in a session directory of the
store layout (``…/plugins/profile/<session>/<capture>``): the sidecar's own sessions and
``mlprof analyze|compare`` of a session of a local store. A capture anywhere else (a
user's file, a temporary copy of a remote session) is read, never written beside: the
tools do not leave files in a user's directories. Read from anywhere: a cache that
matches its capture is as good as decoding it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from exporter.errors import InputError
from exporter.profiles.flamegraph import FlameGraph, Frame
from exporter.regular_files import open_regular, read_regular, replace_file

__all__ = [
    "FORMAT",
    "MAX_FILE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_NODES",
    "SUFFIX",
    "VERSION",
    "CaptureRead",
    "Fingerprint",
    "cache_path",
    "fingerprint",
    "load",
    "read_capture",
    "save",
    "writable",
]

log = logging.getLogger(__name__)

FORMAT: Final = "mlprof-sides"
# Bump on any change of the layout or of what a read holds: an old file is then ignored
# (and rewritten by the next read), never misread.
VERSION: Final = 1
SUFFIX: Final = ".sides.json.gz"
# A TPU capture of hundreds of MB gives a cache of well under a MiB; these bounds are
# 100x that, and still far below what the analysis child may use.
MAX_FILE_BYTES: Final = 32 << 20
MAX_JSON_BYTES: Final = 256 << 20
MAX_NODES: Final = 20_000_000  # graph nodes and frames together
_MAX_COMPANION_DEPTH: Final = 2  # a graph's companions carry none of their own
_HASH_CHUNK: Final = 1 << 20
# Prints remembered by fingerprint(): (device, inode) -> ((size, mtime, ctime), print).
_PRINTS: dict[tuple[int, int], tuple[tuple[int, int, int], Fingerprint]] = {}
_MAX_PRINTS: Final = 16
_SETTLED_NS: Final = 2_000_000_000  # a file untouched this long is not being written
_now_ns = time.time_ns  # tests set the clock
# The read asked for without a kind (``load_side`` of a capture without ``--kind``).
DEFAULT_KEY: Final = "default"
# Where the path of the capture stood in an error message (a copy elsewhere says its own).
_PATH_MARK: Final = "\x00capture\x00"
_STORE_LAYOUT: Final = ("plugins", "profile")
_SESSION_FILE: Final = "session.json"


@dataclass(frozen=True)
class Fingerprint:
    """What binds a cache to its capture: the size and a hash of every byte."""

    size: int
    blake2b: str
    # (size, mtime_ns, inode) when hashed: a capture rewritten while it is decoded gets
    # no cache. Not written: a copy of the session elsewhere keeps its cache.
    stamp: tuple[int, int, int] = field(default=(0, 0, 0), compare=False)

    def to_json(self) -> dict[str, object]:
        return {"size": self.size, "blake2b": self.blake2b}


@dataclass
class CaptureRead:
    """One kind of one capture as :func:`~exporter.analysis.sides.load.capture_side` read it,
    or the InputError message it raised (``error``)."""

    chosen: str = ""
    whole: FlameGraph | None = None
    steps: list[FlameGraph] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    source: str = "none"
    view: str = ""
    error: str | None = None


def cache_path(capture: Path) -> Path:
    """``<capture>.sides.json.gz``."""
    return capture.with_name(capture.name + SUFFIX)


def writable(capture: Path) -> bool:
    """Whether a cache may be written beside ``capture``: a session of the store layout
    (``…/plugins/profile/<session>/`` holding ``session.json``), see the module doc."""
    parent = capture.parent
    layout = tuple(p.name for p in (parent.parent.parent, parent.parent))
    return layout == _STORE_LAYOUT and (parent / _SESSION_FILE).is_file()


def key_of(kind: str | None) -> str:
    """The name of a read in the file: the kind asked for, or ``default``."""
    return kind or DEFAULT_KEY


def fingerprint(capture: Path) -> Fingerprint | None:
    """Size and content hash of the regular file ``capture`` (no link followed); None
    when it cannot be read so (then nothing is cached for it).

    A session's job asks for the same capture's print up to three times (the facts'
    read, the conversion, the report): each hash of a large capture reads all of it
    again, so a print is remembered for the file while its size, mtime and ctime stay
    as they were (a rewrite moves its ctime, which no one can set back), and only once
    the file has been left alone for :data:`_SETTLED_NS` (a write within the same clock
    tick as the hash keeps both times)."""
    try:
        with open_regular(capture, follow_symlinks=False) as handle:
            st = os.fstat(handle.fileno())
            identity, state = (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            known = _PRINTS.get(identity)
            if known is not None and known[0] == state:
                return known[1]
            settled = _now_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= _SETTLED_NS
            digest = hashlib.blake2b(digest_size=32)
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    print_ = Fingerprint(st.st_size, digest.hexdigest(), _stamp(st))
    if settled:
        _PRINTS.pop(identity, None)
        _PRINTS[identity] = (state, print_)
        while len(_PRINTS) > _MAX_PRINTS:  # the oldest first
            del _PRINTS[next(iter(_PRINTS))]
    return print_


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


# -- writing ---------------------------------------------------------------------------
class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.table: list[str] = []

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.table)
            self.table.append(text)
        return found


class _Writer:
    def __init__(self) -> None:
        self.strings = _Strings()
        # (parent frame, name, file, line) -> frame index; frame 0 is every root.
        self.frame_index: dict[tuple[int, int, int, int], int] = {}
        self.frames: list[int] = [-1, self.strings("root"), self.strings(""), 0]

    def _frame(self, parent: int, node: Frame) -> int:
        key = (parent, self.strings(node.name), self.strings(node.file), node.line)
        found = self.frame_index.get(key)
        if found is None:
            found = self.frame_index[key] = len(self.frames) // 4
            self.frames.extend(key)
        return found

    def graph(self, graph: FlameGraph, depth: int = 0) -> dict[str, Any]:
        s = self.strings
        root = graph.root
        nodes: list[int | float] = []
        # The root's own label is kept as frame 0's when it is the usual one.
        if (root.name, root.file, root.line) != ("root", "", 0):
            raise ValueError(f"graph root {root.name!r}: not the usual root frame")
        stack: list[tuple[Frame, int]] = [(root, -1)]
        while stack:
            node, parent = stack.pop()
            index = 0 if parent < 0 else self._frame(parent, node)
            nodes.extend((index, node.self_value, node.total))
            stack.extend((c, index) for c in reversed(list(node.children.values())))
        if depth + 1 >= _MAX_COMPANION_DEPTH and graph.companions:
            raise ValueError("companions of companions are not kept")
        return {
            "attrs": [
                s(graph.sample_type),
                s(graph.unit),
                s(graph.profile_name),
                s(graph.period_type),
                s(graph.period_unit),
            ],
            "period": graph.period,
            "time_nanos": graph.time_nanos,
            "duration_nanos": graph.duration_nanos,
            "comments": [s(c) for c in graph.comments],
            "nodes": nodes,
            "companions": [self.graph(c, depth + 1) for c in graph.companions],
        }

    def read(self, read: CaptureRead, capture: Path) -> dict[str, Any]:
        if read.error is not None:
            return {"error": read.error.replace(str(capture), _PATH_MARK)}
        assert read.whole is not None
        return {
            "chosen": read.chosen,
            "source": read.source,
            "view": read.view,
            "step_ns": list(read.step_ns),
            "whole": self.graph(read.whole),
            "steps": [self.graph(g) for g in read.steps],
        }


def encode(
    capture: Path, print_: Fingerprint, reads: Mapping[str, CaptureRead], step_names: Iterable[str]
) -> bytes:
    """The cache file's bytes for ``reads`` of ``capture``."""
    writer = _Writer()
    body = {key: writer.read(read, capture) for key, read in reads.items()}
    names = [writer.strings(n) for n in sorted(step_names)]
    document = {
        "format": FORMAT,
        "version": VERSION,
        "capture": print_.to_json(),
        "strings": writer.strings.table,
        "frames": writer.frames,
        "step_names": names,
        "reads": body,
    }
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=True)
    return gzip.compress(text.encode("ascii"), compresslevel=6, mtime=0)


def save(
    capture: Path, print_: Fingerprint, reads: Mapping[str, CaptureRead], step_names: Iterable[str]
) -> bool:
    """Write the cache beside ``capture`` atomically (written beside, renamed into place,
    never through a link) when :func:`writable`; False, logged, when it is not written."""
    if not writable(capture):
        return False
    try:
        data = encode(capture, print_, reads, step_names)
        replace_file(cache_path(capture), data, sync=False)
    except (OSError, ValueError) as exc:  # a cache that is not written is only slower
        log.warning("%s: side cache not written (%s)", capture, exc)
        return False
    return True


# -- reading ---------------------------------------------------------------------------
class _BadCacheError(ValueError):
    """The file is not a usable cache; the message says why (logged at debug)."""


def _inflate(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31)  # gzip only
    out = inflater.decompress(data, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise _BadCacheError(f"inflates beyond {limit} bytes")
    if not inflater.eof:
        raise _BadCacheError("truncated")
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(value: object, what: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise _BadCacheError(f"{what}: expected a list of integers")
    return value


class _Reader:
    def __init__(self, document: dict[str, Any]) -> None:
        strings = document.get("strings")
        if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
            raise _BadCacheError("strings: expected a list of strings")
        self.strings: list[str] = strings
        frames = _ints(document.get("frames"), "frames")
        if len(frames) % 4 or not frames or len(frames) // 4 > MAX_NODES:
            raise _BadCacheError("frames: expected 4 integers per frame")
        count = len(frames) // 4
        self.parents = frames[0::4]
        for i, parent in enumerate(self.parents):
            if not (-1 if i == 0 else 0) <= parent < max(i, 1) or (i == 0) != (parent == -1):
                raise _BadCacheError(f"frame {i}: parent {parent} is not an earlier frame")
        names = [self.string(n) for n in frames[1::4]]
        files = [self.string(f) for f in frames[2::4]]
        self.keys: list[tuple[str, str, int]] = list(zip(names, files, frames[3::4], strict=True))
        self.count = count
        self.nodes_left = MAX_NODES - count

    def string(self, index: object) -> str:
        if not isinstance(index, int) or isinstance(index, bool):
            raise _BadCacheError(f"string index {index!r}: expected an integer")
        if not 0 <= index < len(self.strings):
            raise _BadCacheError(f"string index {index} out of range")
        return self.strings[index]

    def graph(self, data: object, depth: int = 0) -> FlameGraph:
        if not isinstance(data, dict):
            raise _BadCacheError("graph: expected an object")
        attrs = data.get("attrs")
        if not isinstance(attrs, list) or len(attrs) != 5:
            raise _BadCacheError("graph attrs: expected 5 strings")
        sample_type, unit, profile_name, period_type, period_unit = map(self.string, attrs)
        numbers = [data.get(k) for k in ("period", "time_nanos", "duration_nanos")]
        if not all(_is_int(n) for n in numbers):
            raise _BadCacheError("graph period and times: expected integers")
        comments = data.get("comments")
        if not isinstance(comments, list):
            raise _BadCacheError("graph comments: expected a list")
        graph = FlameGraph(
            sample_type=sample_type,
            unit=unit,
            profile_name=profile_name,
            period_type=period_type,
            period_unit=period_unit,
            period=numbers[0],  # type: ignore[arg-type]
            time_nanos=numbers[1],  # type: ignore[arg-type]
            duration_nanos=numbers[2],  # type: ignore[arg-type]
            comments=[self.string(c) for c in comments],
        )
        nodes = data.get("nodes")
        if not isinstance(nodes, list) or len(nodes) < 3 or len(nodes) % 3:
            raise _BadCacheError("graph nodes: expected 3 numbers per node, the root first")
        self.nodes_left -= len(nodes) // 3
        if self.nodes_left < 0:
            raise _BadCacheError(f"more than {MAX_NODES} nodes")
        # Checked a column at a time (this file is read where a comparison waits).
        ids, selfs, totals = nodes[0::3], nodes[1::3], nodes[2::3]
        if {type(v) for v in ids} != {int} or not {type(v) for v in selfs + totals} <= {
            int,
            float,
        }:
            raise _BadCacheError("graph nodes: expected integer frames and numeric values")
        if ids[0] != 0 or min(ids) < 0 or max(ids) >= self.count or len(set(ids)) != len(ids):
            raise _BadCacheError("graph nodes: the root first, then known frames, once each")
        root = graph.root
        root.self_value, root.total = selfs[0], totals[0]
        built: dict[int, Frame] = {0: root}
        parents, keys = self.parents, self.keys
        for index, own, total in zip(ids[1:], selfs[1:], totals[1:], strict=True):
            parent = built.get(parents[index])
            key = keys[index]
            if parent is None or key in parent.children:
                raise _BadCacheError(f"graph frame {index}: its parent comes later, or twice")
            node = parent.children[key] = Frame(*key)
            node.self_value, node.total = own, total
            built[index] = node
        companions = data.get("companions")
        if not isinstance(companions, list) or (companions and depth + 1 >= _MAX_COMPANION_DEPTH):
            raise _BadCacheError("graph companions: expected a list (of graphs without companions)")
        graph.companions = [self.graph(c, depth + 1) for c in companions]
        return graph

    def read(self, data: object, capture: Path) -> CaptureRead:
        if not isinstance(data, dict):
            raise _BadCacheError("read: expected an object")
        if "error" in data:
            error = data["error"]
            if not isinstance(error, str) or len(error) > 4096:
                raise _BadCacheError("read error: expected a short string")
            return CaptureRead(error=error.replace(_PATH_MARK, str(capture)))
        texts = [data.get(k) for k in ("chosen", "source", "view")]
        if not all(isinstance(t, str) for t in texts):
            raise _BadCacheError("read chosen/source/view: expected strings")
        chosen, source, view = (str(t) for t in texts)
        if texts[0] not in ("device", "host"):
            raise _BadCacheError(f"read chosen {texts[0]!r}: expected device or host")
        steps = data.get("steps")
        if not isinstance(steps, list):
            raise _BadCacheError("read steps: expected a list")
        step_ns = _ints(data.get("step_ns"), "step_ns")
        return CaptureRead(
            chosen=chosen,
            whole=self.graph(data.get("whole")),
            steps=[self.graph(g) for g in steps],
            step_ns=list(step_ns),
            source=source,
            view=view,
        )


def decode(
    data: bytes, capture: Path, print_: Fingerprint
) -> tuple[dict[str, CaptureRead], set[str]]:
    """The reads and step names in a cache file's bytes; ``_BadCacheError`` (a ValueError) when it
    is not a cache of this version for the capture ``print_`` describes."""
    text = _inflate(data, MAX_JSON_BYTES)
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _BadCacheError(f"not JSON ({exc.__class__.__name__})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise _BadCacheError("not a side cache")
    if document.get("version") != VERSION:
        raise _BadCacheError(f"version {document.get('version')!r}, expected {VERSION}")
    if document.get("capture") != print_.to_json():
        raise _BadCacheError("made from another capture (size or content differ)")
    reader = _Reader(document)
    reads = document.get("reads")
    if not isinstance(reads, dict):
        raise _BadCacheError("reads: expected an object")
    found = {str(k): reader.read(v, capture) for k, v in reads.items()}
    names = {reader.string(n) for n in _ints(document.get("step_names"), "step_names")}
    return found, names


def load(capture: Path, print_: Fingerprint) -> tuple[dict[str, CaptureRead], set[str]] | None:
    """The cached reads of ``capture`` and its step names; None when there is no usable
    cache (missing, a link, too large, garbage, another version or capture). Never
    raises."""
    path = cache_path(capture)
    try:
        data = read_regular(path, MAX_FILE_BYTES, follow_symlinks=False)
        return decode(data, capture, print_)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, MemoryError, zlib.error) as exc:
        log.info("%s: side cache ignored (%s)", path, exc)
        return None


# -- the one entry point ---------------------------------------------------------------
# The reads of the kinds asked for, and the capture's step names (None when no kind got
# as far as its step windows).
Decode = Callable[[Path, list[str | None]], tuple[dict[str, CaptureRead], set[str] | None]]


def read_capture(
    capture: Path, kinds: Iterable[str | None], decode_kinds: Decode
) -> tuple[dict[str, CaptureRead], set[str]]:
    """The reads of ``capture`` for ``kinds`` (by :func:`key_of`): from its cache where
    it has them, the rest from ``decode_kinds`` (then the cache is rewritten with all
    of them, when :func:`writable`). ``decode_kinds``' own errors pass through."""
    wanted = list(dict.fromkeys(kinds))
    print_ = fingerprint(capture)
    cached = load(capture, print_) if print_ is not None else None
    reads, names = cached if cached is not None else ({}, set())
    missing = [k for k in wanted if key_of(k) not in reads]
    if not missing:
        return reads, names
    decoded, new_names = decode_kinds(capture, missing)
    reads.update(decoded)
    names = new_names if new_names is not None else names
    if print_ is not None and fingerprint_unchanged(capture, print_):
        save(capture, print_, reads, names)
    return reads, names


def fingerprint_unchanged(capture: Path, print_: Fingerprint) -> bool:
    """Whether ``capture`` is still the file that was hashed (size, mtime, inode): one
    rewritten while it was decoded gets no cache, its graphs may be of either content."""
    with contextlib.suppress(OSError):
        return _stamp(capture.lstat()) == print_.stamp
    return False


def raise_error(read: CaptureRead) -> None:
    """Raise the InputError a read recorded, as decoding raised it."""
    if read.error is not None:
        raise InputError(read.error)
