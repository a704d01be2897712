"""The sandbox: real bounded children, and the memory budget they share.

Every child here is a real interpreter started by :func:`exporter.sandbox.run_python`;
the budget is observed through its own record and metrics, never through timing.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from exporter import sandbox
from exporter.config import load_settings
from exporter.pipeline.job import run_job
from exporter.sandbox import ChildResult, MemoryBudget, default_memory_limit_mb, run_python

# Long enough for an interpreter to start on a machine with both cores busy: a deadline
# these tests never mean to reach.
SLOW_S = 120.0
# A child that waits until its FIFO (argv[1]) is written: it holds its reservation as long
# as the test wants, with no sleep and no clock.
HOLD = "import sys; open(sys.argv[1]).read()"


def _metrics(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    attributes = point.attributes or {}
                    key = tuple(sorted((k, str(v)) for k, v in attributes.items()))
                    out[(metric.name, key)] = cast(Any, point).value  # sums and gauges
    return out


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "hold"
    os.mkfifo(path)
    return path


_released: set[Path] = set()


def _release(path: Path) -> None:
    """Let the child held on ``path`` end (once: a second writer would wait forever)."""
    if path in _released:
        return
    _released.add(path)
    with path.open("w") as out:  # blocks until the held child opens it: then both go on
        out.write("go")


def _until(predicate: object, what: str) -> None:
    """Wait (on the budget's own condition) until ``predicate()``; no wall-time claim."""
    for _ in range(6000):
        if predicate():  # type: ignore[operator]
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def held(fifo: Path) -> Iterator[tuple[MemoryBudget, list[object]]]:
    """A budget of 1000 MiB with a 600 MiB child holding it until the FIFO is written."""
    budget = MemoryBudget(1000)
    results: list[object] = []
    first = threading.Thread(
        target=lambda: results.append(
            run_python(
                ["-c", HOLD, str(fifo)],
                memory_mb=600,
                timeout_s=SLOW_S,
                what="first",
                budget=budget,
            )
        )
    )
    first.start()
    _until(lambda: budget.reserved_mb == 600, "the first child reserved its 600 MiB")
    try:
        yield budget, results
    finally:
        _release(fifo)  # unless the test did
        first.join()


# -- one child's limits ------------------------------------------------------------------
@pytest.mark.parametrize(
    "last_line",
    [
        "MemoryError",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "OpenBLAS error: Memory allocation still failed after 10 retries, giving up.",
    ],
)
def test_every_way_a_child_runs_out_of_its_limit_reads_as_the_limit(last_line: str) -> None:
    # A busy CI run's job child died in OpenBLAS's buffers at numpy's import; the report
    # said the OpenBLAS line instead of "analysis stopped (...; memory limit N MiB?)".
    assert ChildResult(1, error=last_line, memory_mb=64).killed
    assert not ChildResult(1, error="corrupt XProf capture", memory_mb=64).killed


def test_a_child_over_its_limit_fails_with_one_line() -> None:
    budget = MemoryBudget(4096)
    done = run_python(
        ["-c", "import sys; blob = bytearray(int(sys.argv[1]) << 20)", "400"],
        memory_mb=200,
        timeout_s=SLOW_S,
        what="greedy",
        budget=budget,
    )
    assert not done.ok and done.killed
    assert done.error == "MemoryError", done.stderr  # the exception line, not its traceback
    assert budget.reserved_mb == 0  # given back


def test_the_limit_is_set_before_the_module_runs_and_one_blas_thread() -> None:
    code = (
        "import json, os, resource, sys; "
        "print(json.dumps([resource.getrlimit(resource.RLIMIT_AS)[0] >> 20, sys.argv, "
        "os.environ['OPENBLAS_NUM_THREADS'], os.environ['MLPROF_SANDBOX_MEMORY_MB'], "
        "'numpy' in sys.modules]))"
    )
    done = run_python(
        ["-c", code, "a", "b"],
        memory_mb=300,
        timeout_s=SLOW_S,
        what="probe",
        budget=MemoryBudget(1000),
    )
    assert done.ok, done.stderr
    assert json.loads(done.stdout) == [300, ["-c", "a", "b"], "1", "300", False]


def test_run_job_over_its_limit_says_so_in_one_line(tmp_path: Path) -> None:
    capture = tmp_path / "x.xplane.pb"
    capture.write_bytes(b"\x00" * 16)
    # 64 MiB: the job child cannot even import what it needs.
    result = run_job(
        ["flamegraphs", str(capture), str(tmp_path / "out"), "--kind", "capture"],
        SLOW_S,
        64,
        budget=MemoryBudget(1000),
    )
    assert not result.ok
    assert "\n" not in result.error and "Traceback" not in result.error
    assert result.error.startswith("analysis stopped (exit "), result.error
    assert "memory limit 64 MiB" in result.error


def test_a_timed_out_child_is_stopped_and_gives_its_budget_back(fifo: Path) -> None:
    budget = MemoryBudget(1000)
    done = run_python(
        ["-c", HOLD, str(fifo)], memory_mb=500, timeout_s=0.5, what="stuck", budget=budget
    )
    assert done.timed_out and done.error == "took over 0.5s and was stopped"
    assert budget.reserved_mb == 0


# -- the budget ------------------------------------------------------------------------
def test_two_children_over_the_budget_run_one_after_the_other(
    fifo: Path, reader: InMemoryMetricReader
) -> None:
    budget = MemoryBudget(1000, meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    results: dict[str, object] = {}

    def child(name: str, code: list[str]) -> None:
        results[name] = run_python(code, memory_mb=600, timeout_s=SLOW_S, what=name, budget=budget)

    first = threading.Thread(target=child, args=("first", ["-c", HOLD, str(fifo)]))
    first.start()
    _until(lambda: budget.reserved_mb == 600, "the first child started")
    second = threading.Thread(target=child, args=("second", ["-c", "pass"]))
    second.start()
    _until(lambda: budget.waiting == 1, "the second child queued")
    seen = _metrics(reader)
    assert seen[("mlprof.children.waiting", ())] == 1
    assert seen[("mlprof.children.memory_reserved", ())] == 600 << 20
    assert seen[("mlprof.children.memory_budget", ())] == 1000 << 20
    _release(fifo)
    first.join()
    second.join()
    assert [(e.kind, e.what, e.reserved_mb) for e in budget.record] == [
        ("start", "first", 600),
        ("wait", "second", 600),
        ("end", "first", 0),
        ("start", "second", 600),
        ("end", "second", 0),
    ]
    assert budget.peak_reserved_mb == 600  # never both at once
    assert all(r.ok for r in results.values())  # type: ignore[attr-defined]
    seen = _metrics(reader)
    assert seen[("mlprof.children.budget_waits", (("outcome", "started"),))] == 1
    assert seen[("mlprof.children.budget_waits", (("outcome", "timeout"),))] == 0
    assert seen[("mlprof.children.waiting", ())] == 0


def test_waiters_start_in_arrival_order(
    held: tuple[MemoryBudget, list[object]], fifo: Path
) -> None:
    budget, _ = held
    # A big request first, then a small one that alone would fit beside the holder: the
    # small one must not overtake (first come, first served; no starving the big one).
    big = threading.Thread(
        target=lambda: run_python(
            ["-c", "pass"], memory_mb=900, timeout_s=SLOW_S, what="big", budget=budget
        )
    )
    big.start()
    _until(lambda: budget.waiting == 1, "the big child queued")
    small = threading.Thread(
        target=lambda: run_python(
            ["-c", "pass"], memory_mb=100, timeout_s=SLOW_S, what="small", budget=budget
        )
    )
    small.start()
    _until(lambda: budget.waiting == 2, "the small child queued behind it")
    _release(fifo)
    big.join()
    small.join()
    starts = [e.what for e in budget.record if e.kind == "start"]
    assert starts == ["first", "big", "small"]


def test_a_child_that_cannot_get_budget_in_time_is_not_run(
    held: tuple[MemoryBudget, list[object]],
) -> None:
    budget, _ = held
    done = run_python(
        ["-c", "pass"], memory_mb=600, timeout_s=SLOW_S, wait_s=0, what="late", budget=budget
    )
    assert done.no_budget and done.returncode is None
    assert done.error == (
        "waited over 0s for 600 MiB of the children's 1000 MiB memory budget "
        "(MLPROF_MEMORY_LIMIT_MB)"
    )
    assert [e.kind for e in budget.record if e.what == "late"] == ["wait", "timeout"]
    assert budget.waiting == 0 and budget.reserved_mb == 600


def test_a_child_over_the_whole_budget_runs_alone_with_its_limit_lowered(
    reader: InMemoryMetricReader,
) -> None:
    budget = MemoryBudget(700, meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)"
    done = run_python(["-c", code], memory_mb=4096, timeout_s=SLOW_S, what="huge", budget=budget)
    assert done.ok and done.stdout.strip() == b"700"
    assert (done.asked_mb, done.memory_mb) == (4096, 700)
    assert done.notes == ("limit lowered from 4096 to the 700 MiB budget",)
    assert _metrics(reader)[("mlprof.children.limit_lowered", ())] == 1


def test_a_child_passes_its_reservation_down_to_its_own_children() -> None:
    code = (
        "from exporter import sandbox; b = sandbox.default_budget(); "
        "print(b.limit_mb, b.used_mb() > 0, b.grant_mb(10**6) < b.limit_mb)"
    )
    done = run_python(
        ["-c", code], memory_mb=900, timeout_s=SLOW_S, what="parent", budget=MemoryBudget(1000)
    )
    assert done.ok, done.stderr
    assert done.stdout.split() == [b"900", b"True", b"True"]


def test_run_job_reserves_from_the_process_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = MemoryBudget(2000)
    monkeypatch.setattr(sandbox, "_default", budget)
    result = run_job(
        ["flamegraphs", str(tmp_path / "none.xplane.pb"), str(tmp_path / "o"), "--kind", "capture"],
        SLOW_S,
        1500,
    )
    assert not result.ok and "cannot read capture" in result.error
    assert [(e.kind, e.what, e.mb) for e in budget.record] == [
        ("start", "analysis job (flamegraphs)", 1500),
        ("end", "analysis job (flamegraphs)", 1500),
    ]


# -- the default budget ------------------------------------------------------------------
def test_the_default_limit_is_the_cgroups_less_headroom(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("2147483648\n")
    assert default_memory_limit_mb(v2) == 2048 - sandbox.SIDECAR_HEADROOM_MB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("3221225472\n")
    assert default_memory_limit_mb(v1) == 3072 - sandbox.SIDECAR_HEADROOM_MB
    # No limit ("max"; v1's near 2**63): the documented figure, or the machine's memory
    # less the headroom where that is smaller.
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\n")
    (v2 / "memory.max").write_text("max\n")
    assert default_memory_limit_mb(v2, meminfo) == sandbox.DEFAULT_MEMORY_LIMIT_MB
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    meminfo.write_text("MemTotal:        4194304 kB\n")
    assert default_memory_limit_mb(v1, meminfo) == 4096 - sandbox.SIDECAR_HEADROOM_MB
    assert default_memory_limit_mb(tmp_path / "none", tmp_path / "nometa") == (
        sandbox.DEFAULT_MEMORY_LIMIT_MB
    )


def test_the_setting_wins_over_the_cgroup(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("2147483648\n")
    assert MemoryBudget.from_settings(load_settings(None), cgroup_root=tmp_path).limit_mb == 1536
    settings = load_settings(None, memory_limit_mb=3000)
    assert MemoryBudget.from_settings(settings, cgroup_root=tmp_path).limit_mb == 3000
