"""A CPU capture's XLA events read from the compiled core's stat columns are the twin's.

``xla_host.xla_host_events`` reads each host line's ``hlo_op``, ``hlo_module`` and
``run_id`` stats as columns (``_column_rows``); the twin (``_parsed_rows``, what
``MLPROF_DECODER=python`` runs) reads the line through protobuf an event at a time.
Generated XSpaces with every stat encoding (ref and str modules, int64, uint64 past
2**63, double and text run ids, repeated stats, stats without a value), executor waits,
instants, metadata ids past the lookup table's range and lines read in several pieces
must give the same events, or the same refusal.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from exporter.analysis.sides import xla_host
from exporter.errors import InputError
from exporter.profiles import xspace
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.xplane import parse_xspace
from exporter.proto import xplane_pb2

OP, MODULE, RUN, OTHER, PROGRAM_NAME = 1, 2, 3, 4, 5
WAIT = "ThunkExecutor::Execute (wait for completion)"


def _stat(event: xplane_pb2.XEvent, rng: random.Random, stat_id: int) -> None:
    stat = event.stats.add(metadata_id=stat_id)
    kind = rng.randrange(8)
    if kind == 0:
        stat.int64_value = rng.choice([0, 7, 9, -1, (1 << 63) - 1])  # -1: uint64's max
    elif kind == 1:
        stat.uint64_value = rng.choice([0, 7, 9, (1 << 64) - 1, 1 << 63])
    elif kind == 2:
        stat.double_value = rng.choice([7.0, 0.5, -1.0])
    elif kind == 3:
        stat.str_value = rng.choice(["", "jit_step(1)", "7", "jit_other"])
    elif kind == 4:
        stat.ref_value = rng.choice([0, PROGRAM_NAME, OP, 99, (1 << 64) - 1])
    elif kind == 5:
        stat.bytes_value = b"\x01"
    # else: a stat without a value


def _space(seed: int) -> bytes:
    rng = random.Random(seed)
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    for stat_id, name in ((OP, "hlo_op"), (MODULE, "hlo_module"), (RUN, "run_id"),
                          (OTHER, "other"), (PROGRAM_NAME, "jit_named(4)")):  # fmt: skip
        plane.stat_metadata[stat_id].id = stat_id
        plane.stat_metadata[stat_id].name = name
    big = rng.random() < 0.3  # metadata ids too large for a table: the sorted lookup
    metas = [(10**9 if big else 0) + k for k in range(1, 9)]
    for k, meta_id in enumerate(metas):
        plane.event_metadata[meta_id].id = meta_id
        plane.event_metadata[meta_id].name = WAIT if k < 2 else f"op.{k}"
    for number in range(rng.randint(1, 4)):
        line = plane.lines.add(id=number + 1, name=f"thread{number}", timestamp_ns=1_000 + number)
        at = 0
        for _ in range(rng.randint(0, 40)):
            at += rng.randint(0, 3_000)
            event = line.events.add(
                metadata_id=rng.choice(metas),
                offset_ps=at,
                duration_ps=rng.choice([0, 500, 2_000, 9_000, 40_000]),
            )
            for _ in range(rng.randint(0, 5)):
                _stat(event, rng, rng.choice([OP, OP, MODULE, MODULE, RUN, RUN, OTHER]))
    return space.SerializeToString()


def _read(data: bytes, decoder: str) -> Any:
    with xspace.use_decoder(decoder):
        try:
            events = xla_host.xla_host_events(parse_xspace(data, "c.xplane.pb"))
        except InputError as exc:
            return ("refused", str(exc))
    return (events.start.tolist(), events.end.tolist(), events.path_index.tolist(),
            events.parent.tolist(), events.paths)  # fmt: skip


@pytest.mark.parametrize("window", [xspace.LINE_WINDOW, 97])
def test_the_columns_read_the_twins_events(monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    # A window of 97 bytes reads each line in pieces (their strings joined).
    monkeypatch.setattr(xspace, "LINE_WINDOW", window)
    seen_events = seen_programs = 0
    for seed in range(400):
        data = _space(seed)
        twin = _read(data, "python")
        with monkeypatch.context() as inner:
            # The compiled decoder must not reach the twin (only protobuf's fallback for a
            # line the core refuses, which these canonical lines are not).
            inner.setattr(xla_host, "_parsed_rows", None)
            compiled = _read(data, "compiled")
        assert compiled == twin, seed
        if twin[0] != "refused":
            seen_events += len(twin[0])
            seen_programs += sum(1 for p in twin[4] if p[0] != xla_host.UNKNOWN_PROGRAM)
    assert seen_events > 1_000 and seen_programs > 0


def test_a_corrupt_line_is_refused_alike() -> None:
    # A line name that is not UTF-8: protobuf refuses the line (not the plane), and so
    # does the core, which hands it to protobuf; one message either way.
    space = xplane_pb2.XSpace.FromString(_space(3))
    space.planes[0].lines[0].name = "bad-name-here"
    data = space.SerializeToString().replace(b"bad-name-here", b"bad\xffname\xfehere")
    refused = _read(data, "python")
    assert refused == ("refused", "c.xplane.pb: corrupt XProf capture (a line does not parse)")
    assert _read(data, "compiled") == refused


def test_a_uint64_run_id_is_not_the_int64_of_its_bits() -> None:
    # uint64 2**64-1 and int64 -1 have the same bits and are different runs: the op of
    # the second names no program, and must not take the first's.
    space = xplane_pb2.XSpace.FromString(_space(0))
    del space.planes[0].lines[1:]
    line = space.planes[0].lines[0]
    del line.events[:]
    named = line.events.add(metadata_id=3, offset_ps=0, duration_ps=100)
    named.stats.add(metadata_id=OP, str_value="op.1")
    named.stats.add(metadata_id=MODULE, str_value="jit_step(1)")
    named.stats.add(metadata_id=RUN, int64_value=-1)
    unnamed = line.events.add(metadata_id=3, offset_ps=200, duration_ps=100)
    unnamed.stats.add(metadata_id=OP, str_value="op.1")
    unnamed.stats.add(metadata_id=RUN, uint64_value=(1 << 64) - 1)
    data = space.SerializeToString()
    twin = _read(data, "python")
    assert twin[4] == [("jit_step(1)", "op.2"), (xla_host.UNKNOWN_PROGRAM, "op.2")]
    assert _read(data, "compiled") == twin


def _shape(graph: FlameGraph) -> list[Any]:
    head = (graph.sample_type, graph.unit, graph.profile_name, graph.time_nanos,
            graph.duration_nanos, graph.comments)  # fmt: skip
    return [head, *((d, n.name, n.file, n.line, n.self_value, n.total) for d, n in graph._walk())]


def test_the_graphs_are_those_made_a_path_at_a_time() -> None:
    # xla_host.graphs builds each window's graph with the frame builder (compiled maker,
    # or its twin); FlameGraph.add of each path in order is the reference: same frames,
    # values, totals and children's order, whole and per window (empty windows too).
    rng = random.Random(8)
    built = 0
    for seed in range(120):
        data = _space(seed)
        with xspace.use_decoder(rng.choice(["compiled", "python"])):
            events = xla_host.xla_host_events(parse_xspace(data, "c.xplane.pb"))
            if not len(events):
                continue
            lo, hi = int(events.start.min()), int(events.end.max())
            edges = sorted(rng.sample(range(lo - 5, hi + 5), min(2 * rng.randint(1, 6), hi - lo)))
            spans = list(zip(edges[::2], edges[1::2], strict=False))
            for windows in (None, spans):
                got = xla_host.graphs(events, windows, 17)
                per_window = _reference_sums(events, windows)
                template = FlameGraph(sample_type="device_time", unit="nanoseconds",
                                      profile_name="device")  # fmt: skip
                expected = xla_host._graphs_one_by_one(events.paths, per_window,
                                                       len(per_window), template)  # fmt: skip
                for graph, (start, _) in zip(expected, windows or [(0, 0)], strict=True):
                    graph.time_nanos = max(start, 17) if windows is not None else 17
                assert [_shape(g) for g in got] == [_shape(g) for g in expected]
                built += sum(g.node_count for g in got)
    assert built > 500


def _reference_sums(events: xla_host.XlaEvents, windows: Any) -> np.ndarray:
    """Each window's time per path, the plain way (overlap added to the path, taken from
    its parent's path)."""
    spans = windows if windows is not None else [(-(1 << 62), 1 << 62)]
    out = np.zeros((len(spans), len(events.paths)))
    for i in range(len(events)):
        for w, (lo, hi) in enumerate(spans):
            part = min(int(events.end[i]), hi) - max(int(events.start[i]), lo)
            if part > 0:
                out[w, events.path_index[i]] += part
                if events.parent[i] >= 0:
                    out[w, events.path_index[events.parent[i]]] -= part
    return out
