"""TPU source against the fake libtpu runtime-metrics server on loopback (real gRPC)."""

from __future__ import annotations

import json
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
from exporter.faketpu import FakeTpuRuntime, default_script
from exporter.metrics.accelerator import DeviceSeries, RunIdentity, accelerator_gauges
from exporter.metrics.sources import AcceleratorSources
from exporter.metrics.telemetry import Telemetry, build_telemetry
from exporter.metrics.tpu import HBM_USAGE_METRIC, TpuRuntimeClient, TpuSource
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


def test_golden_exposition_passes_promtool(fake: FakeTpuRuntime, tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "golden-run", "name": "golden", "host": "tpu-vm-0"})
    )
    settings = Settings(sources=["tpu"], tpu_metrics_addr=fake.addr, shared_dir=tmp_path)
    t = telemetry()
    sources = AcceleratorSources(settings, t.meter)
    collect = sources.runs[0].collect
    assert collect is not None
    assert collect()[0] == "ok"
    text = generate_latest(t.registry).decode()
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


def test_tpu_info_client_reads_the_fake(fake: FakeTpuRuntime) -> None:
    """tpu-info's own generated stub and client code (not ours) talk to the fake.

    In a subprocess: tpu-info's and our generated modules register the same proto
    package, which one descriptor pool refuses.
    """
    code = (
        "import sys, json\n"
        "from tpu_info import metrics\n"
        "usage = metrics.get_chip_usage_new(None, addr=sys.argv[1])\n"
        "print(json.dumps([list(u) for u in usage]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, fake.addr], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout)
    assert usage == [
        [0, 4 * GIB, 16 * GIB, 95.0],
        [1, 5 * GIB, 16 * GIB, 85.0],
        [2, 6 * GIB, 16 * GIB, 75.0],
        [3, 7 * GIB, 16 * GIB, 65.0],
    ]


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
    assert fake.requests == 4  # ListSupportedMetrics + the three base metrics, nothing else


def test_hbm_capacity_is_not_asked_for_every_interval(fake: FakeTpuRuntime, tmp_path: Path) -> None:
    t = telemetry()
    source = tpu_source(fake.addr, t, tmp_path, Clock())
    source.collect()
    first = fake.requests  # ListSupportedMetrics + duty, usage, total, tensor-core
    source.collect()
    assert (first, fake.requests - first) == (5, 3)
    assert sample(t, "accelerator_memory_limit_bytes", "3") == 16 * GIB  # still published
