"""Real JAX (CPU): a traced step -> host flame graph; device-memory profiles from the SDK
(on call, periodic, on request) -> memory flame graphs pushed to the test receiver."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.pipeline.memory_watcher import (
    MemoryProfileWatcher,
    answers_to,
    request_memory_profile,
)
from exporter.profiles.convert import flamegraph_from_path
from exporter.profiles.memory import in_use_bytes, memory_flamegraph
from exporter.profiles.pprof import decode_pprof
from exporter.profiles.steps import step_windows, windowed_flamegraphs
from exporter.profiles.xplane import host_flamegraph, load_capture
from exporter.sinks.pyroscope import PyroscopeSink
from tests.harness import ROOT, Proc, wait_until
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.integration

WORKLOAD = ROOT / "tests" / "integration" / "jax_profile_workload.py"


@dataclass
class Workload:
    proc: Proc
    shared: Path
    logdir: Path
    first_profile: Path
    live_bytes: int


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workload]:
    base = tmp_path_factory.mktemp("jax")
    shared, logdir, stop = base / "shared", base / "logs", base / "stop"
    proc = Proc.python(
        [str(WORKLOAD), str(shared), str(logdir), str(stop)],
        base / "workload.log",
        env={"MLPROF_MEMORY_PROFILE_INTERVAL_S": "1", "PYTHONPATH": str(ROOT)},
    )
    try:
        line = wait_until(
            lambda: (
                next((x for x in proc.output().splitlines() if x.startswith("READY")), None)
                or (None if proc.alive() else pytest.fail(f"workload died:\n{proc.output()}"))
            ),
            timeout=120,
            what="the JAX workload to write its capture",
        )
        _, path, live = line.split()
        yield Workload(proc, shared, logdir, Path(path), int(live))
    finally:
        stop.touch()
        proc.stop()


def test_host_flamegraph_of_a_real_cpu_capture(workload: Workload) -> None:
    (capture,) = workload.logdir.glob("plugins/profile/*/*.xplane.pb")
    graph = flamegraph_from_path(capture)  # a CPU capture: host time, no device planes
    assert (graph.sample_type, graph.unit) == ("wall", "nanoseconds")
    graph.check()  # every node: total == self + children
    for _, node in graph.paths():
        assert node.total == node.self_value + sum(c.total for c in node.children.values())
    paths = {tuple(f.name for f in (*a, n)) for a, n in graph.paths()}
    steps = [p for p in paths if p[-1] == "train" and "train_step" in p]
    assert steps, "the StepTraceAnnotation 'train' is not under train_step"
    assert any(p[-2:] == ("train", "forward") for p in paths), "Python frame forward missing"
    forward = next(n for a, n in graph.paths() if n.name == "forward")
    assert forward.file.endswith("jax_profile_workload.py") and forward.line > 0
    # The Python thread (named by the runtime, e.g. "python3") is a top frame.
    assert any(p[0].startswith("python") and "train_step" in p for p in steps)


def test_memory_flamegraph_root_is_in_use_bytes(workload: Workload) -> None:
    data = workload.first_profile.read_bytes()
    graph = memory_flamegraph(data, str(workload.first_profile))
    graph.check()
    assert graph.root.total == in_use_bytes(decode_pprof(data))
    assert graph.root.total == workload.live_bytes  # what jax.live_arrays() holds
    assert (graph.sample_type, graph.unit) == ("inuse_space", "bytes")
    names = {n.name for _, n in graph.paths()}
    assert {"cpu:0", "main", "__init__"} <= names  # device, then Python allocation sites


def test_memory_profiles_on_request_and_periodic_are_pushed(
    workload: Workload, tmp_path: Path
) -> None:
    request_id = request_memory_profile(workload.shared)
    answered = wait_until(
        lambda: answers_to(workload.shared, request_id), timeout=30, what="the SDK's answer"
    )
    assert len(answered) == 1
    wait_until(
        lambda: len(list((workload.shared / "memory").glob("*.pprof.gz"))) >= 3,
        timeout=30,
        what="a periodic memory profile",
    )
    with PyroscopeReceiver(legacy_names=True) as receiver:
        sink = PyroscopeSink(receiver.url)
        watcher = MemoryProfileWatcher(workload.shared, sink.push, tmp_path / "state.json")
        results = watcher.poll()
        assert results and all(r.error == "" for r in results)
        received = receiver.wait_for(len(results))
        triggers = {s.labels["trigger"] for s in received}
        assert {"programmatic", "manual", "periodic"} <= triggers
        series = received[0]
        assert series.labels["__name__"] == "memory"
        assert series.labels["profile_source"] == "device_memory"
        assert series.labels["service_name"] == "profile-test"
        assert series.labels["run_id"] == "run-jax"
        assert series.labels["host"] == "host-a"
        assert series.sample_types == [("inuse_objects", "count"), ("inuse_space", "bytes")]
        # Each pushed profile holds its file's live bytes and live allocations (the
        # workload's arrays can change between periodic profiles: compare per file).
        for result, pushed in zip(results, received, strict=True):
            profile = decode_pprof(result.path.read_bytes())
            assert sum(pushed.folded(1).values()) == in_use_bytes(profile)
            assert sum(pushed.folded(0).values()) == sum(s.value[0] for s in profile.sample)
        # Each profile is converted once, also across a sidecar restart.
        again = MemoryProfileWatcher(workload.shared, sink.push, tmp_path / "state.json")
        repeated = {r.path for r in again.poll()} & {r.path for r in results}
        assert not repeated
        sink.close()


def test_cli_converts_real_captures(workload: Workload, tmp_path: Path) -> None:
    out = tmp_path / "host.folded"
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "flamegraph", str(workload.logdir),
         "--kind", "host", "-o", str(out)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert any(";train;forward" in line for line in out.read_text().splitlines())


def test_steps_of_a_real_cpu_capture_come_from_step_annotations(workload: Workload) -> None:
    (path,) = workload.logdir.glob("plugins/profile/*/*.xplane.pb")
    with load_capture(path) as capture:
        windows, source = step_windows(capture)
        assert source == "host_step_annotations"
        assert [w.step for w in windows] == [1, 2, 3]  # StepTraceAnnotation step_num
        start, duration = capture.time_range()
        assert start <= windows[0].start_ns and windows[-1].end_ns <= start + duration
        per_step = windowed_flamegraphs(capture, "host", windows)
        host = host_flamegraph(capture)
    assert host is not None
    for window, graph in zip(windows, per_step, strict=True):
        graph.check()
        # The annotation spans its window: its frame holds the whole window (to 1 ns).
        train = sum(n.total for _, n in graph.paths() if n.name == "train")
        assert abs(train - (window.end_ns - window.start_ns)) <= 1
        assert any(n.name == "forward" for _, n in graph.paths())
    assert sum(g.root.total for g in per_step) < host.root.total
