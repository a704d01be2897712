"""XLA computations that ran on host threads: the CPU backend's "device".

A JAX CPU capture has no device plane; XLA's CPU client runs each HLO op (a thunk) on
its own threads (``tf_XLAPjRtCpuClient``, ``tf_XLAEigen``), and every such event
carries ``hlo_op`` and ``hlo_module`` stats. Work the executor hands to a thread pool
without such an event shows as ``ThunkExecutor::Execute (wait for completion)`` on the
client thread (with the program's ``run_id``): that is XLA time too. These events are
to a CPU capture what a TPU's ``XLA Ops`` line is to a TPU: they give it a device-time
flame graph (program > op, whichever thread ran it) and the time inside a step when
XLA computes.

Events that nest on one thread (a ``while`` thunk running its body) are stacked:
each event adds its time to its own frame and takes it from its parent's, so self
time excludes nested ops, as XProf computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.xplane import Capture

__all__ = ["XlaEvents", "busy_ns", "graphs", "xla_host_events"]

HLO_OP_STAT = "hlo_op"
HLO_MODULE_STAT = "hlo_module"
RUN_ID_STAT = "run_id"
# XLA's CPU executor waiting for the program's asynchronous thunks (e.g. a dot on the
# Eigen pool, whose work carries no hlo_op event): the program is still computing.
EXECUTOR_WAIT_PREFIX = "ThunkExecutor::Execute"
UNKNOWN_PROGRAM = "<unknown program>"
_PS_PER_NS = 1000


@dataclass
class XlaEvents:
    """XLA events of the host planes, absolute nanoseconds since the epoch.

    ``paths[path_index[i]]`` is event ``i``'s stack (program, outer ops..., op);
    ``parent[i]`` the event it nests in on its thread, or -1.
    """

    start: np.ndarray
    end: np.ndarray
    path_index: np.ndarray
    parent: np.ndarray
    paths: list[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.start)


def _module_names(plane: object) -> dict[int, str]:
    return {k: m.name for k, m in plane.stat_metadata.items()}  # type: ignore[attr-defined]


def xla_host_events(capture: Capture) -> XlaEvents:
    """XLA events of the capture's host planes: ``hlo_op`` events and executor waits."""
    from exporter.proto import xplane_pb2

    starts: list[int] = []
    ends: list[int] = []
    path_ids: list[int] = []
    parents: list[int] = []
    paths: dict[tuple[str, ...], int] = {}
    path_list: list[tuple[str, ...]] = []
    for ref in capture.host_planes:
        plane = capture.plane(ref)
        names = _module_names(plane)
        op_id = next((k for k, n in names.items() if n == HLO_OP_STAT), None)
        module_id = next((k for k, n in names.items() if n == HLO_MODULE_STAT), None)
        run_stat = next((k for k, n in names.items() if n == RUN_ID_STAT), None)
        if op_id is None:
            continue
        waits = {
            k for k, m in plane.event_metadata.items() if m.name.startswith(EXECUTOR_WAIT_PREFIX)
        }
        lines: list[list[tuple[int, int, int, str, int]]] = []
        program_of_run: dict[int, str] = {}
        for raw in plane.lines:
            line = xplane_pb2.XLine()
            line.ParseFromString(raw)
            base_ps = capture.line_start_ns(line.timestamp_ns) * _PS_PER_NS
            # start ps, end ps, metadata id, program, run id
            found: list[tuple[int, int, int, str, int]] = []
            for event in line.events:
                if event.duration_ps <= 0:
                    continue
                program, run, is_op = "", 0, False
                for stat in event.stats:
                    if stat.metadata_id == op_id:
                        is_op = True
                    elif stat.metadata_id == module_id:
                        ref_value = stat.ref_value
                        program = names.get(ref_value, "") if ref_value else stat.str_value
                    elif stat.metadata_id == run_stat:
                        run = stat.int64_value or stat.uint64_value
                if is_op and program and run:
                    program_of_run[run] = program
                if is_op or (run and event.metadata_id in waits):
                    start = base_ps + event.offset_ps
                    found.append(
                        (start, start + event.duration_ps, event.metadata_id, program, run)
                    )
            capture.events_read += len(line.events)
            if found:
                lines.append(found)
        for found in lines:
            found.sort(key=lambda e: (e[0], -e[1]))
            open_events: list[tuple[int, int]] = []  # (end ps, global index)
            for start, end, meta_id, program, run in found:
                while open_events and (open_events[-1][0] <= start or open_events[-1][0] < end):
                    open_events.pop()  # ended, or overlaps without containing: not a parent
                meta = plane.event_metadata.get(meta_id)
                op = (meta.name or meta.display_name) if meta is not None else f"<op {meta_id}>"
                parent = open_events[-1][1] if open_events else -1
                named = program or program_of_run.get(run, "") or UNKNOWN_PROGRAM
                stack = (*path_list[path_ids[parent]], op) if parent >= 0 else (named, op)
                index = paths.get(stack, -1)
                if index < 0:
                    index = paths[stack] = len(path_list)
                    path_list.append(stack)
                starts.append(start // _PS_PER_NS)
                ends.append(end // _PS_PER_NS)
                path_ids.append(index)
                parents.append(parent)
                open_events.append((end, len(starts) - 1))
    return XlaEvents(
        np.asarray(starts, np.int64),
        np.asarray(ends, np.int64),
        np.asarray(path_ids, np.int64),
        np.asarray(parents, np.int64),
        path_list,
    )


def _overlap(events: XlaEvents, lo: int, hi: int) -> np.ndarray:
    overlap: np.ndarray = np.clip(
        np.minimum(events.end, hi) - np.maximum(events.start, lo), 0, None
    )
    return overlap


def graphs(
    events: XlaEvents, windows: Sequence[tuple[int, int]] | None, time_nanos: int = 0
) -> list[FlameGraph]:
    """Device-time graphs (program > op, ns): one per window, or one of all time."""
    spans = list(windows) if windows is not None else [(-(1 << 62), 1 << 62)]
    out = []
    has_parent = events.parent >= 0
    for lo, hi in spans:
        graph = FlameGraph(
            sample_type="device_time",
            unit="nanoseconds",
            profile_name="device",
            time_nanos=max(lo, time_nanos) if windows is not None else time_nanos,
        )
        part = _overlap(events, lo, hi)
        # Own time minus what nested ops took inside the window.
        self_ns = np.bincount(events.path_index, weights=part, minlength=len(events.paths))
        if has_parent.any():
            parent_paths = events.path_index[events.parent[has_parent]]
            self_ns -= np.bincount(
                parent_paths, weights=part[has_parent], minlength=len(events.paths)
            )
        for index in np.flatnonzero(self_ns > 0).tolist():
            graph.add(events.paths[index], round(float(self_ns[index])))
        out.append(graph)
    return out


def busy_ns(events: XlaEvents, windows: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per window: nanoseconds during which at least one XLA computation ran."""
    if not len(events):
        return np.zeros(len(windows), np.int64)
    order = np.argsort(events.start, kind="stable")
    starts, ends = events.start[order], events.end[order]
    # Merge into disjoint busy intervals: a new interval starts where an event begins
    # after every earlier event has ended.
    reach = np.maximum.accumulate(ends)
    fresh = np.ones(len(starts), bool)
    fresh[1:] = starts[1:] > reach[:-1]
    group = np.cumsum(fresh) - 1
    merged_start = starts[fresh]
    merged_end = np.zeros(int(group[-1]) + 1, np.int64)
    np.maximum.at(merged_end, group, ends)
    out = np.zeros(len(windows), np.int64)
    for i, (lo, hi) in enumerate(windows):
        out[i] = int(
            np.clip(np.minimum(merged_end, hi) - np.maximum(merged_start, lo), 0, None).sum()
        )
    return out
