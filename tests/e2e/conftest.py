"""One end-to-end environment for the whole e2e folder (package-scoped: started once, and
stopped when the folder's last test is done, so its workload, sidecars and Prometheus
do not keep loading the machine under the rest of the suite).

Debian's Prometheus (the shipped alert rules shortened by ``alerts/overrides/e2e.yaml``,
and the shipped recording rules) and Alertmanager on loopback; three sidecars of one run:

- the demo workload's host: the JAX demo (profiler server on, host CPU profiling on)
  and its sidecar with the capture engine and the ``log`` event sink, pushing flame
  graphs to the test Pyroscope receiver and forwarding the workload's pyroscope-io
  uploads there (the workload has no Pyroscope address: it finds the sidecar's);
- a TPU host: ``mlprof fake-tpu`` (the real libtpu metrics gRPC service, scripted values)
  and its own sidecar, whose shared dir holds the run's ``run.json`` as the SDK writes it
  on every host of a multi-host run;
- a GPU host: the sidecar with the NVML double as ``pynvml`` (tests/nvml_sidecar.py),
  its ``run.json`` naming this test process, which the double reports as the run's
  process on its GPUs.

The TPU and GPU hosts run no workload of their own: their chips are other hosts of the
same run, so the demo host's duty cycle (the SDK estimate) still drives the alert test.

``alert_loop`` runs the alert → capture → flame graph scenario once, for whichever test
asks first (tests/e2e/test_alert_to_capture.py, test_dashboards_live.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alerts.recording import RECORDING_FILE
from alerts.render import load_overrides, render_alertmanager_config, render_rules
from tests.harness import ROOT, Proc, free_port, wait_http
from tests.pyroscope_receiver import PyroscopeReceiver

TOKEN = "e2e-alert-token"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
E2E_OVERRIDES = ROOT / "alerts" / "overrides" / "e2e.yaml"
WORKLOAD = "demo-mlp"
TPU_HOST = "tpu-host-1"
GPU_HOST = "gpu-host-1"
SCRAPE_INTERVAL_S = 1


def binary(path: str) -> str:
    found = shutil.which(path)
    if found is None:
        raise AssertionError(
            f"{path} not found: install Debian's prometheus and prometheus-alertmanager"
        )
    return found


@dataclass
class Stack:
    tmp: Path
    shared: Path
    store: Path
    sidecar_url: str
    tpu_sidecar_url: str
    gpu_sidecar_url: str
    prometheus_url: str
    alertmanager_url: str
    receiver: PyroscopeReceiver
    procs: dict[str, Proc]
    run_id: str
    started: float
    results: dict[str, Any] = field(default_factory=dict)
    # One connection pool for the many queries (a client per query costs more than most
    # queries do).
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def logs(self) -> str:
        return "\n".join(
            f"--- {name} (pid {p.pid}, alive {p.alive()}):\n{p.output()[-2500:]}"
            for name, p in self.procs.items()
        )


def prometheus_config(sidecars: list[str], alertmanager: str, rules: list[Path]) -> dict[str, Any]:
    interval = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(r) for r in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {
                "job_name": "mlprof",
                "scrape_interval": interval,
                "authorization": {"credentials": TOKEN},
                "static_configs": [{"targets": sidecars}],
            }
        ],
    }


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    prometheus, alertmanager = binary(PROMETHEUS), binary(ALERTMANAGER)
    shared, store = tmp / "shared", tmp / "store"
    tpu_shared, gpu_shared = tmp / "tpu-shared", tmp / "gpu-shared"
    sidecar_port, tpu_sidecar_port, profiler_port = free_port(), free_port(), free_port()
    gpu_sidecar_port = free_port()
    prom_port, am_port, tpu_port = free_port(), free_port(), free_port()
    sidecar_addr = f"127.0.0.1:{sidecar_port}"
    tpu_sidecar_addr = f"127.0.0.1:{tpu_sidecar_port}"
    gpu_sidecar_addr = f"127.0.0.1:{gpu_sidecar_port}"
    run_id = f"e2e-{secrets.token_hex(4)}"  # one run, three hosts (MLPROF_RUN_ID)
    procs: dict[str, Proc] = {}
    receiver = PyroscopeReceiver().start()
    started = time.time()
    try:
        common = {
            "MLPROF_AUTH_TOKEN": TOKEN,
            "MLPROF_COLLECT_INTERVAL_S": "1",
            "MLPROF_DUTY_CYCLE_WINDOW_S": "5",
            "MLPROF_DISCOVERY_INTERVAL_S": "1",
            "MLPROF_PYROSCOPE_URL": receiver.url,
            "JAX_PLATFORMS": "cpu",
        }
        env = {
            **common,
            "MLPROF_LISTEN": sidecar_addr,
            "MLPROF_SHARED_DIR": str(shared),
            "MLPROF_STORE": str(store),
            "MLPROF_RUN_ID": run_id,
        }
        # Host CPU profiles through the sidecar: no Pyroscope address of its own, uploads
        # every second (the default 10 s would outlast the scenario's first minute).
        host_profiling = {
            "MLPROF_PYROSCOPE_URL": "",
            "MLPROF_HOST_PROFILING": "1",
            "MLPROF_HOST_PROFILING_UPLOAD_INTERVAL_S": "1",
        }
        procs["workload"] = Proc.python(
            ["-m", "exporter.demo.workload", "--shared-dir", str(shared), "--name", WORKLOAD,
             "--profiler-port", str(profiler_port),
             "--batch", "64", "--features", "64", "--hidden", "128",
             # CPU is in no chip table: a nominal peak, so MFU (from XLA's FLOPs) shows.
             "--peak-flops", "1e11"],
            tmp / "workload.log",
            env={**env, **host_profiling},
        )  # fmt: skip
        procs["sidecar"] = Proc.python(
            ["-m", "exporter.cli", "serve"],
            tmp / "sidecar.log",
            env={**env, "MLPROF_EVENTS": "log"},
        )

        procs["fake-tpu"] = Proc.python(
            ["-m", "exporter.cli", "fake-tpu", "--chips", "4", "--listen",
             f"127.0.0.1:{tpu_port}"],
            tmp / "fake-tpu.log",
        )  # fmt: skip
        tpu_shared.mkdir()
        # What sdk.run writes on every host of a multi-host run (the TPU host's workload
        # itself is not run here: its chips are what this host contributes).
        (tpu_shared / "run.json").write_text(
            json.dumps({"run_id": run_id, "name": WORKLOAD, "host": TPU_HOST}), encoding="utf-8"
        )
        procs["tpu-sidecar"] = Proc.python(
            ["-m", "exporter.cli", "serve"],
            tmp / "tpu-sidecar.log",
            env={
                **common,
                "MLPROF_LISTEN": tpu_sidecar_addr,
                "MLPROF_SHARED_DIR": str(tpu_shared),
                "MLPROF_STORE": str(tmp / "tpu-store"),
                "MLPROF_TPU_METRICS_ADDR": f"127.0.0.1:{tpu_port}",
            },
        )

        gpu_shared.mkdir()
        (gpu_shared / "run.json").write_text(
            json.dumps({"run_id": run_id, "name": WORKLOAD, "host": GPU_HOST,
                        "pid": os.getpid(), "start_unix": time.time()}),
            encoding="utf-8",
        )  # fmt: skip
        procs["gpu-sidecar"] = Proc.python(
            ["-m", "tests.nvml_sidecar"],
            tmp / "gpu-sidecar.log",
            env={
                **common,
                "MLPROF_LISTEN": gpu_sidecar_addr,
                "MLPROF_SHARED_DIR": str(gpu_shared),
                "MLPROF_STORE": str(tmp / "gpu-store"),
                "MLPROF_SOURCES": "nvml",
            },
        )

        am_config = render_alertmanager_config(f"http://{sidecar_addr}/api/v1/alertmanager", TOKEN)
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
        procs["alertmanager"] = Proc(
            [alertmanager,
             f"--config.file={tmp / 'alertmanager.yml'}",
             f"--storage.path={tmp / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{am_port}",
             "--cluster.listen-address=",
             "--log.level=info"],
            tmp / "alertmanager.log",
        )  # fmt: skip

        rules = tmp / "rules.yml"
        rules.write_text(render_rules(load_overrides(E2E_OVERRIDES)), encoding="utf-8")
        config = prometheus_config(
            [sidecar_addr, tpu_sidecar_addr, gpu_sidecar_addr],
            f"127.0.0.1:{am_port}",
            [rules, RECORDING_FILE],
        )
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        procs["prometheus"] = Proc(
            [prometheus,
             f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}",
             "--rules.alert.resend-delay=1s",
             "--log.level=info"],
            tmp / "prometheus.log",
        )  # fmt: skip
        stack = Stack(
            tmp,
            shared,
            store,
            f"http://{sidecar_addr}",
            f"http://{tpu_sidecar_addr}",
            f"http://{gpu_sidecar_addr}",
            f"http://127.0.0.1:{prom_port}",
            f"http://127.0.0.1:{am_port}",
            receiver,
            procs,
            run_id,
            started,
        )
        try:
            wait_http(f"{stack.alertmanager_url}/-/ready", timeout=30)
            wait_http(f"{stack.prometheus_url}/-/ready", timeout=30)
            wait_http(f"{stack.sidecar_url}/healthz", timeout=60)
            wait_http(f"{stack.tpu_sidecar_url}/healthz", timeout=60)
            wait_http(f"{stack.gpu_sidecar_url}/healthz", timeout=60)
        except AssertionError:
            print(stack.logs())
            raise
        yield stack
        stack.http.close()
        print(stack.logs())
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()
        receiver.stop()


def prom_get(stack: Stack, path: str, **params: Any) -> Any:
    response = stack.http.get(f"{stack.prometheus_url}{path}", params=params)
    response.raise_for_status()
    return response.json()["data"]


@pytest.fixture(scope="package")
def alert_loop(stack: Stack) -> dict[str, Any]:
    """The alert → capture → flame graph scenario, run once; returns what it produced."""
    from tests.e2e.test_alert_to_capture import run_loop

    if "alert_loop" not in stack.results:
        try:
            stack.results["alert_loop"] = run_loop(stack)
        except AssertionError:
            print(stack.logs())
            raise
    return stack.results["alert_loop"]  # type: ignore[no-any-return]
