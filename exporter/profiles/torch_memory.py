"""PyTorch CUDA allocator snapshots -> device-memory pprof (live bytes and blocks per stack).

Input is the pickle of ``torch.cuda.memory._snapshot()`` (what ``_dump_snapshot()`` and
the SDK's ``run.memory_snapshot()`` write). Its shape, from PyTorch's own
``torch/cuda/memory.py`` (``_snapshot`` docstring) and ``torch/csrc/cuda/memory_snapshot.cpp``::

    {"segments": [{"device": 0, "address", "total_size", "stream", "blocks": [
        {"address", "size", "requested_size", "state",
         "frames": [{"filename", "line", "name"}, ...]}, ...]}, ...],     # innermost first
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames"}, ...]]}

Variants read: a bare list of segments (old ``torch.cuda.memory_snapshot()`` dumps);
torch 2.0 blocks with ``history: [{"real_size", "frames"}]`` instead of ``frames`` (the
live allocation is ``history[0]``, as ``_memory_viz._block_extra_legacy`` reads it);
blocks without ``requested_size`` (taken as ``size``).

What counts: blocks in state ``active_allocated`` only (``active_pending_free`` was freed
by the program and waits for a stream; ``inactive`` is cache). Bytes are the block's
``size``, not ``requested_size``: ``size`` is what the allocator holds for the allocation
(rounded up to 512 B, or a whole unsplit block), the sum of which is
``torch.cuda.memory_allocated()`` and what an out-of-memory error counts, and the total
of ``_memory_viz memory``'s live blocks (requested plus ``<gaps>``). The requested bytes
ride along as the numeric sample label ``requested_bytes``.
``device_traces`` is the timeline (``pytorch.org/memory_viz`` plays it); only its
``snapshot`` entry is read, for the profile's timestamp.

Output: a pprof with sample types ``inuse_objects``/count and ``inuse_space``/bytes, one
sample per (device, allocation stack), label ``device`` (``cuda:N``); locations carry the
frame label (``frames.py`` convention), file and line; the raw symbol is the function's
``system_name``. :func:`exporter.profiles.memory.memory_flamegraph` makes the flame graph.

Safety: a pickle can run code. :func:`read_snapshot` refuses every global, persistent id
and extension (the only ways a pickle reaches code), so only builtin containers and
scalars load, and the input is bounded (:data:`MAX_SNAPSHOT_BYTES`). Unpickling can still
need ~90 bytes of memory per input byte on hostile input (``}}}}``: one dict per byte), so
files are converted in a child process under a memory and time limit
(:func:`torch_memory_pprof`); run directly, ``python -m exporter.profiles.torch_memory
FILE`` writes the raw pprof to stdout.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from exporter.ascii_digits import parse_ascii_int
from exporter.errors import InputError, MlprofError
from exporter.profiles.frames import (
    TRAMPOLINE,
    FrameLabel,
    label_address,
    label_native,
    label_python,
)
from exporter.proto import profile_pb2
from exporter.regular_files import NotRegularFileError, open_regular

if TYPE_CHECKING:
    from exporter.profiles.flamegraph import FlameGraph

__all__ = [
    "CONVERT_MEMORY_BYTES",
    "CONVERT_TIMEOUT_S",
    "MAX_SNAPSHOT_BYTES",
    "NO_STACK",
    "SNAPSHOT_SUFFIXES",
    "is_torch_snapshot",
    "load_torch_memory_profile",
    "read_snapshot",
    "snapshot_profile",
    "torch_frame_label",
    "torch_memory_pprof",
]

SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
# A snapshot with 100k history entries and C++ stacks is tens of MB; a 256 MiB file is
# beyond any we have seen and still converts within the limits below.
MAX_SNAPSHOT_BYTES = 256 * 2**20
# Real snapshots unpickle to ~7x their size (measured), so a file at MAX_SNAPSHOT_BYTES
# needs ~1.8 GiB of heap plus the file; hostile ones (~90x) hit this limit and are refused.
CONVERT_MEMORY_BYTES = 3 * 2**30
# A segment is one cudaMalloc of at least 2 MiB (the allocator's smallest), so a million
# is 2 TB of device memory; more is a hostile file, refused before we walk it.
MAX_SEGMENTS = 1_000_000
# Unpickling runs at ~20 MB/s on a loaded core: MAX_SNAPSHOT_BYTES within ~15 s, 8x spare.
CONVERT_TIMEOUT_S = 120.0

LIVE_STATE = "active_allocated"
NO_STACK = "<stack not recorded>"  # blocks allocated while history recording was off
UNKNOWN_NATIVE = "??"  # what PyTorch's symbolizers write for a frame they cannot name
# The recorder's own frames (innermost in every C++ stack): the instrument, not the code.
_RECORDER_FRAMES = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp")
_PICKLE_PROTOCOLS = range(2, 6)  # b"\x80<protocol>" opens every pickle PyTorch writes
_SOURCE_FILE = re.compile(r"\.(c|cc|cpp|cxx|cu|cuh|h|hh|hpp|hxx|inl|ipp|tcc|s|S|py)$")
# GCC clone suffixes (foo.cold, foo.isra.0, foo.constprop.3): the same function.
_CLONE_SUFFIX = re.compile(r"(\.(cold|isra|constprop|part|lto_priv|localalias)(\.\d+)?)+$")
_ABI_TAG = re.compile(r"\[abi:\w+\]")
_QUALIFIERS = (" const", " volatile", " &", " &&", " noexcept")


# -- restricted unpickling -----------------------------------------------------------
class _Refused(pickle.UnpicklingError):
    """The pickle asks for code (a global, a persistent id): never a memory snapshot."""


class _SnapshotUnpickler(pickle.Unpickler):
    """Loads builtin containers and scalars only: no global, no persistent id."""

    def find_class(self, module: str, name: str, /) -> Any:
        # Every route from a pickle to code (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*) asks
        # find_class first; REDUCE/NEWOBJ/BUILD then have no callable or class to use.
        raise _Refused(
            f"refused global {module}.{name}: a memory snapshot holds only dicts, lists, "
            "tuples, strings and numbers"
        )

    def persistent_load(self, pid: Any, /) -> Any:
        raise _Refused("refused persistent id: not a plain memory snapshot")


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def read_snapshot(data: bytes, source: str = "snapshot") -> dict[str, Any]:
    """Unpickle a memory snapshot safely; InputError (one line) for anything else."""
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise InputError(
            f"{source}: {len(data)} bytes is over the {MAX_SNAPSHOT_BYTES} bytes a memory "
            "snapshot may have (record fewer history entries: max_entries)"
        )
    if not data:
        raise InputError(f"{source}: empty file, expected a PyTorch memory snapshot pickle")
    try:
        loaded = _SnapshotUnpickler(io.BytesIO(data)).load()
    except MemoryError:
        raise
    except _Refused as exc:
        raise InputError(
            f"{source}: not a safe PyTorch memory snapshot: {_one_line(str(exc))}"
        ) from None
    except Exception as exc:  # any decoding failure of hostile bytes is a bad input
        raise InputError(
            f"{source}: not a PyTorch memory snapshot pickle "
            f"({type(exc).__name__}: {_one_line(str(exc))})"
        ) from None
    if isinstance(loaded, list):  # segments only, as _memory_viz reads old dumps
        return {"segments": loaded, "device_traces": []}
    if not isinstance(loaded, dict) or "segments" not in loaded:
        raise InputError(
            f"{source}: not a PyTorch memory snapshot: expected a dict with 'segments' "
            f"(torch.cuda.memory._snapshot()), got {type(loaded).__name__}"
        )
    return loaded


# -- frame labels ----------------------------------------------------------------------
def _strip_signature(symbol: str) -> str:
    """``ns::Cls::f(int) const`` -> ``ns::Cls::f``; return types, ABI tags, clone suffixes."""
    name = _CLONE_SUFFIX.sub("", symbol.strip())
    changed = True
    while changed:
        changed = False
        for qualifier in _QUALIFIERS:
            if name.endswith(qualifier):
                name, changed = name[: -len(qualifier)], True
    if name.endswith(")"):
        depth = 0
        for index in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[index], 0)
            if depth == 0:
                # "operator()" keeps its own parentheses.
                if not name[:index].endswith("operator"):
                    name = name[:index]
                break
    name = _ABI_TAG.sub("", name)
    # A return type ("void ns::f<int>") is separated by a space outside <> and ().
    depth = 0
    for index in range(len(name) - 1, -1, -1):
        char = name[index]
        if char in ">)":
            depth += 1
        elif char in "<(":
            depth -= 1
        elif char == " " and depth == 0:
            return name[index + 1 :]
    return name


def _scope_path(symbol: str) -> str:
    """A qualified name ``label_native`` can split: no template arguments, no anonymous
    namespaces (``std::function<void ()>::operator()`` -> ``std::function::operator()``)."""
    out: list[str] = []
    depth = 0
    for char in symbol:
        if char == "<":
            depth += 1
        elif char == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(char)
    parts = [p for p in "".join(out).split("::") if p and not p.startswith("(anonymous")]
    return "::".join(parts) or symbol


def _is_python(name: str, file: str) -> bool:
    if "::" in name:
        return False
    return file.endswith(".py") or file.startswith("<")  # "<string>", "<eval_with_key>.3"


def torch_frame_label(name: str, file: str, line: int) -> FrameLabel | None:
    """The label of one snapshot frame; None for the stack recorder's own frames.

    Python frames carry ``co_name`` (``forward``; ``Cls.forward`` where a producer writes
    the qualified name); C++ frames a demangled symbol, or ``??`` when the symbolizer
    failed. PyTorch's fast and dladdr symbolizers write the library (or executable) as
    ``filename`` and the offset in it as ``line``: for ``??`` that offset is kept as a
    ``0x…`` frame. A file without a source suffix is taken for such an object.
    """
    if any(recorder in name for recorder in _RECORDER_FRAMES):
        return None
    if _is_python(name, file):
        return label_python(name, file, line)
    source = "" if file == UNKNOWN_NATIVE else file
    in_object = bool(source) and not _SOURCE_FILE.search(source)
    if name in ("", UNKNOWN_NATIVE):
        if in_object and line > 0:
            return label_address(line, source)
        return FrameLabel(UNKNOWN_NATIVE, source, line)
    if in_object:
        line = 0  # an offset into the library or executable, not a line number
    return label_native(_scope_path(_strip_signature(name)), source, line)


# -- snapshot -> pprof -----------------------------------------------------------------
class _FieldError(Exception):
    """A field of the snapshot is not what PyTorch writes; ``path`` grows as it unwinds."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    def inside(self, prefix: str) -> _FieldError:
        return _FieldError(f"{prefix}.{self.path}" if self.path[:1] != "[" else prefix + self.path,
                         self.problem)  # fmt: skip


def _expect(value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _FieldError(field, f"expected {what}, got {type(value).__name__} {value!r:.60}")
    return value


def _size(value: Any, field: str) -> int:
    number: int = _expect(value, int, field, "a byte count")
    if number < 0:
        raise _FieldError(field, f"expected a non-negative byte count, got {number}")
    return number


class _Builder:
    """Aggregates live blocks per (device, stack) and writes the pprof tables once."""

    def __init__(self) -> None:
        self.profile = profile_pb2.Profile()
        self._strings: dict[str, int] = {}
        self._string("")
        self._functions: dict[tuple[str, str, str], int] = {}
        self._locations: dict[tuple[int, int], int] = {}
        # id(frame dict) -> (location id, is a trampoline), None for the recorder's frames
        self._frames: dict[int, tuple[int, bool] | None] = {}
        # ids of a stack's frame dicts -> its location ids, innermost first
        self._stacks: dict[tuple[int, ...], tuple[int, ...]] = {}
        # (device, location ids) -> [blocks, bytes, requested bytes]
        self.samples: dict[tuple[str, tuple[int, ...]], list[int]] = {}

    def _string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self.profile.string_table)
            self.profile.string_table.append(text)
        return index

    def _location(self, label: FrameLabel, system_name: str) -> int:
        fkey = (label.name, label.file, system_name)
        fn_id = self._functions.get(fkey)
        if fn_id is None:
            fn_id = self._functions[fkey] = len(self._functions) + 1
            self.profile.function.add(
                id=fn_id,
                name=self._string(label.name),
                system_name=self._string(system_name),
                filename=self._string(label.file),
            )
        lkey = (fn_id, label.line)
        loc_id = self._locations.get(lkey)
        if loc_id is None:
            loc_id = self._locations[lkey] = len(self._locations) + 1
            location = self.profile.location.add(id=loc_id, mapping_id=1)
            location.line.add(function_id=fn_id, line=label.line)
        return loc_id

    def _frame(self, frame: Any) -> tuple[int, bool] | None:
        """(location id, is a trampoline) of a frame dict; None for the recorder's frames."""
        _expect(frame, dict, "", "a frame dict (filename, line, name)")
        name: str = _expect(frame.get("name", ""), str, "name", "a string")
        file = _expect(frame.get("filename", ""), str, "filename", "a string")
        line = _expect(frame.get("line", 0), int, "line", "an integer")
        label = torch_frame_label(name, file, line)
        if label is None:
            return None
        return self._location(label, name), label.name == TRAMPOLINE

    def stack(self, frames: Any) -> tuple[int, ...]:
        """Location ids, innermost first, of a block's frames.

        Each allocation has its own frames list, but PyTorch shares the frame dicts
        between them: stacks are cached by the identities of their frames.
        """
        _expect(frames, (list, tuple), "frames", "a list of frames")
        key = tuple(map(id, frames))
        cached = self._stacks.get(key)
        if cached is not None:
            return cached
        ids: list[int] = []
        previous_trampoline = False
        for index, frame in enumerate(frames):
            if id(frame) in self._frames:
                found = self._frames[id(frame)]
            else:
                try:
                    found = self._frames[id(frame)] = self._frame(frame)
                except _FieldError as exc:
                    raise exc.inside(f"frames[{index}]") from None
            if found is None:
                continue
            location, trampoline = found
            if not (trampoline and previous_trampoline):
                # CPython's call glue between two Python frames is one trampoline.
                ids.append(location)
            previous_trampoline = trampoline
        if not ids:
            ids.append(self._location(FrameLabel(NO_STACK), ""))
        stack = self._stacks[key] = tuple(ids)
        return stack

    def add(self, device: str, stack: tuple[int, ...], size: int, requested: int) -> None:
        totals = self.samples.get((device, stack))
        if totals is None:
            self.samples[device, stack] = [1, size, requested]
        else:
            totals[0] += 1
            totals[1] += size
            totals[2] += requested

    def finish(self, time_nanos: int) -> profile_pb2.Profile:
        profile = self.profile
        for kind, unit in (("inuse_objects", "count"), ("inuse_space", "bytes")):
            profile.sample_type.add(type=self._string(kind), unit=self._string(unit))
        profile.default_sample_type = self._string("inuse_space")
        profile.period_type.type = self._string("space")
        profile.period_type.unit = self._string("bytes")
        profile.period = 1
        profile.time_nanos = time_nanos
        profile.comment.append(
            self._string(
                "PyTorch CUDA allocator snapshot: live (active_allocated) blocks; bytes are "
                "block sizes, label requested_bytes what the program asked for"
            )
        )
        # One mapping: Pyroscope and `go tool pprof` expect locations to name one.
        profile.mapping.add(id=1, has_functions=True, has_filenames=True, has_line_numbers=True)
        device_key, requested_key = self._string("device"), self._string("requested_bytes")
        bytes_unit = self._string("bytes")
        for (device, stack), (blocks, size, requested) in self.samples.items():
            sample = profile.sample.add(location_id=stack, value=[blocks, size])
            sample.label.add(key=device_key, str=self._string(device))
            sample.label.add(key=requested_key, num=requested, num_unit=bytes_unit)
        return profile


def _live_allocation(block: dict[str, Any], size: int) -> tuple[Any, int]:
    """(frames, requested bytes) of a live block, in whichever format it was written."""
    if "frames" in block:
        return block["frames"], _size(block.get("requested_size", size), "requested_size")
    if "history" in block:  # torch 2.0: newest allocation first
        history = _expect(block["history"], (list, tuple), "history", "a list")
        if history:
            newest = _expect(history[0], dict, "history[0]", "a dict")
            requested = _size(newest.get("real_size", size), "history[0].real_size")
            return newest.get("frames", []), requested
    return [], _size(block.get("requested_size", size), "requested_size")


def _snapshot_time_nanos(snapshot: dict[str, Any]) -> int:
    """When the snapshot was taken: its ``snapshot`` trace entry (epoch µs), else 0."""
    traces = snapshot.get("device_traces")
    newest = 0
    if not isinstance(traces, (list, tuple)):
        return 0
    for trace in traces:
        if not isinstance(trace, (list, tuple)):
            continue
        # The allocator appends the snapshot entry last: scan from the end, briefly.
        for entry in trace[-1:-17:-1]:
            if isinstance(entry, dict) and entry.get("action") == "snapshot":
                stamp = entry.get("time_us")
                if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp > 0:
                    newest = max(newest, stamp)
                break
    return newest * 1000


def _segment_blocks(segment: Any) -> tuple[str, Sequence[Any]]:
    _expect(segment, dict, "", "a segment dict")
    device = segment.get("device")
    name = "cuda" if device is None else f"cuda:{_size(device, 'device')}"
    blocks = _expect(segment.get("blocks", []), (list, tuple), "blocks", "a list")
    return name, blocks


def snapshot_profile(snapshot: dict[str, Any], source: str = "snapshot") -> profile_pb2.Profile:
    """The device-memory pprof of an unpickled snapshot (see the module docstring)."""
    segments = snapshot.get("segments")
    if not isinstance(segments, (list, tuple)):
        raise InputError(f"{source}: segments: expected a list, got {type(segments).__name__}")
    if len(segments) > MAX_SEGMENTS:
        raise InputError(
            f"{source}: {len(segments)} segments is over the {MAX_SEGMENTS} a snapshot can "
            "have (each is a cudaMalloc of at least 2 MiB)"
        )
    builder = _Builder()
    # A real snapshot builds a fresh dict per block; a shared one would let a small
    # hostile file make us visit the same blocks millions of times.
    seen: set[int] = set()
    for i, segment in enumerate(segments):
        j = -1
        try:
            device, blocks = _segment_blocks(segment)
            for j in range(len(blocks)):
                block = blocks[j]
                _expect(block, dict, "", "a block dict")
                if id(block) in seen:
                    raise _FieldError("", "the same block object appears twice")
                seen.add(id(block))
                state = _expect(block.get("state"), str, "state", "a string")
                size = _size(block.get("size"), "size")
                if state == LIVE_STATE:
                    frames, requested = _live_allocation(block, size)
                    builder.add(device, builder.stack(frames), size, requested)
        except _FieldError as exc:
            where = f"segments[{i}]" + (f".blocks[{j}]" if j >= 0 else "")
            path = f"{where}.{exc.path}".rstrip(".").replace(".[", "[")
            raise InputError(f"{source}: {path}: {exc.problem}") from None
    return builder.finish(_snapshot_time_nanos(snapshot))


# -- files -----------------------------------------------------------------------------
def is_torch_snapshot(path: Path) -> bool:
    """Whether ``path`` looks like a snapshot pickle (suffix or pickle protocol header)."""
    if path.name.endswith(SNAPSHOT_SUFFIXES):
        return True
    try:
        with path.open("rb") as handle:
            head = handle.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x80 and head[1] in _PICKLE_PROTOCOLS


def _open_snapshot(path: Path, follow_symlinks: bool, below: Path | None = None) -> BinaryIO:
    """Open a snapshot file once: a regular file only (a FIFO in the shared directory
    would block the reader), and no symbolic link unless ``follow_symlinks`` (nor, with
    ``below``, in a directory between that root and the file)."""
    try:
        return open_regular(path, follow_symlinks=follow_symlinks, below=below)
    except NotRegularFileError as exc:
        raise InputError(f"{exc}, expected a memory snapshot") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read memory snapshot ({exc.strerror or exc})") from None


def _read_bounded(handle: BinaryIO, path: Path) -> bytes:
    """The open file's bytes, up to one past the cap."""
    try:
        size = os.fstat(handle.fileno()).st_size
        # Sized from the file, not the cap: read(n) allocates n bytes up front.
        return handle.read(min(size, MAX_SNAPSHOT_BYTES) + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read memory snapshot ({exc.strerror or exc})") from None


def convert_file(path: Path, *, follow_symlinks: bool = True, fd: int | None = None) -> bytes:
    """Read, unpickle safely and convert one snapshot file in this process: raw pprof.

    With ``fd`` the file is that open descriptor (``path`` only names it): what the
    parent opened is what is converted, whatever ``path`` points to by now.
    """
    if fd is not None:
        with os.fdopen(fd, "rb") as handle:
            data = _read_bounded(handle, path)
    else:
        with _open_snapshot(path, follow_symlinks) as handle:
            data = _read_bounded(handle, path)
    snapshot = read_snapshot(data, str(path))
    del data  # the objects are what costs memory from here on
    return bytes(snapshot_profile(snapshot, str(path)).SerializeToString())


def torch_memory_pprof(
    path: Path,
    memory_limit: int = CONVERT_MEMORY_BYTES,
    timeout_s: float = CONVERT_TIMEOUT_S,
    *,
    follow_symlinks: bool = False,
    below: Path | None = None,
) -> bytes:
    """Convert a snapshot file in a child process limited in memory and time: raw pprof.

    The file is opened here, once (a regular file; a symbolic link only with
    ``follow_symlinks``, as for a path the CLI's user gave), and the child converts that
    open descriptor: a link swapped in after the check is never read. ``below`` (the
    shared directory) refuses a link in any directory between it and the file too.
    InputError (one line) when the file is not a snapshot or needs more than the limits.
    """
    from exporter.sandbox import run_python

    module = "exporter.profiles.torch_memory"  # this module, run as the child
    with _open_snapshot(path, follow_symlinks, below) as handle:
        fd = handle.fileno()
        # Its data segment is bounded, not its address space: the interpreter maps
        # hundreds of MB it never touches. What is bounded is reserved from the budget.
        done = run_python(
            ["-m", module, "--memory-limit", str(memory_limit), "--fd", str(fd), str(path)],
            memory_mb=-(-memory_limit // 2**20),
            limit="data",
            timeout_s=timeout_s,
            what="memory snapshot conversion",
            pass_fds=(fd,),
        )
    if done.timed_out:
        raise InputError(
            f"{path}: converting the memory snapshot took over {timeout_s:g}s; stopped"
        )
    if done.no_budget:
        raise InputError(f"{path}: memory snapshot not converted: {done.error}")
    if done.returncode is None:
        raise MlprofError(f"cannot start the snapshot converter: {done.error}")
    if done.returncode == 0:
        output: bytes = done.stdout
        return output
    if done.returncode < 0 or not done.stderr.strip():
        raise InputError(
            f"{path}: the snapshot converter died (exit {done.returncode}) within its "
            f"{memory_limit} bytes memory limit: file too large or hostile"
        )
    raise InputError(_one_line(done.error, 500))


def load_torch_memory_profile(
    path: Path, *, follow_symlinks: bool = False, below: Path | None = None
) -> FlameGraph:
    """Read a PyTorch memory snapshot file and build its in-use-space flame graph.

    A symbolic link is refused unless ``follow_symlinks`` (the CLI, given a path by its
    user): the sidecar reads snapshots the workload wrote, ``below`` its shared directory.
    """
    from exporter.profiles.memory import memory_flamegraph

    pprof = torch_memory_pprof(path, follow_symlinks=follow_symlinks, below=below)
    return memory_flamegraph(pprof, str(path))


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: ``[--memory-limit BYTES] [--fd N] FILE`` -> raw pprof on stdout.

    With ``--fd`` the snapshot is read from that inherited descriptor, FILE only names it.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    limit = CONVERT_MEMORY_BYTES
    fd: int | None = None
    while len(args) >= 3 and args[0] in ("--memory-limit", "--fd"):
        number = parse_ascii_int(args[1])  # '²'.isdigit() is True; int('²') raises
        if number is None:
            break
        if args[0] == "--fd":
            fd = number
        else:
            limit = number
        args = args[2:]
    if len(args) != 1:
        print("usage: python -m exporter.profiles.torch_memory [--memory-limit BYTES] "
              "[--fd N] FILE", file=sys.stderr)  # fmt: skip
        return 2
    path = Path(args[0])
    from exporter.sandbox import limit_memory

    # Run by hand (the sandbox set it already): the data segment (heap and private
    # mappings), not the address space, which the interpreter maps far beyond its use.
    limit_memory(-(-limit // 2**20), "data")
    try:
        output = convert_file(path, fd=fd)
    except MlprofError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except MemoryError:
        print(
            f"{path}: the memory snapshot needs more than the converter's {limit} bytes "
            "memory limit: file too large or hostile",
            file=sys.stderr,
        )
        return 1
    sys.stdout.buffer.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
