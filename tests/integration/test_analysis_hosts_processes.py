"""Stragglers among hosts captured in separate processes, as the hosts of a real job are.

Each host is one process of ``bench/detection_workload.py`` (a jitted MLP training loop
on CPU, ``StepTraceAnnotation`` steps, the batch made in an ``input_pipeline`` phase
inside the step; the workload ``bench/stragglers.py`` measures the threshold on). A
session is a folder of these files named as XProf names the hosts of a session
(``10.0.0.<i>_8466.xplane.pb``, hosts ``10.0.0.<i>:8466``): three unchanged hosts alone (no
straggler may be named), then with a fourth that computes longer (an extra jitted
function of 4x its step) or waits longer (its data phase sleeps 4x its step). Checked:
one ``facts.hosts`` entry per host, the finding's priority, host, cause and slowdown
factor against the workloads' own clocks, and each host's steps against XProf's
``get_kpi_metrics`` ``per_host_step_time_ms`` on copies of the same files.

A busy machine can slow one process of the unchanged workload by half or more (the
noise ``bench/stragglers.py`` prints); such a host *is* slower, and naming it would be
right. So what the unchanged session is held to is measured outside the capture, by
each process's own wall clock (the workload's ``traced_step_ms``): no host that ran
alike with the others may be named. A process that ran slow is captured again (up to
three times) so that, on any but a very busy machine, all three ran alike and the test
asks for no straggler at all; where one stays slow, the others still may not be named.

The slowed host is held to the same clocks: its slowdown factor is what its own clock
says against the others', not a fixed figure. Its change is 4x its step *as calibrated
before the trace* (a sleep, or work sized then), so a busy machine that slows the other
processes' steps shrinks the factor: ~5x on an idle machine, 2.37x at load 8-13, where
a fixed "above 2.5x" failed though the product read the clocks' factor. So the factor
must agree with the clocks, the priority is the rule's threshold applied to it, and the
excess time in the workload's place is at least half of what the workload injected.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts.hosts import STRAGGLER_Z
from exporter.analysis.report.document import analyze
from exporter.analysis.report.rules import STRAGGLER_P0_SLOWDOWN
from exporter.profiles.steps import step_windows
from exporter.profiles.xplane import load_capture
from tests.harness import ROOT
from tests.xprof_cli import xprof_run

pytestmark = pytest.mark.integration

WORKLOAD = ROOT / "bench" / "detection_workload.py"
# The slowed host's change, as a share of its own calibrated step: ~5x steps, far above
# the spread of unchanged processes that bench/stragglers.py measures (up to 2x on a
# busy 2-core machine), so the verdict does not hang on the machine's load.
SLOWED_PCT = 400.0
# Unchanged hosts "ran alike" when none's own median step exceeds the others' median by
# more than this: at the MAD floor a host is named from 1 + 3.5 / 0.6745 * 0.05 = 1.26x.
ALIKE = 1.12
# The slowed process must have run at least this much slower by its own clock, or the
# test's change did not take (a precondition, not the product's doing): well above the
# 1.26x naming threshold, and far below the 5x of an idle machine.
TOOK = 1.5
RECAPTURES = 3
# XProf prints per-host step times with 2 decimals (ms).
XPROF_MS = 0.006
UNCHANGED = ("10.0.0.1_8466", "10.0.0.2_8466", "10.0.0.3_8466")
SLOWED = "10.0.0.4_8466"
SLOWED_HOST = "10.0.0.4:8466"  # HOST_PORT read from the right


@dataclass(frozen=True)
class Host:
    path: Path
    variant: str
    traced_ms: float  # the process's own median step inside the trace (perf_counter)
    injected_ms: float = 0.0  # the change per step, as the process sized it (its clock)


def _capture(out: Path, variant: str, k_pct: float) -> Host:
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out), variant, str(k_pct)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fields = next(x for x in done.stdout.splitlines() if x.startswith("DONE ")).split()
    # DONE <path> <step_ms> <unit_ms> <iterations> <traced_step_ms>: the added work is
    # iterations x unit; the input's sleep is K % of the calibrated step.
    step_ms, unit_ms, iterations = float(fields[2]), float(fields[3]), int(fields[4])
    injected = {"added": iterations * unit_ms, "input": k_pct / 100 * step_ms}
    return Host(Path(fields[1]), variant, float(fields[5]), injected.get(variant, 0.0))


def _session(where: Path, hosts: dict[str, Host]) -> Path:
    """A session folder as XProf lays out one (plugins/profile/<run>/<host>.xplane.pb)."""
    run = where / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    for name, host in hosts.items():
        shutil.copyfile(host.path, run / f"{name}.xplane.pb")
    return run


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Host]]]:
    base = tmp_path_factory.mktemp("hosts")
    same = [_capture(base / f"same-{i}", "same", 0.0) for i in range(len(UNCHANGED))]
    for attempt in range(RECAPTURES):
        # A busy machine only ever adds time: the fastest process is the workload's own
        # speed, and a slow one is measured against it, not against the median (two of
        # three processes ran 7x slower under load 20 once, and the median was theirs).
        fastest = min(h.traced_ms for h in same)
        slow = [i for i, h in enumerate(same) if h.traced_ms > ALIKE * fastest]
        if not slow:
            break
        for i in slow:
            same[i] = _capture(base / f"same-{i}-again-{attempt}", "same", 0.0)
    typical = statistics.median(h.traced_ms for h in same)
    slowed = {}
    for cause, variant in (("computing", "added"), ("waiting", "input")):
        # The change must take against the unchanged hosts as captured (a precondition,
        # TOOK): a slowed process that ran while the machine was quieter than during the
        # others' is captured again, as a slow unchanged one is.
        for attempt in range(RECAPTURES):
            host = _capture(base / f"{variant}-{attempt}", variant, SLOWED_PCT)
            if host.traced_ms >= TOOK * typical:
                break
        slowed[cause] = host
    unchanged = dict(zip(UNCHANGED, same, strict=True))
    out = {"unchanged": (_session(base / "unchanged", unchanged), unchanged)}
    for cause, host in slowed.items():
        hosts = {**unchanged, SLOWED: host}
        out[cause] = (_session(base / cause, hosts), hosts)
    return out


def _hosts(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in report["facts"]["hosts"]}


def test_unchanged_hosts_give_no_straggler(
    sessions: dict[str, tuple[Path, dict[str, Host]]],
) -> None:
    session, workloads = sessions["unchanged"]
    report = analyze(str(session), xprof=False).to_json()
    hosts = _hosts(report)
    assert sorted(hosts) == ["10.0.0.1:8466", "10.0.0.2:8466", "10.0.0.3:8466"]
    assert all(h["steps"] >= 20 for h in hosts.values()), hosts
    clocks = statistics.median(h.traced_ms for h in workloads.values())
    alike = {n.replace("_", ":") for n, h in workloads.items() if h.traced_ms <= ALIKE * clocks}
    assert len(alike) >= 2  # the median process is always alike with itself
    named = {name for name, h in hosts.items() if h["straggler"]}
    # No host that ran alike with the others by its own clock is named (on any but a
    # very busy machine that is all three: no straggler at all).
    assert not named & alike, (named, {n: h.traced_ms for n, h in workloads.items()})
    assert all(hosts[name]["straggler_z"] <= STRAGGLER_Z for name in alike)
    if not named:
        assert "StragglerRule" not in [f["rule"] for f in report["findings"]]


@pytest.mark.parametrize(
    ("cause", "excess_key"),
    [("computing", "excess_compute_ms_per_step"), ("waiting", "excess_idle_ms_per_step")],
)
def test_the_slowed_host_is_named_with_its_cause_and_slowdown(
    sessions: dict[str, tuple[Path, dict[str, Host]]], cause: str, excess_key: str
) -> None:
    session, workloads = sessions[cause]
    report = analyze(str(session), xprof=False).to_json()
    hosts = _hosts(report)
    assert sorted(hosts) == ["10.0.0.1:8466", "10.0.0.2:8466", "10.0.0.3:8466", "10.0.0.4:8466"]
    named = {n for n, h in hosts.items() if h["straggler"]}
    assert "10.0.0.4:8466" in named, hosts
    # Any other host named ran slower by its own clock (a busy machine's doing), never
    # one that ran alike with the others (test_unchanged_hosts_give_no_straggler).
    same = statistics.median(h.traced_ms for n, h in workloads.items() if n != SLOWED)
    for name, host in workloads.items():
        if name.replace("_", ":") in named - {"10.0.0.4:8466"}:
            assert host.traced_ms > ALIKE * same, (named, hosts)
    clocks = statistics.median(h.traced_ms for h in workloads.values())
    clock_x = workloads[SLOWED].traced_ms / clocks
    assert clock_x >= TOOK, (
        f"precondition: the slowed process ran {clock_x:.2f}x the median process by its own "
        "clock; the injected change did not take",
        {n: h.traced_ms for n, h in workloads.items()},
    )
    finding = next(
        f for f in report["findings"] if f["rule"] == "StragglerRule" and f["host"] == SLOWED_HOST
    )
    assert finding["host"] == "10.0.0.4:8466" and finding["basis"] == "step time"
    assert finding["title"].startswith(f"Host {SLOWED_HOST} is a straggler: its steps take ")
    assert f"mostly {cause}" in finding["title"], finding["title"]
    evidence = finding["evidence"]
    # The factor is the host's median step over the median host's, from facts.hosts...
    typical = statistics.median(h["step_median_ms"] for h in hosts.values())
    assert evidence["slowdown_x"] == pytest.approx(
        hosts["10.0.0.4:8466"]["step_median_ms"] / typical, abs=0.01
    )
    # The title states that factor to one decimal (of the unrounded ratio: the evidence's
    # two decimals, 5.25 for 5.254, would print 5.2 where the title says 5.3).
    stated = re.search(r"its steps take (\d+\.\d)x", finding["title"])
    assert stated, finding["title"]
    assert abs(float(stated.group(1)) - evidence["slowdown_x"]) <= 0.05 + 0.005, finding["title"]
    # ... and it is what the processes measured on their own clocks, outside the capture.
    assert evidence["slowdown_x"] == pytest.approx(clock_x, rel=0.1)
    # The priority is the rule's threshold on that factor: P0 from 2x (~5x idle).
    priority = "P0" if evidence["slowdown_x"] >= STRAGGLER_P0_SLOWDOWN else "P1"
    assert finding["priority"] == priority, (finding["priority"], evidence)
    # The extra time is where the workload put it, at least half of what it injected (a
    # sleep is never shorter; work sized before the trace runs no faster inside it than
    # twice its calibrated speed).
    injected = workloads[SLOWED].injected_ms
    assert evidence[excess_key] >= 0.5 * injected, (injected, evidence)


def _steps_ms(path: Path) -> list[float]:
    with load_capture(path) as capture:
        windows, source = step_windows(capture)
    assert source == "host_step_annotations"
    return [(w.end_ns - w.start_ns) / 1e6 for w in windows]


def _window_means(steps: list[float], length: int) -> list[float]:
    return [statistics.mean(steps[i : i + length]) for i in range(len(steps) - length + 1)]


@pytest.mark.parametrize("name", ["unchanged", "computing", "waiting"])
def test_per_host_steps_agree_with_xprofs_kpi_metrics(
    sessions: dict[str, tuple[Path, dict[str, Host]]], name: str, tmp_path: Path
) -> None:
    """XProf's per-host step time is the mean of the steps its merge keeps: it aligns the
    hosts' step timelines (capture-relative) with the host whose steps span least, at
    the offset where they overlap most (StepIntersection), and keeps the steps every host
    has at that alignment, the same number on each. So each host's XProf figure must be
    the mean of one run of *our* steps of that host, of one length on every host, to
    XProf's 2 decimals: every step we read is XProf's. Our median is not held to XProf's
    mean within a fixed tolerance: on a loaded machine one process's steps went from 14
    to 35 ms mid-capture, and XProf's mean of the steps it kept was 23.6 ms against our
    median of all of them, 17.8 ms; both right."""
    session, workloads = sessions[name]
    answer, log = xprof_run("get_kpi_metrics", session, tmp_path)
    per_host = answer.get("per_host_step_time_ms")
    assert per_host, (
        "precondition: XProf's get_kpi_metrics gives per_host_step_time_ms only when its "
        "merge keeps a step on 2 or more hosts (a non-empty step intersection) and it "
        f"can read its own merged op_stats; it did not here. Its answer: {answer}; its "
        f"log: {log[-3000:]}"
    )
    names = sorted(p.name.removesuffix(".xplane.pb") for p in session.iterdir())
    assert sorted(per_host) == names
    steps = {stem: _steps_ms(session / f"{stem}.xplane.pb") for stem in per_host}
    lengths = [
        n
        for n in range(2, min(len(s) for s in steps.values()) + 1)
        if all(
            any(abs(m - float(per_host[stem])) <= XPROF_MS for m in _window_means(s, n))
            for stem, s in steps.items()
        )
    ]
    assert lengths, ("no run of our steps has XProf's mean on every host", per_host, steps)
    report = analyze(str(session), xprof=False).to_json()
    ours = _hosts(report)
    assert sorted(ours) == sorted(stem.replace("_", ":") for stem in per_host)
    if name != "unchanged":
        # XProf sees the same straggler: its slowest host is ours, by a like margin: at
        # least half the excess the processes' own clocks measured (a fixed 2x would ask
        # more than a busy machine leaves of the injected 4x: 2.37x at load 8-13).
        theirs = {stem: float(ms) for stem, ms in per_host.items()}
        assert max(theirs, key=lambda stem: theirs[stem]) == SLOWED, theirs
        clock_x = workloads[SLOWED].traced_ms / statistics.median(
            h.traced_ms for h in workloads.values()
        )
        margin = theirs[SLOWED] / statistics.median(theirs.values())
        assert margin - 1 >= 0.5 * (clock_x - 1), (margin, clock_x, theirs)
