"""Memory pprof -> flame graphs: frame identity, live allocation counts, both pushed."""

from __future__ import annotations

import gzip
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.errors import InputError
from exporter.profiles.memory import load_memory_profile, memory_flamegraph
from exporter.profiles.pprof import decode_pprof, encode_pprof, inflate
from exporter.proto import profile_pb2
from exporter.sinks.pyroscope import PyroscopeLimits, PyroscopeSink, decode_push, fit_to_limits

LABELS = {
    "service_name": "trainer",
    "run_id": "r1",
    "host": "h0",
    "trigger": "manual",
    "profile_source": "device_memory",
}


def _profile(
    types: tuple[str, str], samples: list[tuple[list[tuple[str, str, int]], int, int]]
) -> bytes:
    """A pprof like JAX's: (count type, space type), stacks leaf-first of (name, file, line)."""
    profile = profile_pb2.Profile()
    table = [""]

    def s(text: str) -> int:
        if text not in table:
            table.append(text)
        return table.index(text)

    count_type, space_type = types
    profile.sample_type.add(type=s(count_type), unit=s("count"))
    profile.sample_type.add(type=s(space_type), unit=s("bytes"))
    functions: dict[tuple[str, str, int], int] = {}
    for stack, count, space in samples:
        ids = []
        for name, file, start in stack:
            key = (name, file, start)
            if key not in functions:
                functions[key] = len(functions) + 1
                profile.function.add(id=functions[key], name=s(name), system_name=s(name),
                                     filename=s(file), start_line=start)  # fmt: skip
                loc = profile.location.add(id=functions[key])
                loc.line.add(function_id=functions[key], line=start + 2)
            ids.append(functions[key])
        sample = profile.sample.add(location_id=ids, value=[count, space])
        sample.label.add(key=s("device"), str=s("cpu:0"))
    profile.string_table.extend(table)
    return gzip.compress(profile.SerializeToString())


MAIN = ("main", "train.py", 1)


def test_same_named_functions_in_two_files_are_two_frames() -> None:
    data = _profile(
        ("allocations", "space"),
        [
            ([("foo", "a.py", 10), MAIN], 1, 100),
            ([("foo", "b.py", 3), MAIN], 1, 50),
        ],
    )
    graph = memory_flamegraph(data)
    main = graph.find(["cpu:0", "main"])
    assert main is not None
    assert sorted((c.name, c.file, c.line, c.total) for c in main.children.values()) == [
        ("foo", "a.py", 10, 100),
        ("foo", "b.py", 3, 50),
    ]


def test_live_allocation_counts_are_kept_beside_bytes() -> None:
    data = _profile(
        ("allocations", "space"),
        [
            ([("small", "m.py", 5), MAIN], 400, 400 * 16),
            ([("big", "m.py", 9), MAIN], 1, 1 << 20),
            ([("compile", "jax.py", 7), MAIN], 1, 0),  # an executable: no bytes
        ],
    )
    graph = memory_flamegraph(data)
    assert (graph.sample_type, graph.unit) == ("inuse_space", "bytes")
    (objects,) = graph.companions
    assert (objects.sample_type, objects.unit, objects.period_type) == (
        "inuse_objects",
        "count",
        "space",
    )
    assert objects.root.total == 402
    assert objects.find(["cpu:0", "main", "small"]).total == 400  # type: ignore[union-attr]
    assert graph.find(["cpu:0", "main", "compile"]) is None  # 0 bytes: no frame
    profile = decode_pprof(encode_pprof(graph))
    table = profile.string_table
    assert [(table[t.type], table[t.unit]) for t in profile.sample_type] == [
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert sum(s.value[0] for s in profile.sample) == 402
    assert sum(s.value[1] for s in profile.sample) == 400 * 16 + (1 << 20)


def test_pyroscope_names_are_read_too() -> None:
    # What a PyTorch snapshot reader writes: Pyroscope's own sample type names.
    data = _profile(("inuse_objects", "inuse_space"), [([("alloc", "t.py", 2)], 3, 96)])
    graph = memory_flamegraph(data)
    assert graph.root.total == 96
    assert graph.companions[0].root.total == 3


def test_the_push_carries_both_sample_types() -> None:
    data = _profile(("allocations", "space"), [([("f", "m.py", 1), MAIN], 7, 700)])
    graph = memory_flamegraph(data)
    raw, fitted = fit_to_limits(graph, PyroscopeLimits())
    profile = profile_pb2.Profile.FromString(raw)
    assert len(profile.sample_type) == 2 and fitted.companions
    request = PyroscopeSink("http://127.0.0.1:9").build_request(graph, LABELS)
    ((labels, (pushed,)),) = decode_push(request.SerializeToString())
    assert labels["__name__"] == "memory"
    table = pushed.string_table
    assert [table[t.type] for t in pushed.sample_type] == ["inuse_objects", "inuse_space"]
    assert (table[pushed.period_type.type], table[pushed.period_type.unit]) == ("space", "bytes")
    assert [list(s.value) for s in pushed.sample] == [[7, 700]]


def test_not_a_memory_profile() -> None:
    data = _profile(("samples", "cpu"), [([("f", "m.py", 1)], 1, 1)])
    with pytest.raises(InputError, match="expected 'space' or 'inuse_space'"):
        memory_flamegraph(data, "x.pprof")


def _zeros_gzip(size: int) -> bytes:
    """``size`` bytes of zeros as gzip: one 1 MiB member repeated (about 1 KB each)."""
    return gzip.compress(bytes(1 << 20), 9) * (size >> 20)


def test_a_decompression_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.pprof.gz"
    bomb.write_bytes(_zeros_gzip(1 << 30))  # 1 GiB of zeros in about 1 MB
    assert bomb.stat().st_size < 2 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"refused.*MLPROF_MAX_PROFILE_BYTES") as info:
        load_memory_profile(bomb)
    assert "\n" not in str(info.value)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 100  # it used to inflate all of it (1 GiB)
    # Within the byte cap, the ratio stops it.
    small = tmp_path / "small.pprof.gz"
    small.write_bytes(_zeros_gzip(16 << 20))
    with pytest.raises(InputError, match=r"more than 3\d{6} bytes.*MAX_PROFILE_RATIO"):
        load_memory_profile(small)


def test_the_cli_refuses_a_bomb_with_one_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.pprof.gz"
    bomb.write_bytes(_zeros_gzip(64 << 20))
    env = {**os.environ, "MLPROF_MAX_PROFILE_BYTES": str(4 << 20)}
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "flamegraph", str(bomb)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "MLPROF_MAX_PROFILE_BYTES=4194304" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_fifo_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "x.pprof.gz"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_memory_profile(fifo)  # used to block forever


def test_normal_profiles_inflate_as_before() -> None:
    data = _profile(("allocations", "space"), [([("f", "m.py", 1)], 1, 10)])
    assert inflate(data, "x") == gzip.decompress(data)
    assert inflate(data + data, "x") == gzip.decompress(data) * 2  # two gzip members
    with pytest.raises(ValueError, match="corrupt gzip"):
        inflate(data[:-9], "x")


def _amplifying_profile(lines: int, prefixes: int) -> bytes:
    """One location of ``lines`` inlined lines, reached under ``prefixes`` distinct roots."""
    profile = profile_pb2.Profile()
    profile.string_table.extend(["", "allocations", "count", "space", "bytes", "f", "a.py"])
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    for fn in range(1, lines + 1):
        profile.function.add(id=fn, name=5, filename=6, start_line=fn)
    big = profile.location.add(id=1)
    for fn in range(1, lines + 1):
        big.line.add(function_id=fn, line=fn)
    for root in range(prefixes):
        loc = profile.location.add(id=2 + root, address=0x1000 + root)  # no lines: an address
        profile.sample.add(location_id=[1, loc.id], value=[1, 8])
    return gzip.compress(profile.SerializeToString())


def test_inlined_lines_under_many_prefixes_are_refused_in_bounded_memory() -> None:
    # 1,100 inlined lines under 1,100 roots: 1.2M frames from 30 KB (the attack's 22.7 KB
    # reached 8 GiB). Refused by counting frames before making any, in one line.
    import tracemalloc

    data = _amplifying_profile(1_100, 1_100)
    assert len(data) < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"expand to 1211100 frames.*more than 1000000"):
            memory_flamegraph(data, "amplified.pprof.gz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    # The same shape within the bound still converts, every frame kept.
    graph = memory_flamegraph(_amplifying_profile(50, 40), "small.pprof.gz")
    assert graph.root.total == 8 * 40
    assert graph.node_count == 40 * 51  # per root: its address, then the 50 inlined frames
