"""Per-host facts of a session, and the straggler score over hosts.

One entry per capture file: a host, its step cycles (median, p90), and where each
step's time went: XLA computing (split into compute and communication) or idle (waiting
for input, the host, or other hosts).

A host is named by the session that captured it where there is one (the ``host`` of the
``session.json`` target whose files hold the capture; its address when two targets share
a host), else by the file's ``HOST_PORT`` read from the right (``10.0.0.5_9999`` is
``10.0.0.5:9999``), else by the file's stem. XProf's ``get_hosts`` keeps the last
dot-separated part (``5_9999``), which named two machines of one subnet alike and a
demo's host ``vm`` as ``1_9999``.

Stragglers, as XProf's ``GetHostStragglers`` (smart_suggestion/signal_provider.h): the
modified z-score ``0.6745 * (x - median) / MAD`` of each host's median step over the
hosts, above :data:`STRAGGLER_Z`, and no verdict under :data:`STRAGGLER_MIN_HOSTS` hosts.
XProf floors the MAD at 0.1 (percentage points of a time share); on step times in ms the
floor is a share of the median (:data:`STRAGGLER_MAD_FLOOR`), so that hosts with
near-identical steps (MAD about 0) do not make a 2 % slower one a straggler. Only a slower
host is a straggler: a faster one holds nobody up.

The score is taken twice: on the median step, and on the median time a step spends
outside collectives (``own_median_ms``, the step less its communication). When hosts
run in lockstep their steps last alike, and the one the others wait for shows only in
the second: it does more of its own work while they wait inside their collectives.
``straggler_basis`` says which score named the host (the step time first).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from exporter.analysis.facts.types import HostFacts
from exporter.ascii_digits import parse_ascii_int
from exporter.profiles.capture_files import CAPTURE_SUFFIXES, capture_stem
from exporter.regular_files import read_regular

__all__ = [
    "STRAGGLER_MAD_FLOOR",
    "STRAGGLER_MIN_HOSTS",
    "STRAGGLER_Z",
    "host_entries",
    "host_name",
]

STRAGGLER_Z: Final = 3.5  # Iglewicz & Hoaglin's outlier cut, XProf's straggler_threshold
STRAGGLER_MIN_HOSTS: Final = 3  # XProf: "3 hosts is the minimum required"
# Of the median host's median step (facts.STEP_MAD_FLOOR). Measured by bench/stragglers.py
# (3- and 4-host sessions of JAX CPU captures, one process each, on a shared 2-core
# machine; docs/analysis.md "Stragglers (measured)"): no host named in any of 320
# sessions whose processes ran alike by their own clocks; 0-1.7 % of all-unchanged
# sessions in two runs, 13-25 % in a busier one, every one naming a process that its own
# clock showed 1.2-1.4x slower (a host that was slower). A host 50 % slower was named in
# 9-92 % of sessions (the spread between processes decides); a floor of 0.15 would
# have cut that to 0-2 %, so the floor stays.
STRAGGLER_MAD_FLOOR: Final = 0.05
SLOWEST_STEPS: Final = 3
_TRACE_SUFFIXES: Final = (*CAPTURE_SUFFIXES, ".xspace.pb")
SESSION_FILE: Final = "session.json"


def host_name(path: Path | str) -> str:
    """The host a capture file holds (see the module docstring)."""
    path = Path(path)
    named = _session_hosts(path.parent).get(path.name)
    if named:
        return named
    name = path.name
    for suffix in _TRACE_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    host, _, port = name.rpartition("_")
    number = parse_ascii_int(port)
    return f"{host}:{port}" if host and number is not None and 0 < number < 65536 else name


def _session_hosts(directory: Path) -> dict[str, str]:
    """Capture file name -> its target's host, from ``directory/session.json``; {} without."""
    record_path = directory / SESSION_FILE
    try:
        stat = record_path.stat()
    except OSError:
        return {}
    return _read_session_hosts(record_path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)  # every host of a session asks, twice
def _read_session_hosts(record_path: Path, _mtime_ns: int, _size: int) -> dict[str, str]:
    # Imported here: the session record's model imports pydantic and the store (fsspec),
    # ~0.25 s of CPU that an analysis of a capture without session.json never needs.
    from exporter.capture.session import SessionRecord
    from exporter.capture.store import MAX_RECORD_BYTES

    try:
        record = SessionRecord.model_validate_json(read_regular(record_path, MAX_RECORD_BYTES))
    except (OSError, ValueError):  # not a regular file, too big, not a record: no names
        return {}
    hosts = [t.host for t in record.targets]
    return {
        file: target.address if hosts.count(target.host) > 1 else target.host
        for target in record.targets
        if target.host
        for file in target.files
    }


def _round(value: float, digits: int = 3) -> float:
    return round(float(value), digits)


def _entry(
    path: Path,
    cycles: Sequence[tuple[int, int]],
    steps: Sequence[int | None],
    busy: np.ndarray,
    communication: np.ndarray,
) -> HostFacts:
    durations = np.asarray([hi - lo for lo, hi in cycles], float)
    n = len(durations)
    total = float(durations.sum())
    busy_ns = float(busy.sum())
    comm_ns = float(communication.sum())
    idle = durations - busy
    own = durations - communication
    slowest = np.argsort(-durations, kind="stable")[:SLOWEST_STEPS]
    pct = 100.0 / total if total else 0.0
    return {
        "name": host_name(path),
        "file": str(path),
        "steps": n,
        "step_median_ms": _round(np.median(durations) / 1e6) if n else None,
        "step_p90_ms": _round(np.percentile(durations, 90) / 1e6) if n else None,
        "step_mean_ms": _round(durations.mean() / 1e6) if n else None,
        "own_median_ms": _round(np.median(own) / 1e6) if n else None,
        "device_busy_pct": _round(busy_ns * pct, 2),
        "compute_pct": _round((busy_ns - comm_ns) * pct, 2),
        "communication_pct": _round(comm_ns * pct, 2),
        "idle_pct": _round(max(0.0, total - busy_ns) * pct, 2),
        "compute_ms_per_step": _round((busy_ns - comm_ns) / n / 1e6) if n else None,
        "communication_ms_per_step": _round(comm_ns / n / 1e6) if n else None,
        "idle_ms_per_step": _round(max(0.0, total - busy_ns) / n / 1e6) if n else None,
        "slowest_steps": [
            {
                "step": steps[i],
                "ms": _round(durations[i] / 1e6),
                "busy_ms": _round(busy[i] / 1e6),
                "idle_ms": _round(idle[i] / 1e6),
            }
            for i in slowest.tolist()
        ],
        "straggler_z": None,
        "straggler": None,
        "straggler_basis": None,
    }


def _unique_names(entries: list[HostFacts]) -> None:
    """Two files XProf names alike keep their file stems (then their paths) apart."""
    for key in ("stem", "file"):
        names = [e["name"] for e in entries]
        clash = {n for n in names if names.count(n) > 1}
        if not clash:
            return
        for e in entries:
            if e["name"] in clash:
                e["name"] = capture_stem(Path(e["file"]).name) if key == "stem" else e["file"]


def host_entries(
    hosts: Sequence[tuple[Path, Sequence[tuple[int, int]], Sequence[int | None], Any, Any]],
    *,
    mad_floor: float = STRAGGLER_MAD_FLOOR,
) -> list[HostFacts]:
    """``facts.hosts``: one entry per (path, cycles, step numbers, busy, communication),
    with the straggler score when there are enough hosts (see the module docstring).
    ``mad_floor``: other floors are for ``bench/stragglers.py`` to compare."""
    entries = [
        _entry(path, cycles, steps, np.asarray(busy, float), np.asarray(comm, float))
        for path, cycles, steps, busy, comm in hosts
        if len(cycles)
    ]
    repeated = len({e["name"] for e in entries}) < len(entries)
    _unique_names(entries)
    if len(entries) < STRAGGLER_MIN_HOSTS or repeated:
        # A host captured more than once (a run's sessions) is compared with itself at
        # another time, not with other hosts: no straggler verdict.
        return entries
    # Every entry has cycles here, so its medians are numbers, never None.
    by_step = _scores([e["step_median_ms"] or 0.0 for e in entries], mad_floor)
    by_own = _scores([e["own_median_ms"] or 0.0 for e in entries], mad_floor)
    for entry, z_step, z_own in zip(entries, by_step, by_own, strict=True):
        entry["straggler"] = max(z_step, z_own) > STRAGGLER_Z
        if z_step > STRAGGLER_Z or not entry["straggler"]:
            entry["straggler_z"], basis = round(z_step, 2), "step time"
        else:
            entry["straggler_z"], basis = round(z_own, 2), "time outside collectives"
        entry["straggler_basis"] = basis if entry["straggler"] else None
    return entries


def _scores(values: list[float], mad_floor: float) -> list[float]:
    """Each value's modified z-score, the MAD floored at a share of the median."""
    center = statistics.median(values)
    mad = max(statistics.median(abs(v - center) for v in values), mad_floor * center)
    return [0.6745 * (v - center) / mad if mad > 0 else 0.0 for v in values]
