"""TPU source against the fake libtpu runtime-metrics server on loopback (real gRPC)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from exporter.config import Settings
from exporter.faketpu import (
    ALL_METRICS,
    BASIC_METRICS,
    FakeFrame,
    FakeTpuRuntime,
    FakeTpuScript,
    default_script,
)
from exporter.metrics.accelerator import DeviceSeries, RunIdentity, accelerator_gauges
from exporter.metrics.catalog import METRICS, PERCENTILES, prometheus_name
from exporter.metrics.histograms import histogram_name
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.tpu import HBM_USAGE_METRIC, RUNTIME_METRICS, TpuRuntimeClient, TpuSource
from tests.harness import ROOT, free_port, wait_until

pytestmark = pytest.mark.integration

GIB = 1 << 30
GOLDEN = ROOT / "tests" / "fixtures" / "tpu_4chips.prom"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeTpuRuntime]:
    with FakeTpuRuntime(default_script(4), "127.0.0.1:0") as runtime:
        yield runtime


def telemetry() -> Telemetry:
    # A fixed resource: target_info must not change with the machine or SDK version.
    resource = Resource({"service.name": "mlprof-exporter", "host.name": "golden-host"})
    return build_telemetry(CollectorRegistry(), resource=resource)


def sample(t: Telemetry, name: str, chip: str) -> float | None:
    labels = {"chip": chip, "source": "libtpu", "accelerator": "tpu", "host": "tpu-vm-0"}
    return t.registry.get_sample_value(name, labels)


def tpu_source(addr: str, t: Telemetry, shared: Path, clock: Clock) -> TpuSource:
    series = DeviceSeries("libtpu", "tpu", stale_after_s=15.0, clock=clock)
    accelerator_gauges(t.meter).add_series(series)
    return TpuSource(TpuRuntimeClient(addr), series, RunIdentity(shared, "tpu-vm-0"))


def chips(t: Telemetry) -> set[str]:
    return {
        s.labels["chip"]
        for family in t.registry.collect()
        if family.name == "accelerator_duty_cycle"
        for s in family.samples
    }


def test_values_and_chip_labels_match_the_runtime(fake: FakeTpuRuntime, tmp_path: Path) -> None:
    t = telemetry()
    source = tpu_source(fake.addr, t, tmp_path, Clock())
    assert source.collect() == ("ok", f"4 chips at {fake.addr}")
    assert chips(t) == {"0", "1", "2", "3"}
    # Percent becomes a ratio; bytes stay bytes.
    assert sample(t, "accelerator_duty_cycle", "0") == pytest.approx(0.95)
    assert sample(t, "accelerator_duty_cycle", "3") == pytest.approx(0.65)
    assert sample(t, "accelerator_tensorcore_utilization", "1") == pytest.approx(0.55)
    assert sample(t, "accelerator_memory_usage_bytes", "2") == 6 * GIB
    assert sample(t, "accelerator_memory_limit_bytes", "2") == 16 * GIB
    fake.set_value(HBM_USAGE_METRIC, 2, 9 * GIB)
    source.collect()
    assert sample(t, "accelerator_memory_usage_bytes", "2") == 9 * GIB


def test_run_identity_from_run_json(fake: FakeTpuRuntime, tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "llama-7", "name": "llama", "host": "worker-3"})
    )
    t = telemetry()
    tpu_source(fake.addr, t, tmp_path, Clock()).collect()
    labels = {"chip": "0", "source": "libtpu", "accelerator": "tpu", "host": "worker-3"}
    labels |= {"run_id": "llama-7", "workload": "llama"}
    assert t.registry.get_sample_value("accelerator_duty_cycle", labels) == pytest.approx(0.95)


def test_a_chip_that_disappears_is_dropped_after_several_intervals(
    fake: FakeTpuRuntime, tmp_path: Path
) -> None:
    t, clock = telemetry(), Clock()
    source = tpu_source(fake.addr, t, tmp_path, clock)
    source.collect()
    fake.remove_chip(2)
    clock.now += 5
    source.collect()
    assert chips(t) == {"0", "1", "2", "3"}  # one missed reading is not "gone"
    clock.now += 11  # 16 s since chip 2 was last seen > 15 s
    source.collect()
    assert chips(t) == {"0", "1", "3"}
    fake.restore_chip(2)
    source.collect()
    assert chips(t) == {"0", "1", "2", "3"}


def test_runtime_going_away_and_coming_back(tmp_path: Path) -> None:
    port = free_port()
    t, clock = telemetry(), Clock()
    errors: list[str] = []
    with FakeTpuRuntime(default_script(4), f"127.0.0.1:{port}") as fake:
        source = tpu_source(fake.addr, t, tmp_path, clock)
        source.on_error = errors.append
        assert source.collect()[0] == "ok"
    state, detail = source.collect()
    assert (state, errors) == ("error", ["unavailable"])
    assert "UNAVAILABLE" in detail
    assert chips(t) == {"0", "1", "2", "3"}  # last values are served a while
    clock.now += 20
    source.collect()
    assert chips(t) == set()  # then the series go, rather than lie
    with FakeTpuRuntime(default_script(2), f"127.0.0.1:{port}"):
        assert source.collect() == ("ok", f"2 chips at 127.0.0.1:{port}")
        assert chips(t) == {"0", "1"}


def test_auto_mode_without_tpu_is_off_not_error(tmp_path: Path) -> None:
    settings = Settings(
        sources=["tpu"], tpu_metrics_addr=f"127.0.0.1:{free_port()}", shared_dir=tmp_path
    )
    t = telemetry()
    named = AcceleratorSources(settings, t.meter)
    assert named.runs[0].collect is not None
    assert named.runs[0].collect()[0] == "error"  # asked for by name: missing is an error
    assert t.registry.get_sample_value("mlprof_source_errors_total", {"source": "tpu"}) == 1
    auto = AcceleratorSources(
        settings.model_copy(update={"sources": ["auto"]}),
        telemetry().meter,
        tpu_present=lambda: False,
    )
    tpu = next(r for r in auto.runs if r.name == "tpu")
    assert tpu.collect is not None
    state, detail = tpu.collect()
    assert state == "off"
    assert "no TPU runtime answers" in detail


def test_golden_exposition_passes_promtool(tmp_path: Path) -> None:
    """Every libtpu metric, as the sidecar exposes it; a fixed clock fixes the latencies."""
    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "golden-run", "name": "golden", "host": "tpu-vm-0"})
    )
    with FakeTpuRuntime(default_script(4), "127.0.0.1:0", clock=lambda: 1000.0) as fake:
        settings = Settings(sources=["tpu"], tpu_metrics_addr=fake.addr, shared_dir=tmp_path)
        t = telemetry()
        sources = AcceleratorSources(settings, t.meter, registry=t.registry)
        collect = sources.runs[0].collect
        assert collect is not None
        assert collect()[0] == "ok"
        assert sources.runs[0].skipped is not None and sources.runs[0].skipped() == []
    text = generate_latest(t.registry).decode()
    # Every libtpu entry of the catalogue is there, with its counters.
    emitted = {s.name for family in t.registry.collect() for s in family.samples}
    expected = {prometheus_name(METRICS[m.metric]) for m in RUNTIME_METRICS}
    expected |= {
        prometheus_name(METRICS[m.metric.rsplit(".", 1)[0] + suffix])
        for m in RUNTIME_METRICS
        if m.counters
        for suffix in (".count", ".time")
    }
    # ... and each distribution as a histogram (_bucket, _sum, _count).
    expected |= {
        histogram_name(m.metric) + suffix
        for m in RUNTIME_METRICS
        if m.distribution
        for suffix in ("_bucket", "_sum", "_count")
    }
    assert expected <= emitted, sorted(expected - emitted)
    if os.environ.get("REGENERATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "regenerate tests/fixtures/tpu_4chips.prom if intended"
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install prometheus (see scripts/system-deps.sh)"
    for exposition in (text, GOLDEN.read_text()):
        result = subprocess.run(
            [promtool, "check", "metrics"], input=exposition, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_slow_runtime_does_not_block_metrics(tmp_path: Path) -> None:
    from exporter.api.app import create_app
    from exporter.sidecar import Sidecar

    with FakeTpuRuntime(default_script(4), "127.0.0.1:0") as fake:
        settings = Settings(
            sources=["tpu"],
            tpu_metrics_addr=fake.addr,
            shared_dir=tmp_path / "shared",
            store=str(tmp_path / "store"),
            collect_interval_s=1.0,
        )
        sidecar = Sidecar(settings, telemetry())
        with TestClient(create_app(sidecar), base_url="http://127.0.0.1") as client:
            wait_until(
                lambda: 'chip="3"' in client.get("/metrics").text, what="first TPU collection"
            )
            fake.delay_s = 30.0  # every later call hangs far past the source's deadline
            wait_until(lambda: fake.in_flight > 0, what="a collection stuck in the slow runtime")
            body = client.get("/metrics").text
            assert 'accelerator_duty_cycle{accelerator="tpu",chip="0"' in body
            wait_until(
                lambda: (
                    client.get("/readyz").json()["components"]["source.tpu"]["state"] == "error"
                ),
                what="the source to report the deadline",
            )
            ready = client.get("/readyz").json()
            assert "DEADLINE_EXCEEDED" in ready["components"]["source.tpu"]["detail"]
            fake.delay_s = 0.0


def test_tensorcore_utilization_only_where_the_runtime_offers_it(tmp_path: Path) -> None:
    with FakeTpuRuntime(default_script(2), "127.0.0.1:0", tensorcore_util=False) as fake:
        t = telemetry()
        assert tpu_source(fake.addr, t, tmp_path, Clock()).collect()[0] == "ok"
    assert sample(t, "accelerator_duty_cycle", "1") == pytest.approx(0.85)
    assert sample(t, "accelerator_tensorcore_utilization", "1") is None
    # ListSupportedMetrics and the metrics it lists: nothing is asked for in vain.
    assert fake.requests == 1 + len(fake.offered)


def test_hbm_capacity_is_not_asked_for_every_interval(fake: FakeTpuRuntime, tmp_path: Path) -> None:
    t = telemetry()
    source = tpu_source(fake.addr, t, tmp_path, Clock())
    source.collect()
    first = fake.requests  # ListSupportedMetrics + every metric
    source.collect()
    # The second interval: neither the capacity nor the distributions (read every 15 s).
    gauges = [m for m in RUNTIME_METRICS if not m.distribution]
    assert (first, fake.requests - first) == (1 + len(ALL_METRICS), len(gauges) - 1)
    assert sample(t, "accelerator_memory_limit_bytes", "3") == 16 * GIB  # still published
    # So are the last percentiles, until the next read of the distributions.
    labels = {"chip": "3", "core_type": "tensor_core", "percentile": "p50"}
    labels |= {"source": "libtpu", "accelerator": "tpu", "host": "tpu-vm-0"}
    assert t.registry.get_sample_value("accelerator_hlo_execution_latency_seconds", labels)


# -- the whole TPU Monitoring Library set ------------------------------------------------

# tpu-info's name of each distribution -> (our Prometheus name, fixed labels, value factor).
TPU_INFO_DISTRIBUTIONS = {
    "buffer_transfer_latency": ("tpu_dcn_transfer_latency_seconds", {"direction": "outbound"}),
    "inbound_buffer_transfer_latency": (
        "tpu_dcn_transfer_latency_seconds",
        {"direction": "inbound"},
    ),
    "host_to_device_transfer_latency": (
        "accelerator_host_transfer_latency_seconds",
        {"direction": "host_to_device"},
    ),
    "device_to_host_transfer_latency": (
        "accelerator_host_transfer_latency_seconds",
        {"direction": "device_to_host"},
    ),
    "collective_e2e_latency": ("accelerator_collective_latency_seconds", {}),
    "host_compute_latency": ("tpu_host_compute_latency_seconds", {}),
    "grpc_tcp_min_rtt": ("tpu_dcn_tcp_min_rtt_seconds", {}),
    "grpc_tcp_delivery_rate": ("tpu_dcn_tcp_delivery_rate_bytes_per_second", {}),
}
TPU_INFO_READ_ALL = """
import json, sys
from tpu_info import metrics
addr, names = sys.argv[1], sys.argv[2].split(",")
print(json.dumps({
    "usage": [list(u) for u in metrics.get_chip_usage_new(None, addr=addr)],
    "hbm_util": metrics.get_runtime_hbm_utilization(addr),
    "idle": metrics.get_tensorcore_idle_duration(addr),
    "queue": [list(q) for q in metrics.get_hlo_queue_size(None, addr)],
    "hlo": [list(h) for h in metrics.get_hlo_exec_timing(None, addr)],
    "latency": {n: [list(d) for d in metrics.get_transfer_latency(n, addr)] for n in names},
}))
"""


def test_every_metric_equals_what_tpu_info_computes(tmp_path: Path) -> None:
    """tpu-info's own client and percentile code, on the same runtime, give our numbers.

    tpu-info's generated stub and client code (not ours) talk to the fake, in a
    subprocess: its generated modules and ours register the same proto package, which
    one descriptor pool refuses. The fake's clock stands still, so both read the same
    cumulative distributions; our first collection has no older snapshot, so its window
    is "since the runtime started", which is what tpu-info shows.
    """
    with FakeTpuRuntime(default_script(4), "127.0.0.1:0", clock=lambda: 1000.0) as fake:
        t = telemetry()
        assert tpu_source(fake.addr, t, tmp_path, Clock()).collect()[0] == "ok"
        result = subprocess.run(
            [sys.executable, "-c", TPU_INFO_READ_ALL, fake.addr, ",".join(TPU_INFO_DISTRIBUTIONS)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    ref = json.loads(result.stdout)
    assert ref["usage"] == [
        [0, 4 * GIB, 16 * GIB, 95.0],
        [1, 5 * GIB, 16 * GIB, 85.0],
        [2, 6 * GIB, 16 * GIB, 75.0],
        [3, 7 * GIB, 16 * GIB, 65.0],
    ]
    host = {"source": "libtpu", "accelerator": "tpu", "host": "tpu-vm-0"}
    get = t.registry.get_sample_value
    for chip, percent in ref["hbm_util"]:
        ours = sample(t, "accelerator_memory_bandwidth_utilization", str(chip))
        assert ours == pytest.approx(percent / 100)
    for chip, seconds in ref["idle"]:
        assert sample(t, "accelerator_tensorcore_idle_duration_seconds", str(chip)) == seconds
    assert len(ref["queue"]) == 4
    for chip, size in ref["queue"]:
        labels = host | {"chip": str(chip), "core_type": "tensor_core"}
        assert get("accelerator_hlo_queue_size", labels) == size
    assert len(ref["hlo"]) == 4
    for chip, mean_us, *percentiles_us in ref["hlo"]:
        labels = host | {"chip": str(chip), "core_type": "tensor_core"}
        for (label, _), value_us in zip(PERCENTILES, percentiles_us, strict=True):
            ours = get("accelerator_hlo_execution_latency_seconds", labels | {"percentile": label})
            assert ours == pytest.approx(value_us / 1e6, rel=1e-9), (chip, label)
        count = get("accelerator_hlo_execution_count_total", labels)
        time_s = get("accelerator_hlo_execution_time_seconds_total", labels)
        assert count is not None and count > 0 and time_s is not None
        assert time_s / count == pytest.approx(mean_us / 1e6, rel=1e-9)
    for name, (metric, fixed) in TPU_INFO_DISTRIBUTIONS.items():
        rows = ref["latency"][name]
        assert rows, name
        factor = 125_000 if "delivery_rate" in name else 1e-6  # Mbit/s -> B/s, us -> s
        for size, *values in rows:
            labels = host | fixed | ({} if size == "N/A" else {"buffer_size": size})
            for (label, _), value in zip(PERCENTILES, values, strict=True):
                ours = get(metric, labels | {"percentile": label})
                assert ours == pytest.approx(value * factor, rel=1e-9), (name, size, label)


def test_metrics_an_older_libtpu_lacks_are_skipped_once_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.metrics.tpu")
    with FakeTpuRuntime(default_script(2), "127.0.0.1:0", offered=BASIC_METRICS) as fake:
        t = telemetry()
        source = tpu_source(fake.addr, t, tmp_path, Clock())
        for _ in range(3):
            assert source.collect()[0] == "ok"
        # Only what the runtime lists is asked for (HBM capacity once a minute).
        assert fake.requests == 1 + len(BASIC_METRICS) + 2 * (len(BASIC_METRICS) - 1)
    not_offered = sorted(set(ALL_METRICS) - set(BASIC_METRICS))
    assert source.skipped() == not_offered
    lines = [r.getMessage() for r in caplog.records if "does not offer" in r.getMessage()]
    assert sorted(line.split(" does not offer ")[1].split(":")[0] for line in lines) == not_offered
    assert sample(t, "accelerator_duty_cycle", "1") == pytest.approx(0.85)
    assert t.registry.get_sample_value("tpu_dcn_tcp_min_rtt_seconds", {"percentile": "p50"}) is None


def test_without_a_metric_list_not_found_answers_are_skipped(tmp_path: Path) -> None:
    with FakeTpuRuntime(
        default_script(2), "127.0.0.1:0", offered=BASIC_METRICS, list_supported=False
    ) as fake:
        t = telemetry()
        source = tpu_source(fake.addr, t, tmp_path, Clock())
        assert source.collect()[0] == "ok"
        first = fake.requests  # the listing, then every metric once (one name per entry)
        assert source.collect()[0] == "ok"
        second = fake.requests - first
    assert first == 1 + len(RUNTIME_METRICS)
    assert second == len(BASIC_METRICS) - 1  # HBM capacity is re-read only every minute
    assert source.skipped() == sorted(set(ALL_METRICS) - set(BASIC_METRICS))
    assert sample(t, "accelerator_tensorcore_utilization", "0") == pytest.approx(0.6)


def test_skipped_metrics_are_listed_in_readyz(tmp_path: Path) -> None:
    from exporter.api.app import create_app
    from exporter.sidecar import Sidecar

    with FakeTpuRuntime(default_script(1), "127.0.0.1:0", offered=BASIC_METRICS) as fake:
        settings = Settings(
            sources=["tpu"],
            tpu_metrics_addr=fake.addr,
            shared_dir=tmp_path / "shared",
            store=str(tmp_path / "store"),
            collect_interval_s=0.2,
        )
        with TestClient(
            create_app(Sidecar(settings, telemetry())), base_url="http://127.0.0.1"
        ) as client:
            component = wait_until(
                lambda: (
                    (c := client.get("/readyz").json()["components"]["source.tpu"])
                    and c["state"] == "ok"
                    and c
                ),
                what="a TPU collection",
            )
    assert component["skipped"] == sorted(set(ALL_METRICS) - set(BASIC_METRICS))
    assert "metrics not offered" in component["detail"]


def test_percentiles_follow_a_dcn_regression_that_cumulative_ones_hide(tmp_path: Path) -> None:
    """After the window passes, percentiles describe recent transfers only."""
    clock = Clock()
    fast, slow = FakeFrame((90.0,), (GIB,)), FakeFrame((90.0,), (GIB,), latency_scale=3.0)
    # 30 minutes at normal latency (plus the fake's 10 minutes of history), then 3x slower.
    script = FakeTpuScript(1, 16 * GIB, 1800.0, (fast, slow))
    labels = {"source": "libtpu", "accelerator": "tpu", "host": "tpu-vm-0"}
    labels |= {"direction": "outbound", "buffer_size": "8MB+", "percentile": "p50"}
    with FakeTpuRuntime(script, "127.0.0.1:0", clock=clock) as fake:
        t = telemetry()
        series = DeviceSeries("libtpu", "tpu", stale_after_s=15.0, clock=clock)
        accelerator_gauges(t.meter).add_series(series)
        source = TpuSource(
            TpuRuntimeClient(fake.addr), series, RunIdentity(tmp_path, "tpu-vm-0"), clock=clock
        )
        p50 = []
        for _ in range(8):  # every 5 minutes, across the change at 30 min
            clock.now += 300
            source.collect()
            p50.append(t.registry.get_sample_value("tpu_dcn_transfer_latency_seconds", labels))
    before, after = p50[4], p50[-1]  # at 25 min (all fast), at 40 min (window all slow)
    assert before == pytest.approx(0.109, rel=0.05)
    assert after == pytest.approx(3 * 0.109, rel=0.05)
    # What tpu-info (the cumulative distribution) shows at 40 min: still near normal.
    with FakeTpuRuntime(script, "127.0.0.1:0", clock=clock) as reference:
        t2 = telemetry()
        tpu_source(reference.addr, t2, tmp_path, Clock()).collect()
    assert t2.registry.get_sample_value("tpu_dcn_transfer_latency_seconds", labels) < 1.5 * before


def test_distributions_are_histograms_with_libtpus_bounds_in_seconds(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.faketpu_latencies import BUCKET_GROWTH, BUCKET_SCALE, FINITE_BUCKETS

    with FakeTpuRuntime(default_script(4), "127.0.0.1:0") as fake:
        settings = Settings(sources=["tpu"], tpu_metrics_addr=fake.addr, shared_dir=tmp_path)
        t = telemetry()
        sources = AcceleratorSources(settings, t.meter, registry=t.registry)
        collect = sources.runs[0].collect
        assert collect is not None and collect()[0] == "ok"
    text = generate_latest(t.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    histogram = families["accelerator_collective_latency_distribution_seconds"]
    assert histogram.type == "histogram"
    by_series: dict[str, dict[str, float]] = {}
    series_labels: dict[str, dict[str, str]] = {}
    for s in histogram.samples:
        series_labels[s.labels["buffer_size"]] = {k: v for k, v in s.labels.items() if k != "le"}
        size = s.labels["buffer_size"]
        key = s.name.rsplit("_", 1)[1] + s.labels.get("le", "")
        by_series.setdefault(size, {})[key] = s.value
    assert set(by_series) == {"1MB+", "4MB+", "8MB+"}
    libtpu_bounds = [BUCKET_SCALE * BUCKET_GROWTH**i / 1e6 for i in range(FINITE_BUCKETS + 1)]
    for size, values in by_series.items():
        labels = series_labels[size]
        les = [float(k[len("bucket") :]) for k in values if k.startswith("bucket")]
        assert les[:-1] == pytest.approx(libtpu_bounds) and les[-1] == math.inf
        cumulative = [values[k] for k in values if k.startswith("bucket")]
        assert cumulative == sorted(cumulative) and cumulative[-1] == values["count"] > 0
        # _count and _sum are the count and total-time counters OTLP also gets.
        assert values["count"] == t.registry.get_sample_value(
            "accelerator_collective_count_total", labels
        )
        assert values["sum"] == t.registry.get_sample_value(
            "accelerator_collective_time_seconds_total", labels
        )
        # The p50 gauge lies in the bucket where the cumulative count passes half.
        p50 = t.registry.get_sample_value(
            "accelerator_collective_latency_seconds", labels | {"percentile": "p50"}
        )
        i = next(i for i, c in enumerate(cumulative) if c >= values["count"] / 2)
        assert p50 is not None and (les[i - 1] if i else 0) <= p50 <= les[i]
    # Per-chip distributions are summed per host (the per-chip percentiles stay): one
    # series of buckets per core type, whose count is the chips' counters added up.
    hlo = families["accelerator_hlo_execution_latency_distribution_seconds"]
    assert all("chip" not in s.labels for s in hlo.samples)
    (hlo_count,) = [s for s in hlo.samples if s.name.endswith("_count")]
    per_chip = [
        s.value
        for f in families.values()
        if f.name == "accelerator_hlo_execution_count"
        for s in f.samples
        if s.name.endswith("_total")
    ]
    assert len(per_chip) == 4 and hlo_count.value == sum(per_chip) > 0
