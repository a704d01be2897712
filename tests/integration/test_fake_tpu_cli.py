"""The issue's acceptance: `mlprof fake-tpu --chips 4` and `mlprof serve` as real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Proc, free_port, wait_http, wait_until

pytestmark = pytest.mark.integration

GIB = 1 << 30


def tpu_series(url: str) -> dict[tuple[str, str], float]:
    """(metric, chip) -> value of the per-chip libtpu series on /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {
        (s.name, s.labels["chip"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("source") == "libtpu" and "chip" in s.labels  # DCN series: the host's
    }


def test_serve_shows_the_fake_tpus_chips(tmp_path: Path) -> None:
    tpu_port, http_port = free_port(), free_port()
    fake = Proc.python(
        ["-m", "exporter.cli", "fake-tpu", "--chips", "4", "--listen", f"127.0.0.1:{tpu_port}"],
        tmp_path / "fake.log",
    )
    env = {
        "MLPROF_LISTEN": f"127.0.0.1:{http_port}",
        "MLPROF_SHARED_DIR": str(tmp_path / "shared"),
        "MLPROF_STORE": str(tmp_path / "store"),
        "MLPROF_TPU_METRICS_ADDR": f"127.0.0.1:{tpu_port}",
        "MLPROF_COLLECT_INTERVAL_S": "0.5",
    }
    sidecar = Proc.python(["-m", "exporter.cli", "serve"], tmp_path / "sidecar.log", env=env)
    url = f"http://127.0.0.1:{http_port}"
    try:
        wait_http(f"{url}/healthz", timeout=60)
        series = wait_until(
            lambda: (s := tpu_series(url)) and len(s) >= 16 and s,
            timeout=60,
            what="four chips on /metrics",
        )
        banner = fake.output()
        assert f"4 chips on 127.0.0.1:{tpu_port}" in banner
        for chip in range(4):
            c = str(chip)
            assert series[("accelerator_duty_cycle", c)] == pytest.approx((95 - 10 * chip) / 100)
            assert series[("accelerator_memory_usage_bytes", c)] == (4 + chip) * GIB
            assert series[("accelerator_memory_limit_bytes", c)] == 16 * GIB
            # The fake prints what it serves: the same numbers a user compares by eye.
            assert f"{95 - 10 * chip:g}%" in banner
        assert {chip for _, chip in series} == {"0", "1", "2", "3"}
        ready = httpx.get(f"{url}/readyz", timeout=5).json()
        components = ready["components"]
        assert components["source.tpu"]["state"] == "ok"
        assert components["source.tpu"]["skipped"] == []  # the fake offers every metric
        assert "serving 16 of 16 libtpu runtime metrics" in banner
        assert components["source.nvml"]["state"] == "off"  # no NVML on this machine
        # No workload writes memory lines here: the JAX source waits for data (issue 11).
        assert components["source.jax"]["state"] == "waiting"
    finally:
        sidecar.stop()
        fake.stop()
    assert fake.popen.returncode == 0, fake.output()


def test_fake_tpu_bad_script_is_one_line(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("frames:\n  - duty_cycle_percent: [90, high]\n")
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "fake-tpu", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"mlprof: --script {script}: frames[0].duty_cycle_percent: "
        "expected numbers or null, got 'high'"
    )
