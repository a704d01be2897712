"""Host CPU profiles from a real JAX workload's pyroscope-io agent, direct and via the sidecar.

Two workloads run at once (``host_profile_workload.py``, ``sdk.run(host_profiling=…)``):
one reaches the Pyroscope test receiver itself (``MLPROF_PYROSCOPE_URL`` in its
environment), the other has no Pyroscope and finds the sidecar's ingest address in the
shared dir. Each has a unique workload name (the agent's ``service_name``); the tests
poll until its known functions show under the right ``phase`` and fail at once if the
workload exits first.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from exporter import schema
from exporter.profiles.pprof import from_pprof
from tests.harness import Proc, free_port, wait_http, wait_until
from tests.pyroscope_receiver import PyroscopeReceiver, ReceivedSeries

pytestmark = pytest.mark.integration

T = TypeVar("T")
WORKLOAD = "tests/integration/host_profile_workload.py"
# Long enough for a few 1 s uploads; the workload routed through the sidecar starts with
# it, looks for its address every second, and must still be stepping once it is found.
DIRECT_SECONDS, VIA_SIDECAR_SECONDS = "6", "12"


@dataclass
class Workload:
    name: str
    proc: Proc
    run_id: str = ""


@dataclass
class Stack:
    receiver: PyroscopeReceiver
    sidecar_url: str
    shared: Path
    direct: Workload
    via_sidecar: Workload


def _start_workload(name: str, shared: Path, log: Path, env: dict[str, str], *extra: str) -> Proc:
    args = [WORKLOAD, "--name", name, "--shared-dir", str(shared)]
    return Proc.python([*args, *extra], log, env=env)


def _run_id(workload: Workload) -> str:
    def ready() -> str | None:
        found = re.search(r"^ready (\S+)$", workload.proc.output(), re.MULTILINE)
        if found is None and not workload.proc.alive():
            pytest.fail(f"{workload.name} exited first:\n{workload.proc.output()}")
        return found.group(1) if found else None

    return wait_until(ready, timeout=90, what=f"{workload.name} to start its run")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("hostprof")
    port = free_port()
    shared = tmp / "shared"
    tag = secrets.token_hex(3)  # a unique service_name per test run
    with PyroscopeReceiver() as receiver:
        sidecar = Proc.python(
            ["-m", "exporter.cli", "serve"],
            tmp / "sidecar.log",
            env={
                "MLPROF_LISTEN": f"127.0.0.1:{port}",
                "MLPROF_SHARED_DIR": str(shared),
                "MLPROF_STORE": str(tmp / "store"),
                "MLPROF_SPOOL_DIR": str(tmp / "spool"),
                "MLPROF_PYROSCOPE_URL": receiver.url,
                "MLPROF_SOURCES": "jax",
            },
        )
        url = f"http://127.0.0.1:{port}"
        no_pyroscope = {"MLPROF_PYROSCOPE_URL": "", "MLPROF_HOST_PROFILING_URL": ""}
        direct = Workload(
            f"hostprof-direct-{tag}",
            _start_workload(
                f"hostprof-direct-{tag}",
                tmp / "direct-shared",
                tmp / "direct.log",
                {**no_pyroscope, "MLPROF_PYROSCOPE_URL": receiver.url},
                "--fork-child",
                "--seconds",
                DIRECT_SECONDS,
            ),
        )
        # Started with the sidecar, not after it: it must find the sidecar once it is up.
        via = Workload(
            f"hostprof-sidecar-{tag}",
            _start_workload(
                f"hostprof-sidecar-{tag}",
                shared,
                tmp / "via.log",
                no_pyroscope,
                "--seconds",
                VIA_SIDECAR_SECONDS,
            ),
        )
        try:
            wait_http(f"{url}/healthz", timeout=60)
            try:
                direct.run_id = _run_id(direct)
                via.run_id = _run_id(via)
                yield Stack(receiver, url, shared, direct, via)
            finally:
                via.proc.stop()
        finally:
            direct.proc.stop()
            code = sidecar.stop()
            log = sidecar.log.read_text(errors="replace")
            assert "Traceback" not in log, log
            assert code in (0, -15), log


def _poll(what: str, workload: Workload, found: Callable[[], T | None], timeout: float = 60) -> T:
    """``found()`` until it returns something; fail at once if the workload failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        code = workload.proc.popen.poll()
        if code not in (None, 0):
            pytest.fail(f"{workload.name} exited {code} before {what}:\n{workload.proc.output()}")
        time.sleep(0.2)
    pytest.fail(f"no {what} from {workload.name} after {timeout}s:\n{workload.proc.output()}")


def _series_of(receiver: PyroscopeReceiver, workload: Workload) -> list[ReceivedSeries]:
    return [s for s in list(receiver.received) if s.labels.get("run_id") == workload.run_id]


def _frames(folded: dict[str, int]) -> dict[str, int]:
    """Each frame name -> samples (ns) of the stacks it appears in."""
    out: dict[str, int] = {}
    for stack, value in folded.items():
        for frame in set(stack.split(";")):
            out[frame] = out.get(frame, 0) + value
    return out


def _phase_frames(series: list[ReceivedSeries], phase: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for one in series:
        for frame, value in _frames(one.folded_where(phase=phase)).items():
            out[frame] = out.get(frame, 0) + value
    return out


def _wait_for_phases(stack: Stack, workload: Workload) -> list[ReceivedSeries]:
    def both_phases() -> list[ReceivedSeries] | None:
        series = _series_of(stack.receiver, workload)
        data, step = _phase_frames(series, "data"), _phase_frames(series, "step")
        return series if "prepare_batch" in data and "step_bookkeeping" in step else None

    return _poll("prepare_batch under phase=data and step_bookkeeping under phase=step",
                 workload, both_phases)  # fmt: skip


def _check_labels(series: list[ReceivedSeries], workload: Workload) -> None:
    for one in series:
        assert {k: one.labels.get(k) for k in ("__name__", "service_name", "run_id", "host",
                                               "trigger", "profile_source")} == {
            "__name__": schema.HOST_PROFILE_NAME,
            "service_name": workload.name,
            "run_id": workload.run_id,
            "host": one.labels["host"],
            "trigger": "periodic",
            "profile_source": schema.HOST_PROFILE_SOURCE,
        }  # fmt: skip
        assert one.sample_types == [("cpu", "nanoseconds")]


def test_direct_to_pyroscope_carries_run_labels_and_phases(stack: Stack) -> None:
    series = _wait_for_phases(stack, stack.direct)
    _check_labels(series, stack.direct)
    # The agent itself pushed: its user agent, not the sidecar's.
    assert all(s.headers["user-agent"].startswith("pyroscope-rs/pyspy/") for s in series)
    # Data-phase work is never labelled step, and the reverse.
    assert "prepare_batch" not in _phase_frames(series, "step")
    assert "step_bookkeeping" not in _phase_frames(series, "data")


def test_forked_child_is_profiled_under_the_runs_labels(stack: Stack) -> None:
    def child_work_pids() -> set[str] | None:
        pids = set()
        for one in _series_of(stack.receiver, stack.direct):
            table = one.profile.string_table
            names = {f.id: table[f.name] for f in one.profile.function}
            locations = {
                loc.id: {names[line.function_id] for line in loc.line}
                for loc in one.profile.location
            }
            for sample in one.profile.sample:
                stack_names = set().union(*(locations[i] for i in sample.location_id))
                if "child_work" in stack_names:
                    pids.add(one.sample_labels(sample).get("pid", ""))
        return pids or None

    pids = _poll("samples of the forked child's child_work", stack.direct, child_work_pids)
    parent = str(stack.direct.proc.pid)
    assert pids and parent not in pids and "" not in pids


def test_via_sidecar_forwards_the_agents_profiles(stack: Stack) -> None:
    advertised = json.loads((stack.shared / schema.SIDECAR_DIR / schema.INGEST_FILE).read_text())
    assert advertised["url"] == stack.sidecar_url
    series = _wait_for_phases(stack, stack.via_sidecar)
    _check_labels(series, stack.via_sidecar)
    # The sidecar pushed them (its sink's user agent), with the agent's labels untouched.
    assert all(s.headers["user-agent"] == "mlprof-exporter" for s in series)
    assert "(sidecar)" in stack.via_sidecar.proc.output()  # the SDK says where it pushes
    assert all(s.labels["otel.scope.name"] == "com.grafana.pyroscope/python" for s in series)
    metrics = httpx.get(f"{stack.sidecar_url}/metrics", timeout=10).text
    ok = r'mlprof_profile_pushes_total\{sink="pyroscope",status="ok"\} (\S+)'
    pushed = re.search(ok, metrics)
    assert pushed and float(pushed.group(1)) >= len(series)


def test_pushed_profile_is_a_pprof_the_project_reads(stack: Stack) -> None:
    """What reaches Pyroscope folds into a FlameGraph (``mlprof compare --kind host``)."""
    series = _wait_for_phases(stack, stack.via_sidecar)
    for one in series:
        graph = from_pprof(one.profile, profile_name=one.labels["__name__"])
        graph.check()
        assert (graph.sample_type, graph.unit) == ("cpu", "nanoseconds")
        assert graph.root.total == sum(s.value[0] for s in one.profile.sample)
    merged = from_pprof(series[0].profile)
    for one in series[1:]:
        merged.merge(from_pprof(one.profile))
    found = [node for _, node in merged.paths() if node.name == "prepare_batch"]
    assert found and found[0].file.endswith("host_profile_workload.py")
    assert sum(node.total for node in found) > 0
