"""The walking skeleton for real: the JAX demo workload and `mlprof serve` as processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import ROOT, Proc, free_port, wait_http, wait_until

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
    # Below 0.35 and below what full speed showed: on a loaded machine full speed itself
    # read 0.35 (CI: the same 0.3499 was taken for both, before the knob took effect).
    slow = wait_until(
        lambda: (
            (d := scrape(f"{url}/metrics").get("accelerator_duty_cycle")) is not None
            and d < min(0.35, 0.8 * fast)
            and d
        ),
        timeout=60,
        what="the duty-cycle estimate to fall after the input pipeline slowed",
    )
    assert slow < fast
    # What the knob really does (issue 11): the input wait before each step rises to the
    # delay while the step time, timed inside run.step(), does not.
    share = wait_until(
        lambda: (w := scrape(f"{url}/metrics").get("train_input_wait_share")) and w > 0.5 and w,
        timeout=60,
        what="train_input_wait_share to rise with the input delay",
    )
    assert share <= 1.0
    metrics = scrape(f"{url}/metrics")
    # One wait observed per step; the waits (at least 0.3 s each since the knob) exist.
    waits, steps = (
        metrics["train_step_wait_seconds_count"],
        metrics["train_step_duration_seconds_count"],
    )
    assert abs(waits - steps) <= 1  # recorded one after the other: a scrape may fall between
    assert metrics["train_step_wait_seconds_sum"] >= 0.3
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
    """``--duration`` counts from the workload's first step, so a second is enough for
    steps to be written however long JAX took to start: counted from the demo's start,
    12 s ran out on a busy 2-core machine before the first step (the log held only its
    mfu_basis and end records), and 1 s always would."""
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "demo", "--duration", "1", "--steps", "0",
         "--profiler-port", "0", "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"http://127.0.0.1:{port}/metrics" in result.stdout
    assert "stopped (workload exit 0)" in result.stdout
    assert "Ctrl-C (or 1s after the first step)" in result.stdout
    steps = list((tmp_path / "mlprof-data" / "shared" / "steps").glob("*.jsonl"))
    assert steps and steps[0].read_text().count('"kind":"step"') > 0
    assert steps[0].read_text().rstrip().splitlines()[-1].startswith('{"kind":"end"')


def test_ctrl_c_stops_the_demo_and_its_workload_cleanly(tmp_path: Path) -> None:
    """Also: the capture command the banner prints runs as printed, from a shell whose
    PATH has no venv (what `make demo` leaves), and XProf's output stays off the console."""
    port, profiler_port = free_port(), free_port()
    # The demo's input knob at 0.05 s (its banner's "slow it down"), set before it starts:
    # the capture holds a few steps, not thousands, so it and its report end in seconds.
    knob = tmp_path / "mlprof-data" / "shared" / "demo-input-delay"
    knob.parent.mkdir(parents=True)
    knob.write_text("0.05")
    demo = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "demo", "--profiler-port", str(profiler_port),
         "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's code
    )  # fmt: skip
    console: list[str] = []
    reader = threading.Thread(target=lambda: console.extend(demo.stdout or []), daemon=True)
    reader.start()
    try:
        printed = wait_until(
            lambda: next((ln for ln in console if ln.startswith("  capture ")), None),
            timeout=60,
            what="the banner's capture line",
        )
        wait_until(
            lambda: scrape(f"http://127.0.0.1:{port}/metrics").get("train_steps_total"),
            timeout=90,
            what="the demo's first steps",
        )
        command = printed.removeprefix("  capture ").strip().replace("2000", "300")
        shell = subprocess.run(
            command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert shell.returncode == 0, (command, shell.stdout, shell.stderr)
        assert ": done" in shell.stdout
        # The report line it prints is where the capture's analysis appears.
        report_url = next(
            ln.split()[1] for ln in shell.stdout.splitlines() if ln.startswith("  report: ")
        )
        report = wait_until(
            lambda: (r := httpx.get(report_url, timeout=10)).status_code == 200 and r.json(),
            timeout=90,
            what="the printed report URL to answer",
        )
        assert report["status"] in {"OPTIMAL", "NEEDS_ATTENTION"}
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        demo.wait(timeout=60)
        reader.join(10)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    out = "".join(console)
    assert demo.returncode == 0, out
    assert "stopped (workload exit 0)" in out
    assert "Aborted" not in out and "Traceback" not in out
    assert "Starting to trace" not in out, "XProf's own output reached the console"
    native = tmp_path / "mlprof-data" / "shared" / "demo-sidecar-native.log"
    assert "Starting to trace" in native.read_text()  # kept, not lost
    log = next((tmp_path / "mlprof-data" / "shared" / "steps").glob("*.jsonl")).read_text()
    assert log.rstrip().splitlines()[-1].startswith('{"kind":"end"')
