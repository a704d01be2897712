"""The walking skeleton for real: the JAX demo workload and `mlprof serve` as processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Proc, free_port, wait_http, wait_until

pytestmark = pytest.mark.integration


def scrape(url: str) -> dict[str, float]:
    """Sample name (with labels) -> value, for the demo run's series."""
    text = httpx.get(url, timeout=5).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("workload") == "demo-mlp":
                out[sample.name] = sample.value
    return out


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Proc, Proc]]:
    tmp = tmp_path_factory.mktemp("demo")
    shared = tmp / "shared"
    port = free_port()
    env = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(shared),
        "MLPROF_STORE": str(tmp / "store"),
        "MLPROF_COLLECT_INTERVAL_S": "0.5",
        "MLPROF_DUTY_CYCLE_WINDOW_S": "3",
    }
    workload = Proc.python(
        ["-m", "exporter.demo.workload", "--shared-dir", str(shared), "--profiler-port", "0",
         "--batch", "64", "--features", "64", "--hidden", "128"],
        tmp / "workload.log",
        env=env,
    )  # fmt: skip
    sidecar = Proc.python(["-m", "exporter.cli", "serve"], tmp / "sidecar.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", timeout=60)
        yield url, shared, workload, sidecar
    finally:
        workload.stop()
        sidecar.stop()


def test_steps_rise_and_duty_cycle_falls_when_input_slows(
    loop: tuple[str, Path, Proc, Proc],
) -> None:
    url, shared, workload, sidecar = loop
    first = wait_until(
        lambda: scrape(f"{url}/metrics").get("train_steps_total"), timeout=90, what="first steps"
    )
    later = wait_until(
        lambda: (v := scrape(f"{url}/metrics").get("train_steps_total", 0)) > first and v,
        timeout=30,
        what="train_steps_total to rise",
    )
    assert later > first
    # Fast input: the step log shows the chip busy most of the time.
    fast = wait_until(
        lambda: (d := scrape(f"{url}/metrics").get("accelerator_duty_cycle")) and d > 0.2 and d,
        timeout=30,
        what="a high duty cycle at full speed",
    )
    (shared / "demo-input-delay").write_text("0.3")
    slow = wait_until(
        lambda: (
            (d := scrape(f"{url}/metrics").get("accelerator_duty_cycle")) is not None
            and d < 0.35
            and d
        ),
        timeout=60,
        what="the duty-cycle estimate to fall after the input pipeline slowed",
    )
    assert slow < fast
    metrics = scrape(f"{url}/metrics")
    assert metrics["mlprof_workload_up"] == 1
    assert metrics["train_loss"] > 0
    assert workload.alive() and sidecar.alive()
    ready = httpx.get(f"{url}/readyz", timeout=5).json()
    assert ready["ready"] is True
    assert ready["components"]["step_log"]["state"] == "ok"


def test_exposition_passes_promtool(loop: tuple[str, Path, Proc, Proc]) -> None:
    url = loop[0]
    wait_until(lambda: scrape(f"{url}/metrics").get("train_loss"), timeout=90, what="loss gauge")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: install Debian's 'prometheus' (make system-deps)"
    text = httpx.get(f"{url}/metrics", timeout=5).text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train_steps_total" in text and 'source="sdk"' in text


def test_openapi_and_docs_are_served(loop: tuple[str, Path, Proc, Proc]) -> None:
    url = loop[0]
    spec = httpx.get(f"{url}/openapi.json", timeout=5).json()
    assert {"/metrics", "/healthz", "/readyz"} <= set(spec["paths"])
    assert httpx.get(f"{url}/docs", timeout=5).status_code == 200


def test_demo_command_runs_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "demo", "--duration", "12", "--steps", "0",
         "--profiler-port", "0", "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"http://127.0.0.1:{port}/metrics" in result.stdout
    assert "stopped (workload exit 0)" in result.stdout
    steps = list((tmp_path / "mlprof-data" / "shared" / "steps").glob("*.jsonl"))
    assert steps and steps[0].read_text().count('"kind":"step"') > 0
    assert steps[0].read_text().rstrip().splitlines()[-1].startswith('{"kind":"end"')


def test_ctrl_c_stops_the_demo_and_its_workload_cleanly(tmp_path: Path) -> None:
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "demo", "--profiler-port", "0",
         "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )  # fmt: skip
    try:
        wait_until(
            lambda: scrape(f"http://127.0.0.1:{port}/metrics").get("train_steps_total"),
            timeout=90,
            what="the demo's first steps",
        )
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        out, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    assert demo.returncode == 0, out
    assert "stopped (workload exit 0)" in out
    assert "Aborted" not in out and "Traceback" not in out
    log = next((tmp_path / "mlprof-data" / "shared" / "steps").glob("*.jsonl")).read_text()
    assert log.rstrip().splitlines()[-1].startswith('{"kind":"end"')
