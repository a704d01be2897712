"""Checks of scripts/device-check.sh on a machine with an NVIDIA GPU (not a pytest module).

Given a running ``mlprof serve`` (NVML source on) and the demo workload beside it, it
scrapes ``/metrics`` while the GPU idles and while it works, checks every GPU metric is
there with sane values, takes one capture and checks its device flame graph has GPU
kernels. It prints one line per check and a PASS/FAIL summary; exit 1 on any failure.

``--dry-run`` runs the same steps on a machine without a GPU (CPU JAX, no NVML): the
GPU checks are reported SKIP, the plumbing (sidecar, workload, scrape, capture, flame
graph) is exercised for real.

    python -m tests.device_check --url http://127.0.0.1:9464 --shared DIR --store DIR
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Sane ranges (a datacenter GPU under a short load); outside them something is misread.
MAX_GPU_TEMP_C = 100.0  # slowdown thresholds are ~85-95 C
MAX_MEMORY_TEMP_C = 110.0
POWER_LIMIT_RANGE_W = (10.0, 1500.0)  # a T4 is 70 W, a B200 1000 W
POWER_OVER_LIMIT = 1.2  # a short spike above the enforced limit is normal
SM_CLOCK_RANGE_HZ = (100e6, 3.5e9)
MIN_DUTY_RISE = 0.2  # busy minus idle duty cycle of the busiest GPU
MIN_SDK_DUTY_RISE = 0.1  # a dry run's step-log estimate, on a CPU shared with the sidecar
IDLE_DELAY_S = "1.0"  # input-pipeline delay per step while "idle"
SAMPLE_S = 8.0  # how long each phase is watched
# Metrics every datacenter GPU offers through NVML; the rest may be skipped (and then
# appear in /readyz under "skipped"), e.g. GPM before Hopper or NVLink on PCIe cards.
REQUIRED = (
    "accelerator_duty_cycle",
    "accelerator_memory_usage_bytes",
    "accelerator_memory_limit_bytes",
    "accelerator_clock_frequency_hertz",
    "accelerator_temperature_celsius",
    "accelerator_power_usage_watts",
    "accelerator_power_limit_watts",
    "accelerator_energy_joules_total",
    "accelerator_clock_throttle",
    "accelerator_pcie_throughput_bytes_per_second",
    "accelerator_process_memory_usage_bytes",
    "accelerator_info",
)
OPTIONAL = (
    "accelerator_tensorcore_utilization",
    "accelerator_memory_bandwidth_utilization",
    "accelerator_engine_utilization",
    "accelerator_sm_utilization",
    "accelerator_memory_reserved_bytes",
    "accelerator_memory_copy_utilization",
    "accelerator_codec_utilization",
    "accelerator_pcie_replays_total",
    "accelerator_nvlink_io_bytes_total",
    "accelerator_xid_errors_total",
    "accelerator_xid_last",
    "accelerator_memory_ecc_errors_total",
    "accelerator_memory_ecc_lifetime_errors_total",
    "accelerator_memory_remapped_rows_total",
    "accelerator_memory_row_remap_failed",
    "accelerator_memory_row_remap_pending",
)
# Names XLA/CUDA give GPU kernels in a device trace.
KERNEL = re.compile(r"gemm|cublas|cutlass|fusion|dot|convolution|kernel|sm\d\d", re.I)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Report:
    results: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, status: str, name: str, detail: str = "") -> None:
        self.results.append((status, name, detail))
        print(f"{status:<4}  {name}" + (f": {detail}" if detail else ""), flush=True)

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        self.add("PASS" if ok else "FAIL", name, detail)
        return ok

    @property
    def failed(self) -> list[str]:
        return [name for status, name, _ in self.results if status == "FAIL"]


def scrape(client: httpx.Client, url: str) -> Series:
    text = client.get(f"{url}/metrics").text
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def values(series: Series, name: str, **labels: str) -> dict[str, float]:
    """chip -> value of ``name`` (from the NVML source unless ``source`` is given)."""
    labels = {"source": "nvml"} | labels
    out = {}
    for (metric, items), value in series.items():
        lab = dict(items)
        if metric == name and all(lab.get(k) == v for k, v in labels.items()):
            out[lab.get("chip", "")] = value
    return out


def watch(client: httpx.Client, url: str, seconds: float) -> list[Series]:
    scrapes = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        scrapes.append(scrape(client, url))
        time.sleep(1.0)
    return scrapes


def mean_duty(scrapes: Iterable[Series], source: str) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for series in scrapes:
        for chip, value in values(series, "accelerator_duty_cycle", source=source).items():
            sums.setdefault(chip, []).append(value)
    return {chip: sum(v) / len(v) for chip, v in sums.items()}


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = probe()
        except (httpx.HTTPError, ValueError):
            found = None  # the sidecar is still starting
        if found:
            return found
        time.sleep(1.0)
    raise TimeoutError(f"no {what} within {timeout_s:g}s")


def check_values(report: Report, series: Series, run: dict[str, Any]) -> None:
    for name in REQUIRED:
        report.check(bool(values(series, name)), f"present: {name}")
    for name in OPTIONAL:
        found = values(series, name)
        report.add("PASS" if found else "SKIP", f"present: {name}", "" if found else
                   "not offered by this GPU/driver (see /readyz skipped)")  # fmt: skip
    used, limit = (
        values(series, "accelerator_memory_usage_bytes"),
        values(series, "accelerator_memory_limit_bytes"),
    )
    report.check(
        bool(used) and all(0 <= used[c] <= limit.get(c, -1) for c in used),
        "memory use <= limit",
        ", ".join(f"{c}: {used[c] / 2**30:.1f}/{limit.get(c, 0) / 2**30:.1f} GiB" for c in used),
    )
    temp = values(series, "accelerator_temperature_celsius", sensor="gpu")
    report.check(
        bool(temp) and all(0 < t < MAX_GPU_TEMP_C for t in temp.values()),
        "GPU temperature in range",
        ", ".join(f"{c}: {t:g} C" for c, t in temp.items()),
    )
    memory_temp = values(series, "accelerator_temperature_celsius", sensor="memory")
    if memory_temp:
        report.check(all(0 < t < MAX_MEMORY_TEMP_C for t in memory_temp.values()),
                     "memory temperature in range",
                     ", ".join(f"{c}: {t:g} C" for c, t in memory_temp.items()))  # fmt: skip
    power = values(series, "accelerator_power_usage_watts")
    plimit = values(series, "accelerator_power_limit_watts")
    report.check(
        bool(power)
        and all(POWER_LIMIT_RANGE_W[0] <= plimit.get(c, 0) <= POWER_LIMIT_RANGE_W[1] for c in power)
        and all(0 < w <= plimit.get(c, 0) * POWER_OVER_LIMIT for c, w in power.items()),
        "power draw in range and under its limit",
        ", ".join(f"{c}: {w:.0f}/{plimit.get(c, 0):.0f} W" for c, w in power.items()),
    )
    sm = values(series, "accelerator_clock_frequency_hertz", clock="sm")
    report.check(
        bool(sm) and all(SM_CLOCK_RANGE_HZ[0] <= hz <= SM_CLOCK_RANGE_HZ[1] for hz in sm.values()),
        "SM clock in range",
        ", ".join(f"{c}: {hz / 1e6:.0f} MHz" for c, hz in sm.items()),
    )
    procs = [
        dict(items)
        for (metric, items), value in series.items()
        if metric == "accelerator_process_memory_usage_bytes" and value > 0
    ]
    mine = [p for p in procs if p.get("pid") == str(run.get("pid"))]
    report.check(bool(mine), "the workload's process uses GPU memory", f"pid {run.get('pid')}")
    if mine:
        mapped = all(p.get("run_id") == run.get("run_id") for p in mine)
        report.add("PASS" if mapped else "SKIP", "its memory carries the run_id",
                   run.get("run_id", "") if mapped else
                   "pid not mapped (sidecar in another pid namespace?)")  # fmt: skip


def check_capture(
    report: Report, url: str, store: str, dry_run: bool, shared: Path | None = None
) -> None:
    """One capture and its flame graph: taken remotely through the sidecar, or (``shared``
    given: no XProf profiler client here) in the workload with ``run.profile``."""
    mlprof = [sys.executable, "-m", "exporter.cli"]
    if shared is not None:
        session = _capture_in_workload(report, shared, store)
        if session is None:
            return
    else:
        done = subprocess.run(
            [*mlprof, "capture", "--url", url, "--duration-ms", "2000", "--json"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if not report.check(done.returncode == 0, "capture", done.stderr.strip()[-300:]):
            return
        session = json.loads(done.stdout)["id"]
    kind = [] if dry_run else ["--kind", "device"]
    folded = subprocess.run(
        [*mlprof, "flamegraph", session, "--store", store, "--format", "folded", *kind],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in folded.stdout.splitlines() if line.strip()]
    if dry_run:
        report.check(folded.returncode == 0 and bool(lines), "flame graph of the capture",
                     f"{len(lines)} stacks (CPU: host time)")  # fmt: skip
        report.add("SKIP", "device flame graph has GPU kernels", "dry run: no GPU")
        return
    kernels = [line for line in lines if KERNEL.search(line)]
    report.check(
        folded.returncode == 0 and bool(kernels),
        "device flame graph has GPU kernels",
        f"{len(lines)} stacks, {len(kernels)} with kernel names; e.g. {kernels[:1]}"
        if kernels
        else folded.stderr.strip()[-300:],
    )


def _capture_in_workload(report: Report, shared: Path, store: str) -> str | None:
    """Ask the demo workload to trace a few steps (its ``demo-profile`` knob) and wait for
    the sidecar to store that session: the in-process path, which needs no xprof."""
    from exporter.capture.store import SessionStore
    from exporter.demo.workload import PROFILE_FILE

    sessions = SessionStore(store)
    before = set(sessions.session_ids())
    (shared / PROFILE_FILE).write_text("5")

    def stored() -> str | None:
        for record in sessions.records():
            new = record.id not in before and record.trigger == "programmatic"
            if new and record.status != "running":
                return f"{record.id} {record.status}"
        return None

    try:
        found = wait_for("the workload's trace in the store", stored)
    except TimeoutError as exc:
        report.add("FAIL", "capture", f"in the workload (run.profile): {exc}")
        return None
    session, status = found.split()
    ok = report.check(status == "done", "capture", f"in the workload (run.profile): {found}")
    return session if ok else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="device_check", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--shared", required=True, type=Path)
    parser.add_argument("--store", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--in-process-capture",
        action="store_true",
        help="capture in the workload (run.profile): no XProf profiler client here",
    )
    args = parser.parse_args(argv)
    report = Report()
    try:
        run_checks(args, report)
    except (TimeoutError, httpx.HTTPError, OSError, ValueError) as exc:
        report.add("FAIL", "check run", f"{type(exc).__name__}: {exc}")
    return finish(report)


def run_checks(args: argparse.Namespace, report: Report) -> None:
    knob = args.shared / "demo-input-delay"
    with httpx.Client(timeout=30) as client:
        ready = wait_for("/readyz", lambda: client.get(f"{args.url}/readyz").json())
        nvml = ready["components"].get("source.nvml", {})
        if args.dry_run:
            report.add("SKIP", "NVML source running", f"dry run: {nvml.get('detail', 'off')}")
        elif not report.check(nvml.get("state") == "ok", "NVML source running", str(nvml)):
            return
        run = wait_for("run.json", lambda: _run(args.shared))
        wait_for("training steps", lambda: any(
            k[0] == "train_steps_total" and v > 0 for k, v in scrape(client, args.url).items()
        ))  # fmt: skip
        # Starve the device through the workload's input pipeline, then let it run. A dry
        # run watches the SDK's step-log estimate instead of NVML's utilisation.
        source = "sdk" if args.dry_run else "nvml"
        knob.write_text(IDLE_DELAY_S)
        time.sleep(3.0)
        idle = mean_duty(watch(client, args.url, SAMPLE_S), source)
        knob.unlink()
        time.sleep(3.0)
        scrapes = watch(client, args.url, SAMPLE_S)
        busy = mean_duty(scrapes, source)
        rise = max((busy.get(c, 0.0) - idle.get(c, 0.0) for c in busy), default=0.0)
        report.check(
            rise >= (MIN_SDK_DUTY_RISE if args.dry_run else MIN_DUTY_RISE),
            f"utilisation moves with the workload ({source})",
            " ".join(
                f"chip {c or '-'}: idle {idle.get(c, 0):.2f} busy {busy[c]:.2f}" for c in busy
            ),
        )
        if not args.dry_run:
            energy = [values(s, "accelerator_energy_joules_total") for s in scrapes]
            grew = bool(energy) and any(
                energy[-1].get(c, 0) > energy[0].get(c, 0) for c in energy[-1]
            )
            report.check(grew, "energy counter grows under load")
            check_values(report, scrapes[-1], run)
            report.add("INFO", "skipped on this machine", ", ".join(nvml.get("skipped", [])))
        else:
            report.add("SKIP", "GPU metrics and values", "dry run: no GPU")
        shared = args.shared if args.in_process_capture else None
        check_capture(report, args.url, args.store, args.dry_run, shared)


def _run(shared: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((shared / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finish(report: Report) -> int:
    failed = report.failed
    passed = sum(1 for status, _, _ in report.results if status == "PASS")
    print()
    if failed:
        print(f"DEVICE CHECK: FAIL ({len(failed)} failed, {passed} passed): {', '.join(failed)}")
        return 1
    print(f"DEVICE CHECK: PASS ({passed} checks passed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
