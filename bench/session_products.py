"""Benchmark: a finished session's products (pprof pushed, report written), one child
per session against the two queues before it, in the same run.

On a store of two sessions of a ~32 MB TPU-shaped synthetic capture each
(``write_tpu_capture``, 2M op events): a manual one (the baseline) and an alert-started
one compared against it. Each path processes the baseline, then the alert session, each
from its hooks being called (the capture finished) until its flame graphs are pushed
and its report is written:

* ``two queues`` (before): ``SessionProcessor`` converting each capture in a
  ``flamegraphs`` child and ``ReportWorker`` analysing the session in an ``analyze``
  child, side by side (then a ``sides`` child keeping the baseline's side cache);
* ``one child`` (after): the processor's ``session`` child reads each capture once
  (the report's facts read its graphs as its sides), stores and pushes those graphs,
  writes the side cache and the report, as ``exporter/sidecar.py`` wires it.

Both paths run in fresh copies of the store, alternately, ``--repeat`` times; medians
and ratios (before / after) are printed, wall time and the children's CPU seconds, with
each path's capture opens for decoding (a ``sitecustomize`` audit hook in every
child). XProf's converters are off unless ``--xprof`` (they read the capture
themselves, the same in both paths).

    .venv/bin/python bench/session_products.py              # ~32 MB captures, minutes
    .venv/bin/python bench/session_products.py --quick      # 100k events, a smoke run
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAME = "tpu-vm-0_8466.xplane.pb"
SITECUSTOMIZE = """
import os, sys

def _count(event, args):
    if event == "open" and args[1] is not None and str(args[0]).endswith(".xplane.pb"):
        with open(os.environ["MLPROF_BENCH_OPENS"], "a") as log:
            log.write(f"{args[0]}\\n")

sys.addaudithook(_count)
"""


def _write_store(root: Path, events: int) -> None:
    from datetime import UTC, datetime, timedelta

    from exporter.analysis.sides.baselines import BaselineStore
    from exporter.capture.session import SessionRecord, TargetResult
    from exporter.capture.store import SessionStore
    from exporter.testing.synthetic import write_tpu_capture

    store = SessionStore(str(root))
    devices, ops_per_step = 4, 10_000 if events >= 400_000 else 1_000
    steps = max(1, -(-events // (devices * ops_per_step)))
    start = datetime.now(UTC) - timedelta(hours=1)
    for minutes, (session_id, trigger) in enumerate((("base", "manual"), ("alert", "alert"))):
        directory = Path(store.session_dir(session_id))
        made = write_tpu_capture(
            directory / NAME,
            devices=devices,
            steps=steps,
            ops_per_step=ops_per_step,
            distinct_ops=400,
            while_every=50,
            while_body=8,
            slowdown=1.3 if trigger == "alert" else 1.0,
            seed=minutes,
        )
        store.write_record(
            SessionRecord(
                id=session_id,
                status="done",
                trigger=trigger,
                run_id="run-1",
                workload="trainer",
                created=start + timedelta(minutes=10 * minutes),
                alert={"name": "MLWorkloadDutyCycleLow"} if trigger == "alert" else None,
                targets=[
                    TargetResult(
                        address="127.0.0.1:8466",
                        host="tpu-vm-0",
                        run_id="run-1",
                        status="ok",
                        files=[NAME],
                    )
                ],
            )
        )
    BaselineStore(store).set("trainer", "base")
    size = (directory / NAME).stat().st_size / 2**20
    print(f"captures: {made.event_count:,} events, {size:.1f} MiB each, 2 sessions")


class _Done:
    """When the session's graphs were all pushed and its report written."""

    def __init__(self, pushes_expected: int) -> None:
        self.pushes_expected = pushes_expected
        self.pushed: dict[str, int] = {}
        self.reported: dict[str, float] = {}
        self.last_push: dict[str, float] = {}
        self.cond = threading.Condition()

    def push(self, graph: Any, labels: dict[str, str]) -> str:
        with self.cond:
            session = labels["session_id"]
            self.pushed[session] = self.pushed.get(session, 0) + 1
            self.last_push[session] = time.perf_counter()
            self.cond.notify_all()
        return "ok"

    def report(self, event: Any) -> None:
        with self.cond:
            self.reported[event.session_id] = time.perf_counter()
            self.cond.notify_all()

    def wait(self, session_id: str) -> float:
        with self.cond:
            while not (
                self.pushed.get(session_id, 0) >= self.pushes_expected
                and session_id in self.reported
            ):
                self.cond.wait(1.0)
            return max(self.last_push[session_id], self.reported[session_id])


def _run(path_name: str, master: Path, tmp: Path, xprof: bool) -> dict[str, float]:
    from exporter.analysis.sides import cache as side_cache
    from exporter.capture.store import SessionStore
    from exporter.pipeline.processing import SessionProcessor, bounded_flamegraphs
    from exporter.pipeline.worker import ReportSettings, ReportWorker

    root = tmp / f"store-{path_name}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(master, root)
    store = SessionStore(str(root))
    done = _Done(pushes_expected=2)  # xprof_device and xprof_host
    settings = ReportSettings(xprof=xprof, timeout_s=1200)
    worker = ReportWorker(store, settings)
    worker.on_report.append(done.report)
    processor = SessionProcessor(store, bounded_flamegraphs(1200, 4096), push=done.push)
    if path_name == "one child":  # as exporter/sidecar.py wires them
        processor.session_job = worker.session_job
        processor.on_processed.append(worker)
        worker.deferred = processor.pending
    seconds: dict[str, float] = {}
    for session_id in ("base", "alert"):
        record = store.read_record(session_id)
        assert record is not None
        cpu = _children_cpu_s()
        started = time.perf_counter()
        processor(record)  # the hooks in the sidecar's order
        worker(record)
        seconds[session_id] = done.wait(session_id) - started
        # Both queues idle before the next session: the processor done, the side cache
        # written (the old path's report worker writes it after the report) and every
        # child reaped, so its CPU time is this session's.
        cache = side_cache.cache_path(Path(store.session_dir(session_id)) / NAME)
        while processor.pending(session_id) or not cache.is_file() or _has_children():
            time.sleep(0.05)
        seconds[f"{session_id} cpu"] = _children_cpu_s() - cpu
    processor.close()
    worker.close()
    report = store.read_record("alert")
    assert report is not None and report.report is not None, report
    return seconds


def _has_children() -> bool:
    """Whether a child of this process still runs (a report's, a side cache's)."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 1 and fields[1] == me:
            return True
    return False


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k events: a smoke run")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--xprof", action="store_true", help="also XProf's converters")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    events = 100_000 if args.quick else args.events
    with tempfile.TemporaryDirectory(prefix="mlprof-bench-session-") as tmp_text:
        tmp = Path(tmp_text)
        hooks = tmp / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
        os.environ["PYTHONPATH"] = str(hooks)
        master = tmp / "master"
        _write_store(master, events)
        results: dict[str, list[dict[str, float]]] = {"two queues": [], "one child": []}
        opens: dict[str, Counter[str]] = {}
        for _ in range(args.repeat):
            for path_name, found in results.items():
                log = tmp / f"opens-{path_name}.log"
                log.unlink(missing_ok=True)
                os.environ["MLPROF_BENCH_OPENS"] = str(log)
                found.append(_run(path_name, master, tmp, args.xprof))
                lines = log.read_text().splitlines() if log.is_file() else []
                opens[path_name] = Counter(Path(line).parent.name for line in lines)
    print(f"per-session product time (hooks called -> pprof pushed + report written), "
          f"median of {args.repeat}, XProf {'on' if args.xprof else 'off'}:")  # fmt: skip
    for session_id, what in (("base", "baseline session"), ("alert", "alert session")):
        for key, unit in ((session_id, "s wall"), (f"{session_id} cpu", "s CPU ")):
            before = statistics.median(r[key] for r in results["two queues"])
            after = statistics.median(r[key] for r in results["one child"])
            print(
                f"  {what:17s} two queues {before:6.2f} {unit}  one child {after:6.2f} "
                f"{unit}  ratio {before / after:4.2f}x"
            )
    print("  (CPU: the children's, the sidecar's own aside; wall on a shared machine "
          f"at load {os.getloadavg()[0]:.1f})")  # fmt: skip
    for path_name, counted in opens.items():
        shown = ", ".join(f"{k} {v}" for k, v in sorted(counted.items()))
        print(f"  capture opens for decoding ({path_name}): {shown}")


if __name__ == "__main__":
    main()
