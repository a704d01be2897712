"""`mlprof serve` with Pyroscope set: memory profiles in the shared dir are pushed,
the API asks the workload for one, and the push metrics are exported."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter import schema
from exporter.proto import profile_pb2
from tests import torch_snapshots as ts
from tests.harness import Proc, free_port, wait_http, wait_until
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.integration


def _memory_pprof(bytes_per_buffer: list[int]) -> bytes:
    """A device-memory pprof shaped like jax.profiler.device_memory_profile()'s."""
    strings = ["", "allocations", "count", "space", "bytes", "kind", "buffer", "device",
               "tpu:0", "train_step", "train.py", "init_params"]  # fmt: skip
    profile = profile_pb2.Profile(string_table=strings)
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    profile.function.add(id=1, name=9, system_name=9, filename=10)
    profile.function.add(id=2, name=11, system_name=11, filename=10)
    profile.location.add(id=1, line=[profile_pb2.Line(function_id=1, line=12)])
    profile.location.add(id=2, line=[profile_pb2.Line(function_id=2, line=30)])
    for size in bytes_per_buffer:
        sample = profile.sample.add(location_id=[2, 1], value=[1, size])
        sample.label.add(key=5, str=6)
        sample.label.add(key=7, str=8)
    return gzip.compress(profile.SerializeToString())


def _drop(shared: Path, stem: str, suffix: str, data: bytes, meta: dict[str, object]) -> None:
    """What the SDK writes: the identity first, then the profile or snapshot."""
    memory = shared / schema.MEMORY_DIR
    memory.mkdir(parents=True, exist_ok=True)
    (memory / f"{stem}{schema.MEMORY_META_SUFFIX}").write_text(json.dumps(meta))
    (memory / f"{stem}{suffix}").write_bytes(data)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[str, Path, PyroscopeReceiver]]:
    port = free_port()
    shared = tmp_path / "shared"
    with PyroscopeReceiver(legacy_names=True) as receiver:
        env = {
            "MLPROF_LISTEN": f"127.0.0.1:{port}",
            "MLPROF_SHARED_DIR": str(shared),
            "MLPROF_STORE": str(tmp_path / "store"),
            "MLPROF_SPOOL_DIR": str(tmp_path / "spool"),
            "MLPROF_PYROSCOPE_URL": receiver.url,
            "MLPROF_COLLECT_INTERVAL_S": "0.5",
            "MLPROF_SOURCES": "jax",
        }
        proc = Proc.python(["-m", "exporter.cli", "serve"], tmp_path / "sidecar.log", env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/healthz", timeout=60)
            yield url, shared, receiver
        finally:
            code = proc.stop()
            log = proc.log.read_text(errors="replace")
            assert "Traceback" not in log, log
            assert code in (0, -15), log


def test_memory_profiles_are_pushed_and_requested(
    sidecar: tuple[str, Path, PyroscopeReceiver],
) -> None:
    url, shared, receiver = sidecar
    meta = {"run_id": "run-9", "workload": "trainer", "host": "host-a", "pid": 123,
            "time": 1.7e9, "trigger": "periodic", "request_id": None}  # fmt: skip
    _drop(shared, "host-a-123-1700000000000-1", schema.MEMORY_PROFILE_SUFFIX,
          _memory_pprof([4096, 1024]), meta)  # fmt: skip

    (series,) = receiver.wait_for(1, timeout=30)
    assert series.labels == {
        "__name__": "memory",
        "service_name": "trainer",
        "run_id": "run-9",
        "host": "host-a",
        "trigger": "periodic",
        "profile_source": "device_memory",
    }
    # One pprof, both sample types: live allocations (count) and live bytes.
    assert series.sample_types == [("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert series.folded(1) == {"tpu:0;train_step;init_params": 5120}
    assert series.folded(0) == {"tpu:0;train_step;init_params": 2}

    response = httpx.post(f"{url}/api/v1/memory-profiles", timeout=10)
    assert response.status_code == 202
    request_id = response.json()["request_id"]
    request_file = (
        shared / schema.REQUESTS_DIR
        / f"{schema.MEMORY_PROFILE_REQUEST_PREFIX}{request_id}{schema.REQUEST_SUFFIX}"
    )  # fmt: skip
    assert json.loads(request_file.read_text())["id"] == request_id
    status = httpx.get(url + response.json()["status_url"], timeout=10).json()
    assert status == {"request_id": request_id, "state": "pending", "profiles": []}

    def pushed() -> str | None:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        ok = 'mlprof_profile_pushes_total{sink="pyroscope",status="ok"} 1.0'
        return text if ok in text else None

    metrics = wait_until(pushed, timeout=30, what="the push counter on /metrics")
    assert 'mlprof_spool_size_bytes{sink="pyroscope"} 0.0' in metrics


def test_torch_memory_snapshots_are_pushed_like_profiles(
    sidecar: tuple[str, Path, PyroscopeReceiver],
) -> None:
    """A PyTorch CUDA allocator snapshot in memory/ becomes a memory flame graph of its
    live blocks (the inactive one is cache), labelled as a JAX profile would be."""
    _, shared, receiver = sidecar
    forward = ts.frame("forward", "/job/model.py", 22)
    snapshot = ts.snapshot([ts.segment([
        ts.block(4096, ts.OPT_STACK), ts.block(1024, [forward, *ts.OPT_STACK[1:]]),
        ts.block(2048, ts.OPT_STACK, state="inactive"),
    ], device=1)])  # fmt: skip
    meta = {"run_id": "run-t", "workload": "torch-job", "host": "gpu-a", "pid": 77,
            "time": 1.7e9, "trigger": "programmatic", "request_id": None}  # fmt: skip
    _drop(shared, "gpu-a-77-1700000000000-1", schema.MEMORY_SNAPSHOT_SUFFIX,
          pickle.dumps(snapshot), meta)  # fmt: skip

    (series,) = receiver.wait_for(1, timeout=30)
    assert series.labels == {
        "__name__": "memory",
        "service_name": "torch-job",
        "run_id": "run-t",
        "host": "gpu-a",
        "trigger": "programmatic",
        "profile_source": "device_memory",
    }
    table = series.profile.string_table
    types = [table[t.type] for t in series.profile.sample_type]
    assert types == ["inuse_objects", "inuse_space"]
    assert series.folded(1) == {
        "cuda:1;<module>;train;train_step;step": 4096,
        "cuda:1;<module>;train;train_step;forward": 1024,
    }
    assert series.folded(0) == {  # live blocks per stack
        "cuda:1;<module>;train;train_step;step": 1,
        "cuda:1;<module>;train;train_step;forward": 1,
    }


def test_pyroscope_down_then_up_loses_nothing(tmp_path: Path) -> None:
    """Profiles made while Pyroscope is down are spooled, survive a sidecar restart,
    and arrive once it is back."""
    pyroscope_port, port = free_port(), free_port()
    shared = tmp_path / "shared"
    env = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(shared),
        "MLPROF_STORE": str(tmp_path / "store"),
        "MLPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "MLPROF_PYROSCOPE_URL": f"http://127.0.0.1:{pyroscope_port}",
        "MLPROF_COLLECT_INTERVAL_S": "0.5",
        "MLPROF_SOURCES": "jax",
    }
    url = f"http://127.0.0.1:{port}"
    memory = shared / schema.MEMORY_DIR
    memory.mkdir(parents=True)
    sizes = [1000, 2000, 3000]
    for i, size in enumerate(sizes):
        stem = f"host-a-1-{i}-{i}"
        meta = {"run_id": "r", "workload": "w", "host": "host-a", "trigger": "periodic"}
        (memory / f"{stem}{schema.MEMORY_META_SUFFIX}").write_text(json.dumps(meta))
        (memory / f"{stem}{schema.MEMORY_PROFILE_SUFFIX}").write_bytes(_memory_pprof([size]))

    first = Proc.python(["-m", "exporter.cli", "serve"], tmp_path / "first.log", env=env)
    try:
        wait_http(f"{url}/healthz", timeout=60)

        def spooled() -> bool:
            text = httpx.get(f"{url}/metrics", timeout=10).text
            return 'mlprof_profile_pushes_total{sink="pyroscope",status="spooled"} 3.0' in text

        wait_until(spooled, timeout=60, what="three spooled profiles")
    finally:
        first.stop()
    assert len(list((tmp_path / "spool").glob("*.spool"))) == 3

    with PyroscopeReceiver(port=pyroscope_port, legacy_names=True) as receiver:
        second = Proc.python(["-m", "exporter.cli", "serve"], tmp_path / "second.log", env=env)
        try:
            receiver.wait_for(3, timeout=60)
        finally:
            second.stop()
        received = list(receiver.received)
    # Exactly the three: the restarted sidecar remembered it had converted them already.
    assert sorted(sum(s.folded(1).values()) for s in received) == sizes
    assert not list((tmp_path / "spool").glob("*.spool"))


def test_memory_profile_command_on_a_bad_shared_dir_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "memory-profile", "--shared-dir", "/proc/x",
         "--wait", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "mlprof: shared dir /proc/x: cannot write a memory-profile request in "
        "/proc/x/requests (No such file or directory)"
    ]
