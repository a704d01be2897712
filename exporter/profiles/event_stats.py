"""Events of a line with some of their stats, as columns (GPU stream lines, launch calls).

:mod:`exporter.profiles.xspace` reads a line's events as three columns (metadata id,
offset, duration). GPU captures keep more per event: each kernel says its launch
configuration (``kernel_details``), HLO module and op and ``correlation_id`` in its
own stats, and launch calls on the host say their ``correlation_id``. Here a line's
events come with the stats a caller names, one column each (:class:`StatEvents`): the
compiled core (``_xwire.scan_line`` with stat ids) reads them in the same pass as the
three columns, through windows of :data:`~exporter.profiles.xspace.LINE_WINDOW` bytes
so memory follows the window, not the line; the pure-Python twin (:func:`_parsed`)
reads the line through protobuf. Both give the same columns
(``tests/unit/test_event_stats.py``); a line the core does not find canonical, and
every line under ``MLPROF_DECODER=python``, goes through the twin.

A stat's column holds, per event, the *kind* of its last stat with one of the column's
metadata ids (0: none; 1: the stat without a value; else the field number of its value:
2 double, 3 uint64, 4 int64, 5 str, 6 bytes, 7 ref) and the value's bits (a string's
index in the piece's ``strings``). :class:`StatTexts` and :func:`int_column` turn a
column into text codes or integers the way XProf's visitors read a stat.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from exporter.ascii_digits import parse_ascii_int
from exporter.profiles import xspace
from exporter.profiles.nesting import dense_index

if TYPE_CHECKING:
    from exporter.profiles.xspace import Capture, LineHeader, Plane, PlaneRef

__all__ = ["KIND_REF", "KIND_STR", "LineTap", "StatEvents", "StatTexts", "TapLine",
           "first_seen", "int_column", "merge_columns", "read_stat_events"]  # fmt: skip

T = TypeVar("T")
KIND_NONE, KIND_EMPTY, KIND_DOUBLE, KIND_UINT64, KIND_INT64 = 0, 1, 2, 3, 4
KIND_STR, KIND_BYTES, KIND_REF = 5, 6, 7
_KIND_OF = {"double_value": KIND_DOUBLE, "uint64_value": KIND_UINT64,
            "int64_value": KIND_INT64, "str_value": KIND_STR, "bytes_value": KIND_BYTES,
            "ref_value": KIND_REF}  # fmt: skip
_MAX_COLUMNS = 64  # the compiled core's bound; callers ask for a handful
_INT64_MAX = (1 << 63) - 1
_GET_ID_OFF_DUR = attrgetter("metadata_id", "offset_ps", "duration_ps")


@dataclass(frozen=True, slots=True)
class StatEvents:
    """Every event of (a piece of) a line: ids, offsets and durations (ps, instants
    too), and per event and column the kind and value of its wanted stat."""

    ids: np.ndarray
    offsets: np.ndarray
    durations: np.ndarray
    kinds: np.ndarray  # (columns, events) int8
    values: np.ndarray  # (columns, events) int64
    strings: list[str]  # the str_values that values index


class TapLine(Protocol):
    """One line's reduction by a :class:`LineTap`, fed the pieces another reader reads."""

    def add(self, piece: StatEvents, columns: Sequence[int]) -> None:
        """Reduce ``piece``; ``columns[c]`` is the piece's column of the tap's column c."""

    def done(self) -> None:
        """The line was read to its end: keep what was reduced (a read that restarts
        through protobuf asks :meth:`LineTap.reading` for a fresh reduction)."""


class LineTap(Protocol):
    """A second reader of some lines (``Capture.stream_tap``): the reader that reads a
    line reads the tap's stats with its own in the same pass and hands it the pieces, so
    a GPU stream line is read once for the device flame graph and the kernel facts."""

    def wanted(self, ref: PlaneRef, plane: Plane) -> Mapping[int, int]:
        """Stat ids -> the tap's columns, for this plane's lines ({}: none)."""

    def reading(self, ref: PlaneRef, plane: Plane, header: LineHeader) -> TapLine | None:
        """A fresh reduction of the line (None: the tap does not want it)."""


def merge_columns(
    own: Mapping[int, int], width: int, other: Mapping[int, int], other_width: int
) -> tuple[dict[int, int], int, list[int]] | None:
    """One read's columns for two readers: ``own`` keeps its columns below ``width``;
    each of ``other``'s columns (below ``other_width``) is one of own's with the same
    stat ids, or a new one (an empty one where it has no ids). Returns (stat id ->
    column, width, other's column -> read column); None when a column of ``other``
    shares some but not all of its ids with one of own's (a read gives each stat id
    one column)."""
    merged = dict(own)
    own_ids: dict[int, set[int]] = {}
    for sid, column in own.items():
        own_ids.setdefault(column, set()).add(sid)
    other_ids: dict[int, set[int]] = {}
    for sid, column in other.items():
        other_ids.setdefault(column, set()).add(sid)
    at = [0] * other_width
    for column in range(other_width):
        sids = other_ids.get(column, set())
        shared = next((c for c, ids in own_ids.items() if ids == sids), None) if sids else None
        if shared is not None:
            at[column] = shared
        elif sids & merged.keys():
            return None
        else:
            at[column] = width
            merged |= dict.fromkeys(sids, width)
            width += 1
    if width > _MAX_COLUMNS:
        return None
    return merged, width, at


class _NotCanonicalError(Exception):
    """A window the compiled core hands back to protobuf."""


def read_stat_events(
    capture: Capture,
    plane: Plane,
    index: int,
    columns: Mapping[int, int],
    width: int,
    reduce: Callable[[Iterator[StatEvents]], T],
) -> T:
    """``reduce`` of line ``index``'s events in pieces, with the stats ``columns`` names.

    ``columns`` maps stat metadata ids to a column below ``width``. ``reduce`` must only
    consume the pieces and return its result: when the compiled core finds a window it
    does not read, the line is read again through protobuf and ``reduce`` starts over.
    """
    if not 1 <= width <= _MAX_COLUMNS or any(not 0 <= c < width for c in columns.values()):
        raise ValueError(f"stat columns must lie below width 1..{_MAX_COLUMNS}")
    core = xspace.compiled_core()
    if core is not None:
        counted = [0]
        try:
            out = reduce(_compiled(core, plane, index, columns, width, counted))
        except _NotCanonicalError:
            pass
        else:
            capture.events_read += counted[0]
            return out
    return reduce(iter([_parsed(capture, plane, index, columns, width)]))


def _compiled(
    core: object, plane: Plane, index: int, columns: Mapping[int, int], width: int,
    counted: list[int],
) -> Iterator[StatEvents]:  # fmt: skip
    ids = sorted(columns)
    stat_ids = np.asarray(ids, np.int64).tobytes()
    slots = np.asarray([columns[i] for i in ids], np.int64).tobytes()
    pos, end = plane.lines.span(index)
    window = xspace.LINE_WINDOW
    while True:
        final = end - pos <= window
        data = plane.lines.read(pos, min(window, end - pos))
        found = core.scan_line(data, final, True, stat_ids, slots, width)  # type: ignore[attr-defined]
        del data
        if found is None:
            raise _NotCanonicalError
        raw_ids, raw_offs, raw_durs, kinds, values, strings = found[6]
        n = found[5]
        counted[0] += n
        yield StatEvents(
            np.frombuffer(raw_ids, np.int64),
            np.frombuffer(raw_offs, np.int64),
            np.frombuffer(raw_durs, np.int64),
            np.frombuffer(kinds, np.int8).reshape(width, n),
            np.frombuffer(values, np.int64).reshape(width, n),
            strings,
        )
        if final:
            return
        pos += found[0]
        if not found[0]:  # one field longer than the window: read it whole
            window *= 2


def _bits(kind: str, value: float | int) -> int:
    if kind == "double_value":
        return int(struct.unpack("<q", struct.pack("<d", value))[0])
    value = int(value)
    return value - (1 << 64) if value > _INT64_MAX else value  # uint64 as its int64 bits


def _parsed(
    capture: Capture, plane: Plane, index: int, columns: Mapping[int, int], width: int
) -> StatEvents:
    """The twin: the line parsed by protobuf, each event's stats read one by one."""
    line = xspace.read_line(capture, plane, index)
    events = line.events
    n = len(events)
    flat = np.fromiter(chain.from_iterable(map(_GET_ID_OFF_DUR, events)), np.int64, 3 * n)
    rows = flat.reshape(-1, 3)
    kinds = np.zeros((width, n), np.int8)
    values = np.zeros((width, n), np.int64)
    strings: dict[str, int] = {}
    for i, event in enumerate(events):
        for stat in event.stats:
            column = columns.get(stat.metadata_id)
            if column is None:
                continue
            kind = stat.WhichOneof("value")
            if kind is None:
                kinds[column, i], values[column, i] = KIND_EMPTY, 0
            elif kind == "str_value":
                kinds[column, i] = KIND_STR
                values[column, i] = strings.setdefault(stat.str_value, len(strings))
            elif kind == "bytes_value":
                kinds[column, i], values[column, i] = KIND_BYTES, 0
            else:
                kinds[column, i] = _KIND_OF[kind]
                values[column, i] = _bits(kind, getattr(stat, kind))
    return StatEvents(rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(), kinds, values,
                      list(strings))  # fmt: skip


class StatTexts:
    """Text codes of string stats on one plane, read as XProf's ``StrOrRefValue``:
    a ``ref_value`` names a stat metadata entry (0: none, the empty text), a
    ``str_value`` is the text, any other value reads as the empty text. Code 0 is the
    empty text; :attr:`texts` holds every code's text."""

    def __init__(self, names: Mapping[int, str]) -> None:
        self.texts: list[str] = [""]
        self._codes: dict[str, int] = {"": 0}
        ids = sorted(names)
        self._ref_ids = np.asarray(ids, np.int64)
        self._ref_codes = np.asarray([self.code(names[i]) for i in ids], np.int64)
        # Stat ids are small counters in every writer's captures: a lookup table by id
        # (0 for ids that name nothing) replaces the search, when it stays small.
        self._table: np.ndarray | None = None
        if not ids or (ids[0] >= 0 and ids[-1] <= 4 * len(ids) + 1024):
            self._table = np.zeros((ids[-1] if ids else 0) + 1, np.int64)
            self._table[self._ref_ids] = self._ref_codes
            self._table[0] = 0  # ref 0 names nothing (and non-refs read index 0): ""

    def code(self, text: str) -> int:
        found = self._codes.get(text)
        if found is None:
            found = self._codes[text] = len(self.texts)
            self.texts.append(text)
        return found

    def column(self, piece: StatEvents, column: int) -> np.ndarray:
        """Per event, the code of the column's text; -1 where the event has no such stat."""
        kinds, values = piece.kinds[column], piece.values[column]
        if self._table is not None:
            # One gather: every event's index into the table, 0 (the empty text) for
            # what is no ref or a ref to nothing.
            index = np.where(kinds == KIND_REF, values, 0)
            if len(index) and (int(index.min()) < 0 or int(index.max()) >= len(self._table)):
                index[(index < 0) | (index >= len(self._table))] = 0
            out = self._table[index]
            np.putmask(out, kinds == KIND_NONE, -1)
        else:
            out = np.where(kinds == KIND_NONE, -1, 0).astype(np.int64)
            if len(refs := np.flatnonzero((kinds == KIND_REF) & (values != 0))):
                wanted = values[refs]
                pos = np.minimum(np.searchsorted(self._ref_ids, wanted), len(self._ref_ids) - 1)
                hit = self._ref_ids[pos] == wanted
                out[refs] = np.where(hit, self._ref_codes[pos], 0)  # an unknown ref: ""
        strs = np.flatnonzero(kinds == KIND_STR)
        if len(strs):
            codes = np.asarray([self.code(s) for s in piece.strings], np.int64)
            out[strs] = codes[values[strs]]
        return out


def int_column(piece: StatEvents, column: int) -> np.ndarray:
    """Per event, the column's stat as an integer, as ``correlation_id`` is read: an
    int64 or uint64 value, a str_value of ASCII digits; -1 for anything else, no stat,
    or a value past int64 (no id that large matches a real one)."""
    kinds, values = piece.kinds[column], piece.values[column]
    ints = (kinds == KIND_INT64) | ((kinds == KIND_UINT64) & (values >= 0))
    out = np.where(ints, values, -1)  # one pass, not a masked scatter
    strs = np.flatnonzero(kinds == KIND_STR)
    if len(strs):
        parsed = [parse_ascii_int(s) for s in piece.strings]
        table = np.asarray([-1 if v is None or v > _INT64_MAX else v for v in parsed], np.int64)
        out[strs] = table[values[strs]]
    return out


def first_seen(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of equal-length code columns: each row's key, numbered in the order
    the distinct rows first occur, and the index of each key's first row.

    The compiled core (``_xwire.first_seen``) finds them in one pass through a hash
    table of the rows; :func:`first_seen_numpy` is its twin (held alike by
    ``tests/unit/test_gpu_kernel_reductions.py``), for ``MLPROF_DECODER=python`` and
    installs without the core.
    """
    core = xspace.compiled_core()
    if core is None or not len(columns[0]) or not 1 <= len(columns) <= _MAX_COLUMNS:
        return first_seen_numpy(columns)
    key, first = core.first_seen(tuple(np.ascontiguousarray(c, np.int64) for c in columns))
    return np.frombuffer(key, np.int64), np.frombuffer(first, np.int64)


def first_seen_numpy(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`first_seen` in numpy: columns are combined pairwise through dense indexes,
    so keys stay below the row count and no column's range multiplies another's."""
    n = len(columns[0])
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    _, key = dense_index(columns[0])
    for column in columns[1:]:
        _, codes = dense_index(column)
        _, key = dense_index(key * (int(codes.max()) + 1) + codes)
    distinct = int(key.max()) + 1
    # Small keys sort by radix as uint16, in linear time.
    order = np.argsort(key.astype(np.uint16) if distinct < 1 << 16 else key, kind="stable")
    ranked = key[order]
    first = order[np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])]  # by key
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(distinct, np.int64)
    rank[by_first] = np.arange(distinct)
    return rank[key], first[by_first]
