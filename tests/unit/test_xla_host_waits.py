"""The CPU "device" view's executor waits: time the pool's own ops hold is counted once."""

from __future__ import annotations

from pathlib import Path

from exporter.analysis.facts.capture import gather_facts
from exporter.analysis.sides import xla_host
from exporter.profiles.xplane import load_capture
from exporter.proto import xplane_pb2
from tests.xspace_builder import PlaneBuilder

PROGRAM = "jit_layout(6)"
T0 = 1_700_000_000_000_000_000  # ns since the epoch, as XProf stamps host lines


def _capture(tmp_path: Path) -> Path:
    """Two steps as XLA's CPU client ran ``formatting_workload.py``: the client thread
    runs the first matmul and the layout copy, then waits while a ``tf_XLAEigen`` thread
    runs the second matmul (with its own ``hlo_op`` event); the wait outlives it by 1 us
    (the client's wake-up)."""
    space = xplane_pb2.XSpace()
    host = PlaneBuilder(space, "/host:CPU")
    python = host.line("python", timestamp_ns=T0)
    client = host.line("tf_XLAPjRtCpuClient/1", timestamp_ns=T0)
    pool = host.line("tf_XLAEigen/2", timestamp_ns=T0)
    op = {"hlo_module": PROGRAM, "run_id": 7}
    for step in range(2):
        t = step * 100_000
        host.event(python, "train", t, 40_000, step_num=step)
        host.event(client, "ynn_fusion.1", t + 1_000, 10_000, hlo_op="ynn_fusion.1", **op)
        host.event(client, "copy_bitcast_fusion", t + 11_000, 10_000, hlo_op="copy", **op)
        host.event(
            client, "ThunkExecutor::Execute (wait for completion)", t + 21_000, 11_000, run_id=7
        )
        host.event(pool, "ynn_fusion", t + 21_500, 9_500, hlo_op="ynn_fusion", **op)
    path = tmp_path / "vm.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return path


def test_a_wait_counts_only_the_time_no_op_of_another_thread_holds(tmp_path: Path) -> None:
    with load_capture(_capture(tmp_path)) as capture:
        events = xla_host.xla_host_events(capture)
    [whole] = xla_host.graphs(events, None)
    self_ns = {tuple(f.name for f in (*a, n))[-1]: n.self_value for a, n in whole.paths()}
    # Per step: 500 ns before the pool's matmul starts, 1,000 ns after it ends.
    assert self_ns["ThunkExecutor::Execute (wait for completion)"] == 2 * 1_500
    assert self_ns["ynn_fusion"] == 2 * 9_500
    # XLA time is the program's wall time, 31 us a step, not 31 + 9.5.
    assert whole.root.total == 2 * 31_000


def test_the_formatting_share_is_of_xla_time_counted_once(tmp_path: Path) -> None:
    facts = gather_facts([_capture(tmp_path)], xprof=False)
    assert facts.compiler is not None
    # 10 us of copy in 31 us of XLA time a step (with the pool's matmul also counted in
    # the wait, 10 / 40.5 = 24.7 %).
    assert facts.compiler["data_formatting_pct"] == round(100 * 10 / 31, 2)
