"""GPU study part ``nvml``: the sidecar's NVML metrics against ``nvidia-smi``, read side by side.

``mlprof serve`` runs with the NVML source (collecting every second) while a neighbour
keeps the GPU busy (``gpu_study_workload.py --hog``), so that utilisation, power and
clocks are off their idle values. Then ROUNDS times, a second apart, it scrapes
``/metrics`` and asks ``nvidia-smi --query-gpu`` (and ``--query-compute-apps``) at once,
and compares each metric per GPU: the median difference over the rounds must be within
the metric's tolerance (TOLERANCES: the two read at slightly different moments and
average differently; memory and limits must agree closely, utilisation and power only
roughly). The figures keep every pair read.

Dry run (no GPU): the sidecar is ``tests/nvml_sidecar.py`` (the NVML double: three
boards, nvidia-ml-py's own structures) and a stand-in ``nvidia-smi`` prints the same
boards in nvidia-smi's CSV, so the reading, units and labels are exercised, not the
hardware.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_study_part import BENCH, ROOT, Part, run_part, wait_line

sys.path.insert(0, str(ROOT))
ROUNDS = 6
MIB = 2**20
# metric, labels, nvidia-smi field, factor from nvidia-smi's unit to ours, tolerance
# (absolute, in our unit), what it is.
COMPARED: tuple[tuple[str, dict[str, str], str, float, float], ...] = (
    ("accelerator_memory_usage_bytes", {}, "memory.used", MIB, 256 * MIB),
    ("accelerator_memory_limit_bytes", {}, "memory.total", MIB, 64 * MIB),
    ("accelerator_temperature_celsius", {"sensor": "gpu"}, "temperature.gpu", 1.0, 3.0),
    ("accelerator_temperature_celsius", {"sensor": "memory"}, "temperature.memory", 1.0, 3.0),
    ("accelerator_power_limit_watts", {}, "enforced.power.limit", 1.0, 1.0),
    ("accelerator_power_usage_watts", {}, "power.draw.instant", 1.0, 60.0),
    ("accelerator_power_usage_watts", {}, "power.draw", 1.0, 60.0),
    ("accelerator_clock_frequency_hertz", {"clock": "sm"}, "clocks.sm", 1e6, 150e6),
    ("accelerator_clock_frequency_hertz", {"clock": "memory"}, "clocks.mem", 1e6, 50e6),
    ("accelerator_duty_cycle", {}, "utilization.gpu", 0.01, 0.25),
    ("accelerator_memory_bandwidth_utilization", {}, "utilization.memory", 0.01, 0.25),
)
FIELDS = ["index", *dict.fromkeys(c[2] for c in COMPARED)]


def nvidia_smi(smi: list[str], fields: list[str]) -> dict[str, dict[str, float | None]]:
    """index -> field -> value (None where nvidia-smi says N/A); fields it refuses dropped."""
    done = subprocess.run(
        [*smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0 and len(fields) > 2:
        # An older driver refuses a field it does not know (power.draw.instant): ask
        # the fields one by one once, keep those it answers.
        kept = [f for f in fields[1:] if nvidia_smi(smi, ["index", f])]
        return nvidia_smi(smi, ["index", *kept]) if kept else {}
    out: dict[str, dict[str, float | None]] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        row: dict[str, float | None] = {}
        for name, cell in zip(fields[1:], cells[1:], strict=True):
            try:
                row[name] = float(cell)
            except ValueError:
                row[name] = None  # [N/A], [Not Supported]
        out[cells[0]] = row
    return out


def apps(smi: list[str]) -> dict[str, float]:
    done = subprocess.run(
        [*smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[1].replace(".", "").isdigit():
            out[cells[0]] = out.get(cells[0], 0.0) + float(cells[1]) * MIB  # over GPUs
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def body(part: Part) -> None:
    import httpx

    from tests.device_check import scrape, values, wait_for

    port = free_port()
    env = {
        **os.environ,
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(part.work / "shared"),
        "MLPROF_STORE": str(part.work / "store"),
        "MLPROF_SOURCES": "nvml",
        "MLPROF_COLLECT_INTERVAL_S": "1",
        "MLPROF_DUTY_CYCLE_WINDOW_S": "2",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    procs: list[subprocess.Popen[bytes]] = []
    log = (part.work / "sidecar.log").open("wb")
    if part.gpu:
        smi = ["nvidia-smi"]
        sidecar = [sys.executable, "-m", "exporter.cli", "serve"]
        hog = subprocess.Popen(
            [
                sys.executable,
                str(BENCH / "gpu_study_workload.py"),
                "--hog",
                str(part.budget_s),
                "--size",
                "gpu",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        procs.append(hog)
    else:
        smi = [sys.executable, __file__, "--stand-in-smi"]
        sidecar = [sys.executable, "-m", "tests.nvml_sidecar"]
        part.add(
            "INFO",
            "dry run",
            "NVML double (tests/nvml_double.py) and a stand-in "
            "nvidia-smi printing its boards: units and labels, not hardware",
        )
    try:
        procs.append(subprocess.Popen(sidecar, stdout=log, stderr=log, env=env, cwd=ROOT))
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=10) as client:
            ready = wait_for(
                "/readyz",
                lambda: client.get(f"{url}/readyz").json(),
                timeout_s=max(10.0, part.left_s() - 20),
            )
            nvml = ready["components"].get("source.nvml", {})
            if not part.check(nvml.get("state") == "ok", "NVML source running", str(nvml)[:300]):
                return
            if part.gpu:
                line = wait_line(procs[0], b"HOGGING", max(5.0, part.left_s() - 15))
                part.check(b"HOGGING" in line, "a neighbour loads the GPU", line.decode()[:100])
                time.sleep(3.0)  # the duty-cycle window fills with the load
            compare(part, client, url, smi, scrape, values)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def compare(part: Part, client: Any, url: str, smi: list[str], scrape: Any, values: Any) -> None:
    pairs: dict[str, list[tuple[float, float]]] = {}
    process_pairs: list[tuple[str, float, float]] = []
    for _ in range(ROUNDS):
        series = scrape(client, url)
        table = nvidia_smi(smi, FIELDS)
        for metric, labels, field, factor, _tolerance in COMPARED:
            ours = values(series, metric, **labels)
            for index, row in table.items():
                theirs = row.get(field)
                if index in ours and theirs is not None:
                    key = f"{metric}{labels or ''} ~ {field} (GPU {index})"
                    pairs.setdefault(key, []).append((ours[index], theirs * factor))
        running = apps(smi)
        ours_by_pid: dict[str, float] = {}
        for (metric, items), value in series.items():
            pid = dict(items).get("pid")
            if metric == "accelerator_process_memory_usage_bytes" and pid:
                ours_by_pid[pid] = ours_by_pid.get(pid, 0.0) + value  # over chips
        process_pairs += [(p, v, running[p]) for p, v in ours_by_pid.items() if p in running]
        time.sleep(1.0)
    part.figures["pairs"] = pairs
    for metric, labels, field, _factor, tolerance in COMPARED:
        keys = [k for k in pairs if k.startswith(f"{metric}{labels or ''} ~ {field} ")]
        if not keys:
            part.add("SKIP", f"{metric}{labels or ''} ~ {field}", "not offered by one of the two")
            continue
        for key in keys:
            diffs = [abs(a - b) for a, b in pairs[key]]
            ours, theirs = pairs[key][-1]
            part.check(
                statistics.median(diffs) <= tolerance,
                key,
                f"median |diff| {statistics.median(diffs):.4g} (tolerance {tolerance:g}); "
                f"last {ours:.6g} vs {theirs:.6g}",
            )
    if process_pairs:
        worst = max(abs(a - b) for _, a, b in process_pairs)
        part.check(
            worst <= 64 * MIB,
            "per-process memory ~ --query-compute-apps",
            f"{len({p for p, _, _ in process_pairs})} pids, worst |diff| {worst / MIB:.0f} MiB",
        )
    else:
        part.add(
            "SKIP",
            "per-process memory ~ --query-compute-apps",
            "no pid in both (another pid namespace?)",
        )


def stand_in_smi(argv: list[str]) -> None:
    """nvidia-smi's CSV for the NVML double's boards (the dry run's reference)."""
    from tests.nvml_double import NvmlDouble

    double = NvmlDouble()
    query = next(a for a in argv if a.startswith("--query-"))
    kind, fields = query.split("=", 1)
    if kind == "--query-compute-apps":
        for board in double.boards:
            for pid, used in board.processes:
                # tests/nvml_sidecar.py gives the run's pid (4242) to its parent: ours too.
                print(f"{os.getppid() if pid == 4242 else pid}, {used // MIB}")
        return
    for index, b in enumerate(double.boards):
        util = b.util or (None, None)
        memory_temp = b.fields.get(__import__("pynvml").NVML_FI_DEV_MEMORY_TEMP)
        known: dict[str, Any] = {
            "index": index,
            "memory.used": b.memory_used // MIB,
            "memory.total": b.memory_total // MIB,
            "temperature.gpu": b.temperature,
            "temperature.memory": memory_temp[1] if memory_temp else None,
            "enforced.power.limit": b.power_limit_mw / 1000,
            "power.draw": b.power_mw / 1000,
            "power.draw.instant": b.power_mw / 1000,
            "clocks.sm": b.clocks_mhz[0],
            "clocks.mem": b.clocks_mhz[1],
            "utilization.gpu": util[0],
            "utilization.memory": util[1],
        }
        cells = [known.get(f) for f in fields.split(",")]
        print(", ".join("[N/A]" if c is None else str(c) for c in cells))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stand-in-smi"]:
        sys.path.insert(0, str(ROOT))
        stand_in_smi(sys.argv[2:])
    else:
        run_part("nvml", body)
