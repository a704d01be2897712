"""Per-host facts, the straggler score and rule, communication and its rule: each
threshold from both sides, and the synthetic TPU capture's collectives found exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exporter.analysis.facts.capture import CaptureFacts, gather_facts
from exporter.analysis.facts.collectives import async_role, is_communication
from exporter.analysis.facts.hosts import host_entries, host_name
from exporter.analysis.report import rules
from exporter.analysis.report.document import analyze
from exporter.capture.session import SessionRecord, TargetResult
from exporter.testing.synthetic import tpu_capture, write_tpu_capture

MS = 1_000_000


Host = tuple[Path, list[tuple[int, int]], list[int | None], Any, Any]


def host(
    name: str, step_ms: float, busy_share: float = 0.9, comm_share: float = 0.1, steps: int = 10
) -> Host:
    """One host's input to host_entries: ``steps`` equal cycles of ``step_ms``."""
    step = round(step_ms * MS)
    cycles = [(i * step, (i + 1) * step) for i in range(steps)]
    busy = np.full(steps, busy_share * step)
    return Path(f"/s/{name}.xplane.pb"), cycles, list(range(steps)), busy, comm_share * busy


def test_host_names_read_host_port_from_the_right() -> None:
    assert host_name("/x/host-a.xplane.pb") == "host-a"
    # Issue 31 (9): XProf's get_hosts keeps the last dot-separated part, "7_8466".
    assert host_name("10.0.0.7_8466.xplane.pb") == "10.0.0.7:8466"
    assert host_name("vm.example.com.xplane.pb") == "vm.example.com"
    assert host_name("my_host.xplane.pb") == "my_host"  # not a port: the whole stem
    assert host_name("w.xspace.pb") == "w"


def _session(directory: Path, targets: list[tuple[str, str, str]]) -> None:
    record = SessionRecord(
        id="s1", targets=[TargetResult(address=a, host=h, files=[f]) for a, h, f in targets]
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "session.json").write_text(record.model_dump_json())


def test_a_sessions_capture_is_named_by_its_targets_host(tmp_path: Path) -> None:
    _session(tmp_path / "one", [("127.0.0.1:9999", "vm", "127.0.0.1_9999.xplane.pb")])
    assert host_name(tmp_path / "one" / "127.0.0.1_9999.xplane.pb") == "vm"  # was "1_9999"
    # Two processes on one host: their addresses keep them apart.
    _session(tmp_path / "two", [("10.0.0.5:9001", "vm", "a.xplane.pb"),
                                ("10.0.0.5:9002", "vm", "b.xplane.pb")])  # fmt: skip
    assert host_name(tmp_path / "two" / "b.xplane.pb") == "10.0.0.5:9002"
    # A file the record does not list, or a record that does not parse: the file's name.
    assert host_name(tmp_path / "one" / "10.0.0.5_1.xplane.pb") == "10.0.0.5:1"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "session.json").write_text("[1, 2")
    assert host_name(tmp_path / "bad" / "10.0.0.5_1.xplane.pb") == "10.0.0.5:1"


def test_analyze_names_a_single_capture_by_its_address(tmp_path: Path) -> None:
    capture = tmp_path / "s" / "10.0.0.5_9999.xplane.pb"
    write_tpu_capture(capture, devices=1, steps=4, ops_per_step=20)
    report = analyze(str(capture.parent), xprof=False).to_json()
    assert [h["name"] for h in report["facts"]["hosts"]] == ["10.0.0.5:9999"]


def test_a_straggler_needs_three_hosts_and_a_modified_z_score_above_3_5() -> None:
    two = host_entries([host("a", 10), host("b", 120)])
    assert [h["straggler"] for h in two] == [None, None]
    # MAD 0 -> floored at 5 % of the 10 ms median: z = 0.6745 * excess / 0.5
    below = host_entries([host("a", 10), host("b", 10), host("c", 12.5)])  # z 3.37
    above = host_entries([host("a", 10), host("b", 10), host("c", 12.7)])  # z 3.64
    assert [h["straggler"] for h in below] == [False, False, False]
    assert [h["straggler"] for h in above] == [False, False, True]
    assert above[2]["straggler_z"] == pytest.approx(3.64, abs=0.01)
    faster = host_entries([host("a", 10), host("b", 10), host("c", 5)])
    assert not any(h["straggler"] for h in faster)  # a faster host holds nobody up
    # Another floor (bench/stragglers.py compares them): 10 % of 10 ms halves the score.
    wider = host_entries([host("a", 10), host("b", 10), host("c", 12.7)], mad_floor=0.10)
    assert [h["straggler"] for h in wider] == [False, False, False]
    assert wider[2]["straggler_z"] == pytest.approx(3.64 / 2, abs=0.01)
    # the same host captured three times (a run's sessions) is not three hosts
    again = [host("a", 10), host("b", 10), host("c", 40)]
    again = [(Path(f"/s/{i}/a.xplane.pb"), *rest) for i, (_, *rest) in enumerate(again)]
    entries = host_entries(again)  # type: ignore[arg-type]
    assert [h["straggler"] for h in entries] == [None, None, None]
    assert len({h["name"] for h in entries}) == 3  # told apart by their paths


def test_host_entries_split_each_step_and_name_the_slowest_steps() -> None:
    path, cycles, steps, busy, comm = host("a", 10, busy_share=0.5, comm_share=0.2)
    busy[3] = 0.5 * 10 * MS
    cycles[3] = (cycles[3][0], cycles[3][0] + 30 * MS)  # step 3 lasts 30 ms, 25 of them idle
    (entry,) = host_entries([(path, cycles, steps, busy, comm)])
    assert entry["name"] == "a" and entry["steps"] == 10
    assert entry["step_median_ms"] == 10.0 and entry["step_p90_ms"] == 12.0
    assert entry["slowest_steps"][0] == {"step": 3, "ms": 30.0, "busy_ms": 5.0, "idle_ms": 25.0}
    assert entry["device_busy_pct"] == pytest.approx(100 * 50 / 120, abs=0.01)
    assert entry["communication_ms_per_step"] == 1.0 and entry["compute_ms_per_step"] == 4.0


def facts_with(
    hosts: list[dict[str, Any]] | None = None, comm: float | None = None
) -> CaptureFacts:
    breakdown: dict[str, Any] = {
        "xla_pct": 95.0,
        "input_wait_pct": 5.0,
        "data_phase_pct": 0.0,
        "between_steps_pct": 0.0,
        "host_other_pct": 5.0,
        "cycle_total_ms": 1000.0,
    }
    if comm is not None:
        breakdown |= {
            "communication_pct": comm,
            "compute_pct": 95.0 - comm,
            "communication_ms_per_step": comm / 10,
            "communication_by_kind_ms": {"all-reduce": comm / 10},
            "communication_overlap": None,
        }
    return CaptureFacts(
        backend="tpu",
        steps={"count": 10, "mean_ms": 10.0, "median_ms": 10.0},
        breakdown=breakdown,
        hosts=hosts or [],
    )


@pytest.mark.parametrize(
    ("straggler_ms", "priority"), [(19.8, "P1"), (20.2, "P0")]
)  # 2x the median host's step: P0
def test_straggler_rule_names_the_host_its_slowdown_and_where(
    straggler_ms: float, priority: str
) -> None:
    entries = host_entries([host("a", 10), host("b", 10.1), host("c", straggler_ms)])
    finding = rules.StragglerRule().apply(facts_with(entries))
    assert finding is not None and finding.priority == priority
    assert finding.extra["host"] == "c" and "Host c is a straggler" in finding.title
    assert "mostly computing" in finding.title  # its busy time grew with its steps
    assert finding.evidence["slowdown_x"] == pytest.approx(straggler_ms / 10.1, abs=0.01)
    assert finding.extra["slowest_steps"][0]["ms"] == straggler_ms
    assert rules.StragglerRule().apply(facts_with(entries[:2])) is None


def test_a_straggler_that_waits_is_said_to_wait() -> None:
    entries = host_entries(
        [host("a", 10), host("b", 10), host("c", 40, busy_share=9 / 40, comm_share=0.1)]
    )
    finding = rules.StragglerRule().apply(facts_with(entries))
    assert finding is not None and "mostly waiting" in finding.title
    assert finding.evidence["excess_idle_ms_per_step"] == pytest.approx(30.0, abs=0.01)


@pytest.mark.parametrize(
    ("share", "priority"),
    [(14.9, None), (15.0, "P2"), (29.9, "P2"), (30.0, "P1"), (49.9, "P1"), (50.0, "P0")],
)
def test_communication_rule_on_either_side_of_each_threshold(
    share: float, priority: str | None
) -> None:
    finding = rules.CommunicationBoundRule().apply(facts_with(comm=share))
    assert (finding.priority if finding else None) == priority
    if finding is not None:
        assert finding.evidence["communication_pct"] == round(share, 1)
        assert "all-reduce" in finding.detail
    assert rules.CommunicationBoundRule().apply(facts_with()) is None  # unknown: silent


def test_collectives_by_category_or_name() -> None:
    assert is_communication("fusion.3", "all-reduce fusion")
    assert is_communication("all-gather-start.2", "async-start")
    assert is_communication("%send-done.1 = (f32[8]) send-done(...)")
    assert is_communication("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert not is_communication("copy-start.1", "async-start")  # an async copy: memory
    assert not is_communication("fusion.7", "megacore fusion")
    assert not is_communication("sendfile", "")
    assert async_role("all-gather-done.3") == ("all-gather.3", "done")
    assert async_role("send.1") == ("send.1", "start") and async_role("fusion.1") is None


def test_the_synthetic_collectives_are_found_exactly(tmp_path: Path) -> None:
    assert tpu_capture(devices=1, steps=2, ops_per_step=20).expected_communication_ns == {}
    capture = write_tpu_capture(
        tmp_path / "h.xplane.pb", devices=2, steps=4, ops_per_step=120, distinct_ops=44,
        collectives=True,
    )  # fmt: skip
    facts = gather_facts([tmp_path / "h.xplane.pb"], xprof=False)
    b = facts.breakdown
    assert b is not None
    expected_ms = np.mean(list(capture.expected_communication_ns.values())) / 4 / 1e6
    assert b["communication_ms_per_step"] == pytest.approx(expected_ms, abs=1e-4)
    assert b["compute_pct"] + b["communication_pct"] == pytest.approx(b["xla_pct"], abs=0.02)
    overlap = b["communication_overlap"]
    windows = [w for ws in capture.expected_async_windows.values() for w in ws]
    assert overlap["async_ops"] == len(windows) and overlap["source"] == "Async XLA Ops line"
    assert 50 < overlap["hidden_pct"] < 100
    assert facts.hosts[0]["name"] == "h" and facts.hosts[0]["straggler"] is None


def test_captures_of_one_host_at_different_times_name_no_straggler(tmp_path: Path) -> None:
    paths = []
    for i, slowdown in enumerate((1.0, 1.0, 12.0)):  # a run's three sessions of one host
        paths.append(tmp_path / f"s{i}" / "tpu-vm-0.xplane.pb")
        write_tpu_capture(paths[-1], devices=1, steps=4, ops_per_step=40, slowdown=slowdown)
    facts = gather_facts(paths, xprof=False)
    assert [h["straggler"] for h in facts.hosts] == [None, None, None]
    assert "captured more than once" in facts.unavailable["stragglers"]
    assert rules.StragglerRule().apply(facts) is None


def test_communication_and_start_done_overlap_on_a_hand_built_plane(tmp_path: Path) -> None:
    # One chip, one step of 300 ns: an all-gather starts at 100 (10 ns), fusion.2 runs
    # under its transfer (110-200), its done op waits 30 ns (200-230), then an all-reduce
    # (230-280; its category a string ref, as XProf writes it). No Async XLA Ops line:
    # the window is the start/done pair on the op line.
    from exporter.analysis.facts.capture import _host_facts
    from exporter.proto import xplane_pb2
    from tests.xspace_builder import PlaneBuilder

    space = xplane_pb2.XSpace()
    chip = PlaneBuilder(space, "/device:TPU:0")
    steps = chip.line("Steps")
    chip.event(steps, "1", 0, 300, step_num=1)
    chip.event(steps, "2", 300, 300, step_num=2)
    ops = chip.line("XLA Ops")
    for name, category, start, duration in (
        ("fusion.1", "convolution fusion", 0, 100),
        ("all-gather-start.1", "all-gather", 100, 10),
        ("fusion.2", "loop fusion", 110, 90),
        ("all-gather-done.1", "all-gather", 200, 30),
        ("all-reduce.3", "all-reduce", 230, 50),
        ("fusion.1", "convolution fusion", 300, 300),
    ):
        chip.event(ops, chip.meta(name, hlo_category=category), start, duration)
    path = tmp_path / "tpu.xplane.pb"
    path.write_bytes(space.SerializeToString())

    host = _host_facts(path, CaptureFacts())

    assert host.communication is not None
    assert host.communication.tolist() == [90.0, 0.0]  # 10 + 30 + 50 ns, then none
    assert host.overlap == {
        "async_ops": 1,
        "source": "start/done op pairs",
        "async_ms_per_step": round(130 / 2 / 1e6, 4),
        "hidden_pct": round(100 * 90 / 130, 2),  # fusion.2 covers 90 of the 130 ns
        "exposed_ms_per_step": round(40 / 2 / 1e6, 4),
    }
    assert host.kinds == {"all-gather": 40, "all-reduce": 50}


def test_cpu_collectives_are_taken_from_the_xla_client_threads_op_names() -> None:
    from exporter.analysis.facts.capture import _host_communication
    from exporter.analysis.sides.xla_host import XlaEvents

    paths = [("jit_step", "fusion.1"), ("jit_step", "all-reduce.2"), ("jit_step", "send.4")]
    events = XlaEvents(
        np.array([0, 100, 150, 600]),
        np.array([100, 200, 180, 650]),
        np.array([0, 1, 2, 1]),
        np.array([-1, -1, -1, -1]),
        paths,  # type: ignore[arg-type]
    )
    per_cycle, kinds = _host_communication(events, [(0, 500), (500, 1000)], {})
    assert per_cycle.tolist() == [100.0, 50.0]  # 100-200 (the send inside it), 600-650
    # 180 ns of ops in 150 ns of collective time: the kinds split the 150 ns 150:30.
    assert kinds == {"all-reduce": 125, "send": 25}


def test_cpu_collectives_are_recognised_by_their_hlo_opcode_whatever_their_name() -> None:
    # JAX names an instruction after its primitive: lax.psum's all-reduce is "psum.7"
    # on the CPU client threads. Its opcode, from the capture's HLO proto, says what it is.
    from exporter.analysis.facts.capture import _host_communication
    from exporter.analysis.sides.xla_host import XlaEvents

    paths = [("jit_step", "dot.1"), ("jit_step", "psum.7"), ("jit_other", "psum.7")]
    events = XlaEvents(
        np.array([0, 100, 150, 600]),
        np.array([100, 300, 250, 700]),
        np.array([0, 1, 0, 2]),  # a second device's dot.1 runs during the first's psum.7
        np.array([-1, -1, -1, -1]),
        paths,  # type: ignore[arg-type]
    )
    opcodes = {"jit_step": {"dot.1": "dot", "psum.7": "all-reduce"}, "jit_other": {}}
    per_cycle, kinds = _host_communication(events, [(0, 500), (500, 1000)], opcodes)
    # 100-300 less the other device's dot (150-250): the machine computed then.
    # jit_other's psum.7 has no opcode and no collective's name: a user's op.
    assert per_cycle.tolist() == [100.0, 0.0]
    assert kinds == {"all-reduce": 100}
    assert _host_communication(events, [(0, 500), (500, 1000)], {})[0].tolist() == [0.0, 0.0]


def test_in_lockstep_the_host_the_others_wait_for_is_named() -> None:
    # Steps of 13 ms everywhere; a and b wait 5 ms per step in collectives, c only 1 ms:
    # c works 12 ms per step outside collectives against 8 ms on the others.
    entries = host_entries(
        [
            host("a", 13, busy_share=12 / 13, comm_share=5 / 12),
            host("b", 13, busy_share=12 / 13, comm_share=5 / 12),
            host("c", 13, busy_share=12 / 13, comm_share=1 / 12),
        ]
    )
    assert [h["straggler"] for h in entries] == [False, False, True]
    assert entries[2]["straggler_basis"] == "time outside collectives"
    assert entries[2]["own_median_ms"] == 12.0
    finding = rules.StragglerRule().apply(facts_with(entries))
    assert finding is not None and finding.priority == "P1"  # 1.5x, below the 2x of P0
    assert "Host c holds the other hosts up" in finding.title
    assert "mostly computing" in finding.title
    assert finding.evidence["slowdown_x"] == 1.5
    assert finding.evidence["excess_ms_per_step"] == pytest.approx(4.0)
    assert finding.extra["basis"] == "time outside collectives"
    # the same hosts without the communication gap: no verdict
    alike = host_entries([host("a", 13), host("b", 13), host("c", 13)])
    assert not any(h["straggler"] for h in alike)
