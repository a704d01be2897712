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

import pytest

from exporter.analysis.sides import xla_host
from exporter.errors import InputError
from exporter.profiles import xspace
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
