"""Communication on the device planes: collective ops, and how much of it compute hides.

An op is communication when its ``hlo_category`` is a collective or its HLO name is one:

* categories: XProf's own collective set (smart_suggestion/signal_provider.h,
  ``IsCollective``: all-reduce, all-gather, reduce-scatter, all-to-all,
  collective-permute, their fusions and ``-start`` / ``-done`` ops) and the send / recv
  ops its step trace counts as device-to-device communication; not ``megacore fusion``
  (a core waiting for its peer core) nor ``host send`` / ``host recv`` (host transfers,
  XProf's input and output);
* names: ``all-reduce.3``, ``all-gather-start.1``, ``send-done.2``, ... (an op's name
  when its category says nothing, e.g. ``async-start``), and NCCL kernels on GPU (XProf's
  ``ClassifyGpuEvent``: a name starting with ``nccl``).

Communication time is the time such an op runs on the device's op line, so XLA time
splits into compute and communication. XProf's TPU step trace (``get_step_trace``)
counts only all-reduce, all-to-all and send / recv there; all-gather, reduce-scatter and
collective-permute ops count as compute in it, so the two differ by those ops' time.

Overlap: an asynchronous collective's window runs from its start op to its done op
(the ``Async XLA Ops`` line holds the windows on TPU; else ``<op>-start`` / ``<op>-done``
pairs and ``send`` / ``recv`` with their ``-done`` on the op line are paired in time
order). The part of a window other ops on the op line cover is hidden; the rest is
exposed. Coverage counts every op but async start / done / send / recv ops, as XProf's
``analyze_async_overlap`` does.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import numpy as np

from exporter.analysis.facts.intervals import covered, union
from exporter.analysis.facts.types import Overlap

if TYPE_CHECKING:
    from exporter.profiles.xplane import Capture, OpLine, PlaneRef

__all__ = [
    "ASYNC_OPS_LINE",
    "COMMUNICATION_CATEGORIES",
    "CommunicationRecorder",
    "async_role",
    "is_communication",
    "overlap_facts",
]

ASYNC_OPS_LINE: Final = "Async XLA Ops"
_COLLECTIVES: Final = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast",
)  # fmt: skip
COMMUNICATION_CATEGORIES: Final = frozenset(
    {
        *_COLLECTIVES,
        *(f"{c}-start" for c in _COLLECTIVES),
        *(f"{c}-done" for c in _COLLECTIVES),
        *(f"{c} fusion" for c in _COLLECTIVES),
        "all-reduce-scatter fusion",
        "send", "send-done", "recv", "recv-done",
    }
)  # fmt: skip
_NAME_RE: Final = re.compile(
    r"^%?(?:all-reduce|all-gather|reduce-scatter|ragged-all-to-all|all-to-all"
    r"|collective-permute|collective-broadcast|send|recv)(?=$|[.\-]|\s)"
)
_NCCL_RE: Final = re.compile(r"^nccl", re.I)
# XProf's async_overlap: ``<base>-start[.N]`` / ``<base>-done[.N]``; send / recv start one.
_START_DONE_RE: Final = re.compile(r"^(?P<base>.+)-(?P<role>start|done)(?P<n>\.\d+)?$")
_SEND_RECV_RE: Final = re.compile(r"^(?P<base>send|recv)(?P<n>\.\d+)?$")
_PS_PER_NS = 1000


def _instruction(name: str) -> str:
    name = name.strip()
    return name[1:].split(" = ", 1)[0].strip() if name.startswith("%") else name


def is_communication(name: str, category: str = "") -> bool:
    """Whether an op named ``name`` of ``hlo_category`` ``category`` is communication."""
    if category.lower() in COMMUNICATION_CATEGORIES:
        return True
    op = _instruction(name)
    return bool(_NAME_RE.match(op) or _NCCL_RE.match(op))


def async_role(name: str) -> tuple[str, str] | None:
    """``(key, "start" | "done")`` of an async op's start or done op, else None."""
    op = _instruction(name)
    if match := _START_DONE_RE.match(op):
        return match["base"] + (match["n"] or ""), match["role"]
    if match := _SEND_RECV_RE.match(op):
        return match["base"] + (match["n"] or ""), "start"
    return None


def _family(name: str) -> str:
    """An async op's kind (``all-gather-start.3`` -> ``all-gather``), as XProf names it."""
    op = _instruction(name)
    match = _START_DONE_RE.match(op) or _SEND_RECV_RE.match(op)
    base = match["base"] if match else op
    tokens = [t for t in base.split(".") if t and not t.isdigit()]
    return tokens[-1] if tokens else base


class _Plane:
    """What one device plane gives: intervals in ns since the epoch."""

    def __init__(self) -> None:
        self.comm: list[tuple[np.ndarray, np.ndarray]] = []
        self.cover: list[tuple[np.ndarray, np.ndarray]] = []  # ops that hide a transfer
        self.kinds: dict[str, int] = defaultdict(int)  # communication ns per op kind
        self.async_events: list[tuple[int, int, str]] = []  # start/done ops: (s, e, name)
        self.windows: list[tuple[int, int, str]] | None = None  # the Async XLA Ops line


class CommunicationRecorder:
    """Communication op intervals and async windows of each device plane, from the op
    lines the device conversion reads (``Capture.on_op_line``); each op classified once
    per metadata id."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.planes: dict[PlaneRef, _Plane] = {}
        self._kind: dict[tuple[PlaneRef, int], tuple[bool, bool, str]] = {}
        self._category_ids: dict[PlaneRef, int] = {}  # the hlo_category stat's id

    def _classify(self, line: OpLine, meta_id: int) -> tuple[bool, bool, str]:
        """(is communication, is an async start/done/send/recv op, name)."""
        key = (line.ref, meta_id)
        found = self._kind.get(key)
        if found is None:
            plane = line.plane
            category_id = self._category_ids.get(line.ref)
            if category_id is None:
                category_id = self._category_ids[line.ref] = next(
                    (m.id for m in plane.stat_metadata.values() if m.name == "hlo_category"), -1
                )
            meta = plane.event_metadata.get(meta_id)
            name = (meta.name or meta.display_name) if meta is not None else ""
            category = ""
            if meta is not None and category_id >= 0:
                for stat in meta.stats:
                    if stat.metadata_id == category_id:
                        if stat.ref_value:
                            ref = plane.stat_metadata.get(stat.ref_value)
                            category = ref.name if ref is not None else ""
                        else:
                            category = stat.str_value
                        break
            found = self._kind[key] = (
                is_communication(name, category),
                async_role(name) is not None,
                _instruction(name),
            )
        return found

    def __call__(
        self, line: OpLine, start: np.ndarray | None = None, end: np.ndarray | None = None
    ) -> None:
        """Read one op line; ``start`` / ``end``: its events in ns since the epoch, when
        the caller has them already."""
        plane = self.planes.get(line.ref)
        if plane is None:
            plane = self.planes[line.ref] = _Plane()
            plane.windows = self._async_line(line)
        ids = line.ids
        if not len(ids):
            return
        # Metadata ids are small integers: classify each id present once, then look the
        # events up in tables (no sort of the line's events).
        if ids.min() < 0:
            return
        present = np.flatnonzero(np.bincount(ids))
        kinds = {int(m): self._classify(line, int(m)) for m in present.tolist()}
        size = int(present[-1]) + 1
        comm_table = np.zeros(size, bool)
        role_table = np.zeros(size, bool)
        for m, (comm_op, role_op, _) in kinds.items():
            comm_table[m], role_table[m] = comm_op, role_op
        comm = comm_table[ids]
        role = role_table[ids]
        any_role = bool(role.any())
        if not comm.any() and not any_role and plane.windows is None:
            return  # nothing of this line is communication or async
        if start is None or end is None:
            start = line.base_ns + line.starts_ps // _PS_PER_NS
            end = start + (line.ends_ps - line.starts_ps) // _PS_PER_NS
        if comm.any():
            plane.comm.append(union(start[comm], end[comm]))
            per_meta = np.bincount(ids[comm], weights=(end - start)[comm], minlength=size)
            for m in np.flatnonzero(per_meta).tolist():
                plane.kinds[_family(kinds[m][2])] += int(per_meta[m])
        if plane.windows is not None or any_role:
            # What can hide a transfer: only needed where async windows are.
            plane.cover.append(union(start[~role], end[~role]))
        if any_role and plane.windows is None:
            for i in np.flatnonzero(role).tolist():
                plane.async_events.append((int(start[i]), int(end[i]), kinds[int(ids[i])][2]))

    def _async_line(self, line: OpLine) -> list[tuple[int, int, str]] | None:
        """The plane's ``Async XLA Ops`` windows (ns since the epoch), None without one."""
        from exporter.profiles.xplane import line_headers, read_line

        headers = [h for h in line_headers(self.capture, line.plane) if h.name == ASYNC_OPS_LINE]
        if not headers:
            return None
        out = []
        for header in headers:
            found = read_line(self.capture, line.plane, header.index)
            base = self.capture.line_start_ns(found.timestamp_ns)
            for event in found.events:
                if event.duration_ps <= 0:
                    continue
                meta = line.plane.event_metadata.get(event.metadata_id)
                name = (meta.name or meta.display_name) if meta is not None else ""
                begin = base + event.offset_ps // _PS_PER_NS
                out.append((begin, begin + event.duration_ps // _PS_PER_NS, _instruction(name)))
        return out

    @staticmethod
    def _merged(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty
        return union(np.concatenate([s for s, _ in parts]), np.concatenate([e for _, e in parts]))

    def per_cycle(self, cycles: Sequence[tuple[int, int]]) -> np.ndarray:
        """Per cycle, communication ns averaged over the device planes."""
        per_device = [covered(*self._merged(p.comm), cycles) for p in self.planes.values()]
        if not per_device:
            return np.zeros(len(cycles), float)
        return np.mean(per_device, axis=0).astype(float)  # type: ignore[no-any-return]

    def kinds(self) -> dict[str, float]:
        """Communication ns per op kind, averaged over the device planes."""
        total: dict[str, float] = defaultdict(float)
        for plane in self.planes.values():
            for kind, ns in plane.kinds.items():
                total[kind] += ns / len(self.planes)
        return dict(total)

    def windows(self) -> tuple[list[tuple[int, int, int]], str | None]:
        """Every async window as (start, end, covered ns), and where windows came from."""
        out: list[tuple[int, int, int]] = []
        sources = set()
        for plane in self.planes.values():
            if plane.windows is not None:
                windows = [(s, e) for s, e, _ in plane.windows]
                sources.add(f"{ASYNC_OPS_LINE} line")
            else:
                windows = _pair(plane.async_events)
                if windows:
                    sources.add("start/done op pairs")
            if not windows:
                continue
            cover = self._merged(plane.cover)
            lengths = covered(*cover, windows)
            out += [(s, e, int(c)) for (s, e), c in zip(windows, lengths.tolist(), strict=True)]
        return out, " and ".join(sorted(sources)) or None


def _pair(events: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Start and done ops paired in time order (XProf's async_overlap pairing)."""
    open_starts: dict[str, deque[tuple[int, int, str]]] = defaultdict(deque)
    out = []
    for start, end, name in sorted(events):
        role = async_role(name)
        if role is None:
            continue
        key, kind = role
        if kind == "start":
            open_starts[key].append((start, end, name))
        elif open_starts[key]:
            began = open_starts[key].popleft()
            out.append((began[0], end))
    return out


def overlap_facts(recorder: CommunicationRecorder, cycles_count: int) -> Overlap | None:
    """Async windows, their hidden share and exposed ms per step; None without any."""
    windows, source = recorder.windows()
    span = sum(e - s for s, e, _ in windows)
    if not windows or source is None or span <= 0 or cycles_count <= 0:
        return None
    covered = sum(c for _, _, c in windows)
    devices = max(1, len(recorder.planes))
    per_step = 1e6 * cycles_count * devices
    return {
        "async_ops": len(windows),
        "source": source,
        "async_ms_per_step": round(span / per_step, 4),
        "hidden_pct": round(100 * covered / span, 2),
        "exposed_ms_per_step": round((span - covered) / per_step, 4),
    }
