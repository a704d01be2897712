"""The SDK's host-profiling options, destination lookup and phase tags (no agent started).

The agent itself runs in tests/integration/test_host_profiling.py; here the tag calls
are recorded to check the order a nested phase produces.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exporter import schema, sdk
from exporter.sdk.host_profile import (
    HostProfiler,
    HostProfiling,
    check_phase,
    find_destination,
    options_from_env,
)
from exporter.sdk.run import _TaggedStep


def test_off_unless_asked() -> None:
    assert options_from_env(None, {}) is None
    assert options_from_env(None, {"MLPROF_HOST_PROFILING": "0"}) is None
    assert options_from_env(False, {"MLPROF_HOST_PROFILING": "1"}) is None
    assert options_from_env(True, {}) == HostProfiling()
    assert options_from_env(None, {"MLPROF_HOST_PROFILING": "on"}) == HostProfiling()


def test_options_from_the_environment() -> None:
    env = {
        "MLPROF_HOST_PROFILING": "1",
        "MLPROF_HOST_PROFILING_SAMPLE_RATE": "250",
        "MLPROF_HOST_PROFILING_ONCPU": "false",
        "MLPROF_HOST_PROFILING_GIL_ONLY": "0",
        "MLPROF_HOST_PROFILING_SUBPROCESSES": "yes",
        "MLPROF_HOST_PROFILING_UPLOAD_INTERVAL_S": "5",
        "MLPROF_HOST_PROFILING_URL": "http://pyroscope:4040/",
    }
    assert options_from_env(None, env) == HostProfiling(
        sample_rate=250,
        oncpu=False,
        gil_only=False,
        subprocesses=True,
        upload_interval_s=5,
        server_address="http://pyroscope:4040",
    )


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("MLPROF_HOST_PROFILING", "maybe", "expected 1/true/on or 0/false/off"),
        ("MLPROF_HOST_PROFILING_SAMPLE_RATE", "fast", "expected a whole number"),
        ("MLPROF_HOST_PROFILING_SAMPLE_RATE", "5000", "expected 1..1000"),
        ("MLPROF_HOST_PROFILING_UPLOAD_INTERVAL_S", "0", "expected 1..60"),
        ("MLPROF_HOST_PROFILING_URL", "pyroscope:4040", "expected an http:// or https:// URL"),
    ],
)
def test_a_bad_variable_turns_profiling_off_with_a_message(
    name: str, value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert options_from_env(None, {"MLPROF_HOST_PROFILING": "1", name: value}) is None
    err = capsys.readouterr().err
    assert words in err and "host profiling is off" in err


def _write_ingest(shared: Path, url: str) -> None:
    path = shared / schema.SIDECAR_DIR / schema.INGEST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"url": url, "pid": 1, "time": 0}))


def test_destination_order(tmp_path: Path) -> None:
    options = HostProfiling()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        direct = f"http://127.0.0.1:{listening.getsockname()[1]}"
        env = {"MLPROF_PYROSCOPE_URL": direct + "/", "MLPROF_PYROSCOPE_USER": "u",
               "MLPROF_PYROSCOPE_PASSWORD": "p", "MLPROF_PYROSCOPE_TENANT": "t"}  # fmt: skip
        _write_ingest(tmp_path, "http://127.0.0.1:9464")
        found = find_destination(options, tmp_path, env)
        assert found is not None
        assert (found.url, found.via, found.basic_auth, found.tenant) == (
            direct, "pyroscope", ("u", "p"), "t"
        )  # fmt: skip
        configured = HostProfiling(server_address="http://elsewhere:4040")
        chosen = find_destination(configured, tmp_path, env)
        assert chosen is not None and chosen.via == "configured"
    # Pyroscope unreachable from the workload: the sidecar, with the API token when set.
    sidecar = find_destination(options, tmp_path, {**env, "MLPROF_AUTH_TOKEN": "tok\n"})
    assert sidecar is not None
    assert (sidecar.url, sidecar.via, sidecar.headers) == (
        "http://127.0.0.1:9464", "sidecar", {"Authorization": "Bearer tok"}
    )  # fmt: skip


def test_no_destination_until_the_sidecar_writes_its_file(tmp_path: Path) -> None:
    assert find_destination(HostProfiling(), tmp_path, {}) is None
    path = tmp_path / schema.SIDECAR_DIR / schema.INGEST_FILE
    path.parent.mkdir(parents=True)
    for bad in ("not json", '{"url": "file:///etc/passwd"}', "[1]"):
        path.write_text(bad)
        assert find_destination(HostProfiling(), tmp_path, {}) is None
    _write_ingest(tmp_path, "http://127.0.0.1:9500/")
    found = find_destination(HostProfiling(), tmp_path, {})
    assert found is not None and found.url == "http://127.0.0.1:9500"


class _Tags:
    """Records the agent's tag calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def add(self, key: str, value: str) -> bool:
        self.calls.append(("add", key, value))
        return True

    def remove(self, key: str, value: str) -> bool:
        self.calls.append(("remove", key, value))
        return True


def _profiler(tmp_path: Path) -> tuple[HostProfiler, _Tags]:
    profiler = HostProfiler(HostProfiling(), {"run_id": "r", "workload": "w", "host": "h"},
                            tmp_path, environ={})  # fmt: skip
    tags = _Tags()
    profiler._add, profiler._remove = tags.add, tags.remove
    return profiler, tags


def test_nested_phases_tag_only_the_innermost(tmp_path: Path) -> None:
    profiler, tags = _profiler(tmp_path)
    profiler.enter("step")
    profiler.enter("data")
    profiler.leave()
    profiler.leave()
    profiler.leave()  # one too many: nothing to undo
    assert tags.calls == [
        ("add", "phase", "step"),
        ("remove", "phase", "step"),
        ("add", "phase", "data"),
        ("remove", "phase", "data"),
        ("add", "phase", "step"),
        ("remove", "phase", "step"),
    ]


def test_step_and_phase_tag_around_the_timed_step(tmp_path: Path) -> None:
    with sdk.run("w", shared_dir=tmp_path) as run:
        profiler, tags = _profiler(tmp_path)
        run.host_profiler = profiler
        run._step_obj = _TaggedStep(run, profiler)
        with run.phase("data"):
            pass
        with pytest.raises(RuntimeError), run.step():
            raise RuntimeError("a failed step still clears its tag")
        with run.step():
            pass
    assert tags.calls == [
        ("add", "phase", "data"),
        ("remove", "phase", "data"),
        ("add", "phase", "step"),
        ("remove", "phase", "step"),
        ("add", "phase", "step"),
        ("remove", "phase", "step"),
    ]
    assert run.step_number == 1


def test_phase_without_host_profiling_is_a_checked_no_op(tmp_path: Path) -> None:
    with sdk.run("w", shared_dir=tmp_path) as run:
        with run.phase("data"), run.phase("data"):
            pass
        assert run.info()["host_profiling"] is None
        with pytest.raises(ValueError, match="phase 'a b'"):
            run.phase("a b")
        for n in range(31):
            run.phase(f"p{n}")
        with pytest.raises(ValueError, match="already has 32 phase names"):
            run.phase("one-too-many")
    assert check_phase("tokenize.v2") == "tokenize.v2"


def test_sdk_import_loads_no_agent() -> None:
    code = (
        "import sys, tempfile; from exporter import sdk\n"
        "with sdk.run('w', shared_dir=tempfile.mkdtemp()) as run:\n"
        "    with run.step(): pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyroscope', 'opentelemetry', 'fastapi', 'jax', 'google')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
