"""MemoryProfileWatcher: each profile once (across restarts), bad files recorded,
retention, and the request/answer contract with the SDK."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from exporter import schema
from exporter.errors import InputError
from exporter.pipeline.memory_watcher import (
    MEMORY_REQUEST_ID,
    MemoryProfileWatcher,
    answers_to,
    request_memory_profile,
)
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.memory import load_memory_profile
from exporter.proto import profile_pb2
from exporter.sinks.pyroscope import PyroscopeSink


def _pprof(size: int, device_str: int = 8, function_name: int = 5) -> bytes:
    """A device-memory pprof; the indexes let a test point past the string table."""
    profile = profile_pb2.Profile(
        string_table=["", "allocations", "count", "space", "bytes", "f", "a.py", "device", "tpu0"]
    )
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    profile.function.add(id=1, name=function_name, filename=6)
    profile.location.add(id=1, line=[profile_pb2.Line(function_id=1, line=3)])
    sample = profile.sample.add(location_id=[1], value=[1, size])
    sample.label.add(key=7, str=device_str)
    return gzip.compress(profile.SerializeToString())


def _write(shared: Path, stem: str, data: bytes, **meta: object) -> Path:
    directory = shared / schema.MEMORY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}{schema.MEMORY_META_SUFFIX}").write_text(json.dumps(meta))
    path = directory / f"{stem}{schema.MEMORY_PROFILE_SUFFIX}"
    path.write_bytes(data)
    return path


def test_each_profile_is_published_once_even_after_restart(tmp_path: Path) -> None:
    published: list[tuple[FlameGraph, dict[str, str]]] = []

    def publish(graph: FlameGraph, labels: dict[str, str]) -> str:
        published.append((graph, labels))
        return "ok"

    _write(tmp_path, "h-1-1-1", _pprof(100), run_id="r", workload="w", host="h",
           trigger="manual", time=1.7e9)  # fmt: skip
    watcher = MemoryProfileWatcher(tmp_path, publish)
    (result,) = watcher.poll()
    assert result.outcome == "ok" and result.graph is not None
    assert result.graph.root.total == 100
    assert result.graph.time_nanos == int(1.7e18)
    assert published[0][1] == {"service_name": "w", "run_id": "r", "host": "h",
                               "trigger": "manual", "profile_source": "device_memory"}  # fmt: skip
    assert watcher.poll() == []
    assert MemoryProfileWatcher(tmp_path, publish).poll() == []  # restart: remembered
    _write(tmp_path, "h-1-2-2", _pprof(7))
    (second,) = MemoryProfileWatcher(tmp_path, publish).poll()
    assert second.labels["service_name"] == "unknown_service"  # no identity file content
    assert len(published) == 2


def test_bad_profile_is_recorded_and_not_retried(tmp_path: Path) -> None:
    path = _write(tmp_path, "h-1-1-1", b"\x1f\x8bnot really gzip")
    watcher = MemoryProfileWatcher(tmp_path, lambda g, labels: None)
    (result,) = watcher.poll()
    assert result.graph is None and str(path) in result.error
    assert watcher.errors == 1
    assert watcher.poll() == []


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(5):
        _write(tmp_path, f"h-1-{i}-{i}", _pprof(i + 1))
    watcher = MemoryProfileWatcher(tmp_path, None, keep=2)
    assert len(watcher.poll()) == 5
    left = sorted(p.name for p in (tmp_path / schema.MEMORY_DIR).iterdir())
    assert len(left) == 4  # two profiles, each with its identity file


def test_request_and_answers(tmp_path: Path) -> None:
    request_id = request_memory_profile(tmp_path)
    assert MEMORY_REQUEST_ID.match(request_id)
    name = f"{schema.MEMORY_PROFILE_REQUEST_PREFIX}{request_id}{schema.REQUEST_SUFFIX}"
    assert json.loads((tmp_path / schema.REQUESTS_DIR / name).read_text())["id"] == request_id
    assert answers_to(tmp_path, request_id) == []
    answer = _write(tmp_path, "h-1-1-1", _pprof(1), request_id=request_id)
    _write(tmp_path, "h-1-2-2", _pprof(1), request_id="other")
    assert answers_to(tmp_path, request_id) == [answer]


@pytest.mark.parametrize("corrupt", [{"device_str": 99}, {"function_name": 99}])
def test_string_index_past_the_table_is_an_input_error(
    tmp_path: Path, corrupt: dict[str, int]
) -> None:
    path = _write(tmp_path, "h-1-1-1", _pprof(5, **corrupt))
    with pytest.raises(InputError, match="corrupt pprof") as caught:
        load_memory_profile(path)
    assert str(path) in str(caught.value)


def test_bad_profiles_do_not_stop_the_pass_or_repeat_pushes(tmp_path: Path) -> None:
    """A corrupt file and a profile Pyroscope's label rules refuse, between good ones."""
    sink = PyroscopeSink("http://127.0.0.1:9")  # build_request validates; nothing is sent
    built: list[str] = []

    def publish(graph: FlameGraph, labels: dict[str, str]) -> str:
        sink.build_request(graph, labels)  # ValueError on a label value over 2048 chars
        built.append(labels["run_id"])
        return "ok"

    files = [
        _write(tmp_path, "h-1-1-1", _pprof(1), run_id="first"),
        _write(tmp_path, "h-1-2-2", _pprof(1, device_str=99), run_id="corrupt"),
        _write(tmp_path, "h-1-3-3", _pprof(1), run_id="x" * 3000),
        _write(tmp_path, "h-1-4-4", _pprof(1), run_id="last"),
    ]
    for age, path in enumerate(reversed(files)):
        os.utime(path, (1e9 - age, 1e9 - age))  # poll goes by mtime: keep the order above
    watcher = MemoryProfileWatcher(tmp_path, publish)
    results = watcher.poll()
    sink.close()
    assert [r.path for r in results] == files
    assert built == ["first", "last"]
    assert [bool(r.error) for r in results] == [False, True, True, False]
    assert "corrupt pprof" in results[1].error and "2048" in results[2].error
    assert watcher.errors == 2
    assert watcher.poll() == [] and MemoryProfileWatcher(tmp_path, publish).poll() == []
    assert built == ["first", "last"]  # nothing pushed twice


def test_unknown_trigger_from_the_workload_is_published_as_programmatic(tmp_path: Path) -> None:
    _write(tmp_path, "h-1-1-1", _pprof(3), trigger="nightly-job", run_id="r")
    published: list[dict[str, str]] = []
    (result,) = MemoryProfileWatcher(tmp_path, lambda g, labels: published.append(labels)).poll()
    assert not result.error
    assert published[0]["trigger"] == "programmatic" == result.labels["trigger"]


def test_request_in_a_dir_that_cannot_exist_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"shared dir /proc/mlprof-x: cannot write"):
        request_memory_profile(Path("/proc/mlprof-x"))


def test_a_link_out_of_the_shared_dir_is_not_followed(tmp_path: Path) -> None:
    """A workload must not make the sidecar read and push a file from elsewhere."""
    outside = tmp_path / "elsewhere.pprof.gz"
    outside.write_bytes(_pprof(4096))
    shared = tmp_path / "shared"
    link = _write(shared, "h-1-1-1", b"")
    link.unlink()
    link.symlink_to(outside)
    published: list[FlameGraph] = []
    (result,) = MemoryProfileWatcher(shared, lambda g, labels: published.append(g)).poll()
    assert result.graph is None and "symbolic link" in result.error
    assert published == []
    # The CLI, given the same path by its user, follows the link.
    assert load_memory_profile(link).root.total == 4096


def test_an_amplifying_profile_is_refused_in_the_child_and_not_retried(tmp_path: Path) -> None:
    # A location of 1,100 inlined lines under 1,100 roots (16 KB): 1.2M frames. The
    # watcher used to convert it in the sidecar's own process and save "processed" only
    # afterwards, so the OOM repeated at every start. Now: a child, refused in one line,
    # remembered as failed before and after.
    from tests.unit.test_memory import _amplifying_profile

    _write(tmp_path, "h-1-1-1", _amplifying_profile(1_100, 1_100), run_id="r", workload="w")
    published: list[FlameGraph] = []
    watcher = MemoryProfileWatcher(tmp_path, lambda g, labels: published.append(g))
    (result,) = watcher.poll()
    assert result.graph is None and published == []
    assert "expand to 1211100 frames" in result.error and "\n" not in result.error
    state = json.loads((tmp_path / schema.SIDECAR_DIR / "memory-profiles.json").read_text())
    assert state["processed"] == ["h-1-1-1.pprof.gz"]
    assert "1211100 frames" in state["failed"]["h-1-1-1.pprof.gz"]
    # After a restart it is neither converted nor published again.
    again = MemoryProfileWatcher(tmp_path, lambda g, labels: published.append(g))
    assert again.poll() == [] and published == []
    assert "1211100 frames" in again.failed["h-1-1-1.pprof.gz"]


def test_a_profile_whose_conversion_took_the_sidecar_down_is_not_retried(
    tmp_path: Path,
) -> None:
    # Processed is saved before converting: a conversion that never returns (the
    # sidecar killed during it) is on record as failed at the next start.
    _write(tmp_path, "h-1-1-1", _pprof(100), run_id="r", workload="w")

    class Killed(BaseException):
        pass

    def convert(path: Path, kind: str) -> FlameGraph:
        raise Killed  # what an OOM kill looks like from here: nothing after it runs

    watcher = MemoryProfileWatcher(tmp_path, None, convert=convert)
    with pytest.raises(Killed):
        watcher.poll()
    calls: list[Path] = []

    def count(path: Path, kind: str) -> FlameGraph:
        calls.append(path)
        return load_memory_profile(path)

    restarted = MemoryProfileWatcher(tmp_path, None, convert=count)
    assert restarted.poll() == [] and calls == []
    assert "did not finish" in restarted.failed["h-1-1-1.pprof.gz"]


def test_the_status_url_says_failed_with_the_reason(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from exporter.api.app import create_app
    from exporter.sidecar import Sidecar
    from tests.sidecar_app import settings_in
    from tests.unit.test_memory import _amplifying_profile

    settings = settings_in(tmp_path)
    sidecar = Sidecar(settings)
    request_id = "1700000000-0a1b2c3d"
    _write(settings.shared_dir, "h-1-1-1", _amplifying_profile(1_100, 1_100),
           request_id=request_id)  # fmt: skip
    sidecar.memory_profiles.poll()

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(sidecar))
        async with httpx.AsyncClient(
            transport=transport, base_url=f"http://{settings.listen}"
        ) as c:
            return await c.get(f"/api/v1/memory-profiles/{request_id}")

    body = asyncio.run(get()).json()
    assert body["state"] == "failed"  # it said "converted"
    assert "1211100 frames" in body["errors"]["h-1-1-1.pprof.gz"]


def _outside_profiles(outside: Path, count: int) -> list[Path]:
    """Profiles with identities in a directory outside the shared dir."""
    outside.mkdir()
    for i in range(count):
        (outside / f"h-1-{i}-{i}{schema.MEMORY_META_SUFFIX}").write_text(
            json.dumps({"run_id": "outside", "request_id": "1700000000-0a1b2c3d"})
        )
        (outside / f"h-1-{i}-{i}{schema.MEMORY_PROFILE_SUFFIX}").write_bytes(_pprof(4096))
    return sorted(outside.iterdir())


def test_a_memory_dir_linked_out_of_the_shared_dir_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # memory/ -> a directory elsewhere: its profiles were converted, pushed to Pyroscope,
    # and retention deleted the oldest through the link. Now: not listed, one log line.
    outside = tmp_path / "outside"
    before = _outside_profiles(outside, 3)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / schema.MEMORY_DIR).symlink_to(outside, target_is_directory=True)
    published: list[FlameGraph] = []
    converted: list[Path] = []

    def convert(path: Path, kind: str) -> FlameGraph:
        converted.append(path)
        return load_memory_profile(path)

    watcher = MemoryProfileWatcher(
        shared, lambda g, labels: published.append(g), keep=1, convert=convert
    )
    with caplog.at_level("WARNING", logger="exporter.pipeline.memory_watcher"):
        assert watcher.poll() == []
        assert watcher.poll() == []  # said once, not at every poll
    assert converted == [] and published == []
    assert sorted(outside.iterdir()) == before  # nothing deleted
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "symbolic link" in lines[0], lines
    assert answers_to(shared, "1700000000-0a1b2c3d") == []


@pytest.mark.parametrize("kind", ["memory", "torch"])
def test_a_memory_dir_swapped_for_a_link_before_conversion_is_not_followed(
    tmp_path: Path, kind: str
) -> None:
    # The watcher lists memory/, then the child converts the profile by its path: the
    # directory swapped for a link in between must not make the child read elsewhere.
    from tests import torch_snapshots as ts

    suffix = schema.MEMORY_PROFILE_SUFFIX if kind == "memory" else schema.MEMORY_SNAPSHOT_SUFFIX
    name = f"h-1-1-1{suffix}"
    shared, outside = tmp_path / "shared", tmp_path / "outside"
    outside.mkdir()
    if kind == "memory":
        _write(shared, "h-1-1-1", _pprof(1))
        (outside / name).write_bytes(_pprof(4096))
    else:
        (shared / schema.MEMORY_DIR).mkdir(parents=True)
        ts.write(shared / schema.MEMORY_DIR / name, ts.random_snapshot(1, blocks=3))
        ts.write(outside / name, ts.random_snapshot(2, blocks=30))
    published: list[FlameGraph] = []
    watcher = MemoryProfileWatcher(shared, lambda g, labels: published.append(g))

    def swap_then_convert(path: Path, kind: str) -> FlameGraph:
        (shared / schema.MEMORY_DIR).rename(shared / "memory-listed")
        (shared / schema.MEMORY_DIR).symlink_to(outside, target_is_directory=True)
        return watcher._convert_in_child(path, kind)

    watcher.convert = swap_then_convert
    (result,) = watcher.poll()
    assert result.graph is None and "symbolic link" in result.error, result.error
    assert published == []
    assert (outside / name).exists()


def test_a_planted_request_tmp_link_is_not_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # request_memory_profile wrote requests/.<name>.tmp with write_text, following a
    # link the workload planted there: the victim received the request.
    from exporter.pipeline import memory_watcher

    monkeypatch.setattr(memory_watcher.secrets, "token_hex", lambda n: "0a1b2c3d")
    monkeypatch.setattr(memory_watcher.time, "time", lambda: 1_700_000_000.0)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    requests = tmp_path / "shared" / schema.REQUESTS_DIR
    requests.mkdir(parents=True)
    name = f"{schema.MEMORY_PROFILE_REQUEST_PREFIX}1700000000-0a1b2c3d{schema.REQUEST_SUFFIX}"
    (requests / f".{name}.tmp").symlink_to(victim)
    assert request_memory_profile(tmp_path / "shared") == "1700000000-0a1b2c3d"
    assert victim.read_text() == "precious"
    assert not (requests / name).is_symlink()
    assert json.loads((requests / name).read_text())["id"] == "1700000000-0a1b2c3d"


def test_a_requests_dir_linked_out_of_the_shared_dir_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / schema.REQUESTS_DIR).symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match="symbolic link"):
        request_memory_profile(shared)
    assert list(outside.iterdir()) == []
    # Nor are old requests expired through the link.
    old = outside / f"{schema.MEMORY_PROFILE_REQUEST_PREFIX}x{schema.REQUEST_SUFFIX}"
    old.write_text("{}")
    os.utime(old, (1e9, 1e9))
    MemoryProfileWatcher(shared, None).poll()
    assert old.exists()
