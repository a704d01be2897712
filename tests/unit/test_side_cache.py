"""The side cache: a capture read once, its sides loaded from ``<capture>.sides.json.gz``.

Loading the cache gives exactly what decoding gives (the comparison JSON equal both
ways), a cache hit decodes nothing, and a stale, foreign, old-version or hostile cache
is ignored (and rewritten), never an error.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.compare.comparison import compare_sides
from exporter.analysis.sides import cache as side_cache
from exporter.analysis.sides.load import Side, load_side, load_sides
from exporter.profiles import xplane
from exporter.proto import xplane_pb2
from exporter.testing.synthetic import write_tpu_capture
from tests.xspace_builder import PlaneBuilder

SHAPE: dict[str, Any] = {"devices": 2, "steps": 8, "ops_per_step": 200, "distinct_ops": 40}
CAPTURE = "tpu-vm-0.xplane.pb"


def session(store: Path, name: str, **kwargs: Any) -> Path:
    """A session directory of the store layout holding one synthetic TPU capture."""
    directory = store / "plugins" / "profile" / name
    directory.mkdir(parents=True)
    (directory / "session.json").write_text("{}", encoding="utf-8")
    write_tpu_capture(directory / CAPTURE, **{**SHAPE, **kwargs})
    return directory


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every capture decoded (``load_capture`` called), in order."""
    seen: list[Path] = []
    real = xplane.load_capture

    def counting(path: Path, *args: Any, **kwargs: Any) -> Any:
        seen.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(xplane, "load_capture", counting)
    return seen


def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{path} decoded: the side cache was not used")

    monkeypatch.setattr(xplane, "load_capture", refuse)


def state(side: Side) -> dict[str, Any]:
    """Everything a side holds, as JSON."""
    return {
        **side.describe(),
        "kind": side.kind,
        "view": side.view,
        "scope": side.scope,
        "step_names": sorted(side.step_names),
        "step_ns": side.step_ns,
        "whole": side.whole.to_dict(),
        "whole_meta": meta(side.whole),
        "steps": [g.to_dict() for g in side.steps],
        "steps_meta": [meta(g) for g in side.steps],
    }


def meta(graph: Any) -> list[Any]:
    return [graph.sample_type, graph.unit, graph.profile_name, graph.period_type,
            graph.period_unit, graph.period, graph.time_nanos, graph.duration_nanos,
            graph.comments, len(graph.companions), graph.to_folded()]  # fmt: skip


def comparison(base: Side, head: Side) -> dict[str, Any]:
    return json.loads(json.dumps(compare_sides(base, head).to_json(top=50)))  # type: ignore[no-any-return]


def test_cached_sides_are_the_decoded_sides_and_compare_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[Path]
) -> None:
    base_dir = session(tmp_path, "base")
    head_dir = session(tmp_path, "head", slowdown=1.5, seed=1)
    kinds: list[Any] = ["device", "host"]
    decoded = {d: load_sides(str(d), kinds) for d in (base_dir, head_dir)}
    decoded_step = {d: load_side(str(d)) for d in (base_dir, head_dir)}
    assert len(decodes) == 2  # each capture decoded once: the step view read the cache
    assert side_cache.cache_path(base_dir / CAPTURE).is_file()
    assert side_cache.cache_path(head_dir / CAPTURE).is_file()

    no_decoding(monkeypatch)
    cached = {d: load_sides(str(d), kinds) for d in (base_dir, head_dir)}
    cached_step = {d: load_side(str(d)) for d in (base_dir, head_dir)}
    for d in (base_dir, head_dir):
        assert cached_step[d].scope == "step"
        assert state(cached_step[d]) == state(decoded_step[d])
        for kind in kinds:
            assert decoded[d][kind].steps, "the capture has per-step graphs to compare"
            assert state(cached[d][kind]) == state(decoded[d][kind])
    forward = comparison(decoded_step[base_dir], decoded_step[head_dir])
    backward = comparison(decoded_step[head_dir], decoded_step[base_dir])
    assert forward["regressions"], "a slower head has regressions to compare"
    for base_of, head_of in ((cached_step, cached_step), (decoded_step, cached_step),
                             (cached_step, decoded_step)):  # fmt: skip
        assert comparison(base_of[base_dir], head_of[head_dir]) == forward
        assert comparison(head_of[head_dir], base_of[base_dir]) == backward
    for kind in kinds:
        assert comparison(cached[base_dir][kind], cached[head_dir][kind]) == comparison(
            decoded[base_dir][kind], decoded[head_dir][kind]
        )


def test_a_cache_hit_decodes_nothing_and_a_miss_decodes_once(
    tmp_path: Path, decodes: list[Path]
) -> None:
    directory = session(tmp_path, "s1")
    load_side(str(directory))
    load_side(str(directory))
    load_sides(str(directory), ["device", "host"])
    assert decodes == [directory / CAPTURE]


def test_a_kind_not_in_the_cache_is_decoded_and_added(tmp_path: Path, decodes: list[Path]) -> None:
    directory = session(tmp_path, "s1")
    load_side(str(directory), "host")
    device = load_side(str(directory), "device")
    assert len(decodes) == 2
    assert state(load_side(str(directory), "device")) == state(device)
    load_side(str(directory), "host")
    assert len(decodes) == 2  # both kinds are in the cache now


def test_a_capture_without_device_work_caches_its_error_and_host_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[Path]
) -> None:
    directory = tmp_path / "plugins" / "profile" / "cpu"
    directory.mkdir(parents=True)
    (directory / "session.json").write_text("{}", encoding="utf-8")
    space = xplane_pb2.XSpace()
    host = PlaneBuilder(space, "/host:CPU")
    line = host.line("python", line_id=7)
    for step in range(6):
        host.event(line, "train", step * 1000, 800 + 10 * step, step_num=step)
        host.event(line, "load_batch", step * 1000 + 800, 150)
    (directory / CAPTURE).write_bytes(space.SerializeToString())
    decoded = load_side(str(directory))
    with pytest.raises(Exception) as first:
        load_side(str(directory), "device")
    # The step view's device read fails, then the default read: twice, as without a cache.
    assert decodes == [directory / CAPTURE] * 2

    no_decoding(monkeypatch)
    assert state(load_side(str(directory))) == state(decoded)
    with pytest.raises(type(first.value)) as again:
        load_side(str(directory), "device")
    assert str(again.value) == str(first.value)


def test_a_changed_capture_makes_its_cache_stale(tmp_path: Path, decodes: list[Path]) -> None:
    directory = session(tmp_path, "s1")
    old = state(load_side(str(directory)))
    write_tpu_capture(directory / CAPTURE, **SHAPE, slowdown=2.0)
    new = state(load_side(str(directory)))
    assert new != old
    assert len(decodes) == 2
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / CAPTURE).write_bytes((directory / CAPTURE).read_bytes())
    where = {"spec": "", "files": [], "source": ""}  # the same content, elsewhere
    assert {**state(load_side(str(fresh))), **where} == {**new, **where}
    load_side(str(directory))
    assert len(decodes) == 3  # the cache was rewritten for the new content


def test_a_copied_session_keeps_its_cache(tmp_path: Path, decodes: list[Path]) -> None:
    directory = session(tmp_path, "s1")
    load_side(str(directory))
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (CAPTURE, CAPTURE + side_cache.SUFFIX):
        (copy / name).write_bytes((directory / name).read_bytes())
    load_side(str(copy / CAPTURE))
    assert len(decodes) == 1


def rewrite_cache(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(gzip.decompress(path.read_bytes()))
    change(document)
    path.write_bytes(gzip.compress(json.dumps(document).encode()))


@pytest.mark.parametrize("version", [0, side_cache.VERSION + 1, "1", None])
def test_another_version_is_ignored_and_rewritten(
    tmp_path: Path, decodes: list[Path], version: object
) -> None:
    directory = session(tmp_path, "s1")
    decoded = state(load_side(str(directory)))
    cache = side_cache.cache_path(directory / CAPTURE)
    rewrite_cache(cache, lambda d: d.update(version=version))
    assert state(load_side(str(directory))) == decoded
    assert len(decodes) == 2
    assert json.loads(gzip.decompress(cache.read_bytes()))["version"] == side_cache.VERSION


def test_a_cache_of_another_capture_is_ignored(tmp_path: Path, decodes: list[Path]) -> None:
    mine = session(tmp_path, "mine")
    other = session(tmp_path, "other", slowdown=1.5)
    decoded = state(load_side(str(mine)))
    load_side(str(other))
    # The other capture's cache planted as this capture's: its numbers are not ours.
    planted = side_cache.cache_path(other / CAPTURE).read_bytes()
    side_cache.cache_path(mine / CAPTURE).write_bytes(planted)
    assert state(load_side(str(mine))) == decoded
    assert len(decodes) == 3


def _hostile(kind: str, cache: Path, valid: bytes, tmp_path: Path) -> None:
    cache.unlink()
    if kind == "huge":
        with cache.open("wb") as out:  # sparse: larger than the bound, nothing stored
            out.truncate(side_cache.MAX_FILE_BYTES + 1)
    elif kind == "bomb":  # a few KiB that inflate beyond the bound
        inflated = side_cache.MAX_JSON_BYTES + (1 << 20)
        cache.write_bytes(gzip.compress(b" " * inflated, compresslevel=9))
    elif kind == "truncated":
        cache.write_bytes(valid[: len(valid) // 2])
    elif kind == "garbage":
        cache.write_bytes(os.urandom(4096))
    elif kind == "not_json":
        cache.write_bytes(gzip.compress(b'{"format": "mlprof-sides", '))
    elif kind == "deep":
        cache.write_bytes(gzip.compress(b"[" * 200_000 + b"]" * 200_000))
    elif kind == "fifo":
        os.mkfifo(cache)
    elif kind == "directory":
        cache.mkdir()
    elif kind == "symlink":  # a valid cache, but through a link: not read
        elsewhere = tmp_path / "elsewhere.sides.json.gz"
        elsewhere.write_bytes(valid)
        cache.symlink_to(elsewhere)
    else:
        document = json.loads(gzip.decompress(valid))
        read = document["reads"]["device"]
        if kind == "frame_out_of_range":
            read["whole"]["nodes"][3] = len(document["frames"])
        elif kind == "parent_later":
            document["frames"][4] = len(document["frames"]) // 4 - 1
        elif kind == "string_out_of_range":
            read["whole"]["attrs"][0] = 10**9
        elif kind == "repeated_node":
            read["whole"]["nodes"][6:9] = read["whole"]["nodes"][3:6]
        elif kind == "wrong_types":
            read["steps"] = [{"attrs": "x"}]
        elif kind == "too_many_nodes":
            read["steps"] = [read["whole"]] * side_cache.MAX_NODES
        cache.write_bytes(gzip.compress(json.dumps(document).encode()))


HOSTILE = ["huge", "bomb", "truncated", "garbage", "not_json", "deep", "fifo", "directory",
           "symlink", "frame_out_of_range", "parent_later", "string_out_of_range",
           "repeated_node", "wrong_types", "too_many_nodes"]  # fmt: skip


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_cache_is_ignored_without_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[Path], kind: str
) -> None:
    if kind == "bomb":
        monkeypatch.setattr(side_cache, "MAX_JSON_BYTES", 4 << 20)
    directory = session(tmp_path, "s1")
    capture = directory / CAPTURE
    decoded = state(load_side(str(directory)))
    cache = side_cache.cache_path(capture)
    valid = cache.read_bytes()
    if kind == "too_many_nodes":  # a bound just above what the valid file holds
        document = json.loads(gzip.decompress(valid))
        reads = document["reads"].values()
        graphs = [g for r in reads for g in (r["whole"], *r["steps"])]
        held = len(document["frames"]) // 4 + sum(len(g["nodes"]) // 3 for g in graphs)
        monkeypatch.setattr(side_cache, "MAX_NODES", held + 10)
    _hostile(kind, cache, valid, tmp_path)
    print_ = side_cache.fingerprint(capture)
    assert print_ is not None
    assert side_cache.load(capture, print_) is None
    assert state(load_side(str(directory))) == decoded
    assert len(decodes) == 2
    if kind == "directory":
        return  # a directory under the cache's name is left alone: only slower
    assert not cache.is_symlink()
    assert side_cache.load(capture, print_) is not None  # rewritten, now valid
    if kind == "symlink":
        assert (tmp_path / "elsewhere.sides.json.gz").read_bytes() == valid  # untouched


def test_a_valid_cache_loads(tmp_path: Path) -> None:
    """The hostile cases above are refused for what they are: the unchanged file loads."""
    directory = session(tmp_path, "s1")
    load_side(str(directory))
    capture = directory / CAPTURE
    print_ = side_cache.fingerprint(capture)
    assert print_ is not None
    found = side_cache.load(capture, print_)
    assert found is not None
    reads, names = found
    assert set(reads) == {"device", "host"}
    assert names


def test_no_cache_is_written_beside_a_capture_outside_a_session(
    tmp_path: Path, decodes: list[Path]
) -> None:
    directory = session(tmp_path, "s1")
    plain = tmp_path / "mine"
    plain.mkdir()
    (plain / CAPTURE).write_bytes((directory / CAPTURE).read_bytes())
    (plain / "session.json").write_text("{}", encoding="utf-8")  # not in the store layout
    load_side(str(plain))
    load_side(str(plain / CAPTURE))
    assert sorted(p.name for p in plain.iterdir()) == sorted([CAPTURE, "session.json"])
    assert len(decodes) == 2
    assert side_cache.writable(directory / CAPTURE)
    assert not side_cache.writable(plain / CAPTURE)


def test_a_linked_capture_is_neither_cached_nor_read_from_a_cache(
    tmp_path: Path, decodes: list[Path]
) -> None:
    directory = session(tmp_path, "s1")
    real = tmp_path / "real.xplane.pb"
    (directory / CAPTURE).rename(real)
    (directory / CAPTURE).symlink_to(real)
    load_side(str(directory / CAPTURE))
    load_side(str(directory / CAPTURE))
    assert not side_cache.cache_path(directory / CAPTURE).exists()
    assert len(decodes) == 2
