"""/metrics with every accelerator metric against today's headline set, in one run.

TPU: ``mlprof fake-tpu --chips 256`` twice, one serving the whole libtpu runtime-metrics
set, one ``--basic`` (duty cycle, HBM, tensor-core utilisation: the set before the TPU
Monitoring Library metrics), each read by its own ``mlprof serve``:

1. latency: scrapes both /metrics at a fixed period, as Prometheus does, and reports
   p50/p99 of each with their ratio, next to /healthz (the HTTP floor) and an
   in-process render of the same registries without the cache.
2. CPU: each sidecar's user+system time over one window with TPU collection every
   second and no scrapes, against a sidecar without accelerator sources.

GPU: no NVML here, so the NVML source runs in-process against the NVML double
(tests/nvml_double.py) with 8 H100s: one collection and one render with the whole
dcgm-exporter set against a double that offers only utilisation, memory and GPM (what
the source read before). This measures the sidecar's own cost (Python, OpenTelemetry),
not the driver's time per NVML call.

    .venv/bin/python bench/metrics_scrape.py [--quick] [--chips 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.config import Settings  # noqa: E402
from exporter.metrics.sources import AcceleratorSources  # noqa: E402
from exporter.metrics.telemetry import build_telemetry  # noqa: E402
from exporter.metrics.training import TrainingMetrics  # noqa: E402
from tests.harness import Proc, free_port, wait_http, wait_until  # noqa: E402
from tests.nvml_double import NvmlDouble, h100  # noqa: E402

TARGET_P99_MS = 5.0
TARGET_CPU_PCT = 1.0
# A scraper's first scrapes set the rhythm the cache renders ahead for; Prometheus
# scrapes forever, so steady state is what the percentiles describe.
WARMUP_SCRAPES = 3
GPUS = 8  # a DGX/HGX node


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def serve(tmp: Path, name: str, env: dict[str, str]) -> tuple[Proc, str]:
    port = free_port()
    full = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(tmp / name / "shared"),
        "MLPROF_STORE": str(tmp / name / "store"),
        "MLPROF_COLLECT_INTERVAL_S": "1",
        "MLPROF_LOG_LEVEL": "warning",
        **env,
    }
    proc = Proc.python(["-m", "exporter.cli", "serve"], tmp / f"{name}.log", env=full)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", timeout=60)
    return proc, url


def timed(fn: Callable[[], Any], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def uncached_render(addr: str, rounds: int) -> list[float]:
    """Reference: rendering the same series in-process, as an uncached /metrics would."""
    telemetry = build_telemetry(CollectorRegistry())
    with tempfile.TemporaryDirectory() as shared:
        TrainingMetrics(telemetry.meter, Path(shared))
        settings = Settings(sources=["tpu"], tpu_metrics_addr=addr, shared_dir=Path(shared))
        sources = AcceleratorSources(settings, telemetry.meter)
        collect = sources.runs[0].collect
        assert collect is not None and collect()[0] == "ok"
        out = timed(lambda: generate_latest(telemetry.registry), rounds)
        sources.close()
    return out


class BasicNvml(NvmlDouble):
    """The NVML surface the source read before the dcgm-exporter set: utilisation, memory, GPM."""

    kept = frozenset(
        {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo"}
        | {n for n in dir(NvmlDouble) if n.startswith("nvmlGpm") or "Handle" in n}
        | {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount"}
    )

    def __getattribute__(self, name: str) -> Any:
        function = name.startswith("nvml") and callable(getattr(NvmlDouble, name, None))
        if function and name not in type(self).kept:
            raise AttributeError(name)  # as if this nvidia-ml-py lacked it: skipped once
        return super().__getattribute__(name)


def nvml_cost(nvml: NvmlDouble, rounds: int) -> tuple[list[float], list[float], int]:
    """(collect ms, render ms, series) of the NVML source over ``nvml``."""
    telemetry = build_telemetry(CollectorRegistry())
    with tempfile.TemporaryDirectory() as shared:
        settings = Settings(sources=["nvml"], shared_dir=Path(shared))
        sources = AcceleratorSources(settings, telemetry.meter, nvml=nvml)
        collect = sources.runs[0].collect
        assert collect is not None
        collect()  # the first collection learns what is unsupported
        collect_ms = timed(collect, rounds)
        render_ms = timed(lambda: generate_latest(telemetry.registry), rounds)
        series = sum(len(f.samples) for f in telemetry.registry.collect())
        sources.close()
    return collect_ms, render_ms, series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    parser.add_argument("--chips", type=int, default=256)
    parser.add_argument("--period", type=float, default=0.5, help="scrape period (s)")
    parser.add_argument("--scrapes", type=int, help="number of scrapes [200; --quick: 20]")
    args = parser.parse_args()
    scrapes = args.scrapes or (20 if args.quick else 200)
    cpu_window = 5.0 if args.quick else 60.0

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        procs: list[Proc] = []
        urls: dict[str, str] = {}
        addrs: dict[str, str] = {}
        try:
            for name, extra in (("full", []), ("basic", ["--basic"])):
                port = free_port()
                procs.append(Proc.python(
                    ["-m", "exporter.cli", "fake-tpu", "--chips", str(args.chips),
                     "--listen", f"127.0.0.1:{port}", *extra],
                    tmp / f"fake-{name}.log",
                ))  # fmt: skip
                addrs[name] = f"127.0.0.1:{port}"
            sidecars = {}
            for name, addr in addrs.items():
                env = {"MLPROF_SOURCES": "tpu", "MLPROF_TPU_METRICS_ADDR": addr}
                sidecars[name], urls[name] = serve(tmp, name, env)
                procs.append(sidecars[name])
            # Reference for CPU: a sidecar without accelerator sources, measured over the
            # same window so that all see the same machine load.
            bare, _ = serve(tmp, "bare", {"MLPROF_SOURCES": "jax"})
            procs.append(bare)
            sidecars["bare"] = bare
            with httpx.Client(timeout=10) as client:
                for url in urls.values():
                    wait_until(
                        lambda url=url: (
                            client.get(f"{url}/metrics").text.count("accelerator_duty_cycle{")
                            == args.chips
                        ),
                        timeout=60,
                        what=f"{args.chips} chips on /metrics",
                    )
                # -- CPU share: collection every second, nobody scraping ----------------
                time.sleep(2.0)  # let the last scrape's rendering ahead pass
                before = {n: cpu_seconds(p.pid) for n, p in sidecars.items()}
                time.sleep(cpu_window)
                cpu = {
                    n: (cpu_seconds(p.pid) - before[n]) / cpu_window * 100
                    for n, p in sidecars.items()
                }

                # -- latency: scrapes at a fixed period, both sidecars alternately ---------
                metrics_ms: dict[str, list[float]] = {"full": [], "basic": []}
                health_ms: list[float] = []
                size: dict[str, int] = {}
                for _ in range(scrapes + WARMUP_SCRAPES):
                    start = time.perf_counter()
                    for name, url in urls.items():
                        t0 = time.perf_counter()
                        body = client.get(f"{url}/metrics").content
                        metrics_ms[name].append((time.perf_counter() - t0) * 1000)
                        size[name] = len(body)
                    t0 = time.perf_counter()
                    client.get(f"{urls['full']}/healthz")
                    health_ms.append((time.perf_counter() - t0) * 1000)
                    time.sleep(max(0.0, args.period - (time.perf_counter() - start)))
            rounds = max(20, scrapes // 4)
            render_ms = {n: uncached_render(a, rounds) for n, a in addrs.items()}
        finally:
            for proc in reversed(procs):
                proc.stop()

    gpu_rounds = 20 if args.quick else 200
    boards = [h100() for _ in range(GPUS)]
    nvml_full = nvml_cost(NvmlDouble(boards), gpu_rounds)
    nvml_basic = nvml_cost(BasicNvml([h100() for _ in range(GPUS)]), gpu_rounds)

    health = health_ms[WARMUP_SCRAPES:]
    h50, h99 = statistics.median(health), pct(health, 0.99)
    print(f"/metrics, {args.chips} TPU chips, {scrapes} scrapes every {args.period:g}s")
    print(f"  /healthz (floor)        p50 {h50:7.2f} ms   p99 {h99:7.2f} ms")
    p99s, r99s = {}, {}
    for name in ("full", "basic"):
        steady = metrics_ms[name][WARMUP_SCRAPES:]
        p50, p99s[name] = statistics.median(steady), pct(steady, 0.99)
        r50, r99s[name] = statistics.median(render_ms[name]), pct(render_ms[name], 0.99)
        label = "every libtpu metric" if name == "full" else "today's set (--basic)"
        print(f"  {label:<22}  p50 {p50:7.2f} ms   p99 {p99s[name]:7.2f} ms   "
              f"{size[name]} bytes   (target p99 < {TARGET_P99_MS:g} ms)")  # fmt: skip
        print(f"    uncached render       p50 {r50:7.2f} ms   p99 {r99s[name]:7.2f} ms")
    print(f"  ratio full : today's    /metrics p99 {p99s['full'] / p99s['basic']:.2f}   "
          f"uncached render p99 {r99s['full'] / r99s['basic']:.2f}   "
          f"bytes {size['full'] / size['basic']:.2f}")  # fmt: skip
    print(f"sidecar CPU over {cpu_window:g}s, collect interval 1s, no scrapes")
    print(f"  every libtpu metric     {cpu['full']:5.2f}% of one core   "
          f"(target < {TARGET_CPU_PCT:g}%)")  # fmt: skip
    print(f"  today's set (--basic)   {cpu['basic']:5.2f}% of one core")
    print(f"  no accelerator sources  {cpu['bare']:5.2f}% of one core   (reference)")
    added_full, added_basic = cpu["full"] - cpu["bare"], cpu["basic"] - cpu["bare"]
    ratio = added_full / added_basic if added_basic > 0 else float("nan")
    print(f"  added by the TPU source: full {added_full:5.2f}%, today's {added_basic:5.2f}% "
          f"(ratio {ratio:.2f})")  # fmt: skip
    print(f"NVML source in-process, {GPUS} H100 (NVML double: sidecar cost, not driver time)")
    for label, (collect_ms, gpu_render_ms, series) in (
        ("dcgm-exporter set", nvml_full),
        ("today's set", nvml_basic),
    ):
        collect_p50, render_p50 = statistics.median(collect_ms), statistics.median(gpu_render_ms)
        print(f"  {label:<18} collect p50 {collect_p50:6.2f} ms   "
              f"render p50 {render_p50:6.2f} ms   {series} series")  # fmt: skip
    print(f"  ratio full : today's    collect "
          f"{statistics.median(nvml_full[0]) / statistics.median(nvml_basic[0]):.2f}   render "
          f"{statistics.median(nvml_full[1]) / statistics.median(nvml_basic[1]):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
