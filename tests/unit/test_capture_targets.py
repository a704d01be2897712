"""Target discovery: static, run.json, DNS (the real resolver), k8s (an API double)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from exporter.capture.targets import (
    DnsDiscovery,
    K8sDiscovery,
    LocalRunDiscovery,
    ProfilerTarget,
    StaticDiscovery,
    TargetRegistry,
)


def test_static_targets_default_port_and_ipv6() -> None:
    found = StaticDiscovery(["10.0.0.1", "worker-1:7000", "[::1]:9000"]).discover()
    assert [(t.address, t.host, t.source) for t in found] == [
        ("10.0.0.1:9999", "10.0.0.1", "static"),
        ("worker-1:7000", "worker-1", "static"),
        ("[::1]:9000", "::1", "static"),
    ]
    assert found[2].file_stem() == "::1_9000"


def _run_file(shared: Path, run_id: str, port: int | None, pid: int, **extra: Any) -> None:
    info = {
        "run_id": run_id,
        "name": f"w-{run_id}",
        "host": "trainer-0",
        "pid": pid,
        "profiler_port": port,
        "start_unix": 1000.0 + pid,
        "system": {"backend": "tpu"},
    }
    (shared / "runs").mkdir(exist_ok=True)
    (shared / "runs" / f"{run_id}.json").write_text(json.dumps(info | extra))
    (shared / "steps").mkdir(exist_ok=True)
    (shared / "steps" / f"trainer-0-{pid}.jsonl").touch()  # the SDK's heartbeat


def test_local_discovery_lists_every_live_run(tmp_path: Path) -> None:
    """Issue 11 B: every live run of runs/*.json, not only the newest run.json."""
    discovery = LocalRunDiscovery(tmp_path)
    assert discovery.discover() == []
    _run_file(tmp_path, "r1", 9123, pid=11)
    _run_file(tmp_path, "r2", 9124, pid=12)
    _run_file(tmp_path, "ended", 9125, pid=13, ended_unix=2000.0)  # closed: no target
    _run_file(tmp_path, "stale", 9126, pid=14)
    os.utime(tmp_path / "steps" / "trainer-0-14.jsonl", (1.0, 1.0))  # killed long ago
    _run_file(tmp_path, "later", 9123, pid=15)  # its bind of 9123 failed: r1 holds it
    _run_file(tmp_path, "no-profiler", None, pid=16)
    (tmp_path / "runs" / "half.json").write_text("{half")  # being written: skipped
    os.mkfifo(tmp_path / "runs" / "fifo.json")  # never opened for reading
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "ended", "profiler_port": 9125}))
    assert discovery.discover() == [
        ProfilerTarget("127.0.0.1:9123", "trainer-0", "r1", "local", "tpu", "w-r1"),
        ProfilerTarget("127.0.0.1:9124", "trainer-0", "r2", "local", "tpu", "w-r2"),
    ]


def test_a_process_record_speaks_for_its_process(tmp_path: Path) -> None:
    """procs/<host>-<pid>.json over the run's shared record: that file is the last
    writer's, and may not say that this process ended."""
    _run_file(tmp_path, "r1", 9123, pid=11)  # runs/r1.json: written by pid 11, live
    procs = tmp_path / "procs"
    procs.mkdir()
    record = json.loads((tmp_path / "runs" / "r1.json").read_text())
    (procs / "trainer-0-11.json").write_text(json.dumps(record | {"ended_unix": 2000.0}))
    (procs / "trainer-0-12.json").write_text(
        json.dumps(record | {"pid": 12, "profiler_port": 9124})
    )
    (tmp_path / "steps" / "trainer-0-12.jsonl").touch()
    os.mkfifo(procs / "trainer-0-13.json")  # never opened for reading
    assert [(t.address, t.run_id) for t in LocalRunDiscovery(tmp_path).discover()] == [
        ("127.0.0.1:9124", "r1")
    ]


def test_targets_found_twice_merge_their_facts(tmp_path: Path) -> None:
    """Issue 11 B: a static address that is also a local run keeps the run's identity."""
    _run_file(tmp_path, "r1", 9123, pid=11)
    registry = TargetRegistry([StaticDiscovery(["127.0.0.1:9123"]), LocalRunDiscovery(tmp_path)])
    registry.refresh(check=False)
    (target,) = registry.known()
    assert target == ProfilerTarget(
        "127.0.0.1:9123", "trainer-0", "r1", "static+local", "tpu", "w-r1"
    )
    assert [t.address for t in registry.select(run_id="r1")] == ["127.0.0.1:9123"]


def test_current_facts_follow_the_run_that_owns_the_port_now(tmp_path: Path) -> None:
    """Issue 11 B: a capture is labelled with the run whose server it traces."""
    _run_file(tmp_path, "old", 9123, pid=11)
    registry = TargetRegistry([LocalRunDiscovery(tmp_path)])
    registry.refresh(check=False)
    (stale,) = registry.known()
    _run_file(tmp_path, "old", 9123, pid=11, ended_unix=2000.0)
    _run_file(tmp_path, "new", 9123, pid=12)
    assert [t.run_id for t in registry.current([stale])] == ["new"]
    _run_file(tmp_path, "new", 9123, pid=12, ended_unix=2001.0)
    assert [(t.address, t.run_id) for t in registry.current([stale])] == [("127.0.0.1:9123", None)]


def test_dns_lists_every_address_of_the_name() -> None:
    found = DnsDiscovery("localhost", 9999).discover()
    assert "127.0.0.1:9999" in {t.address for t in found}
    assert all(t.source == "dns" for t in found)
    with pytest.raises(RuntimeError, match=r"DNS name 'no-such-host\.invalid'"):
        DnsDiscovery("no-such-host.invalid").discover()


def _pod(name: str, ip: str | None, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", **meta},
        "status": {"phase": phase, **({"podIP": ip} if ip else {})},
    }


class _KubeApi:
    """Answers GET /api/v1/namespaces/<ns>/pods like the Kubernetes API (PodList JSON)."""

    def __init__(self, pods: list[dict[str, Any]], token: str) -> None:
        self.pods, self.token, self.requests = pods, token, []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                api.requests.append((url.path, parse_qs(url.query), self.headers["Authorization"]))
                if self.headers["Authorization"] != f"Bearer {api.token}":
                    body, status = {"kind": "Status", "reason": "Unauthorized"}, 401
                elif url.path == "/api/v1/namespaces/ml/pods":
                    body, status = {"kind": "PodList", "apiVersion": "v1", "items": api.pods}, 200
                else:
                    body = {
                        "kind": "Status",
                        "reason": "Forbidden",
                        "message": 'pods is forbidden: User "x" cannot list resource',
                    }
                    status = 403  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def kube() -> Iterator[_KubeApi]:
    pods = [
        _pod("trainer-0", "10.1.0.5", labels={"mlprof.io/run-id": "run-a"}),
        _pod(
            "trainer-1",
            "10.1.0.6",
            annotations={"mlprof.io/profiler-port": "7777", "mlprof.io/run-id": "run-a"},
        ),
        _pod("pending", None, phase="Pending"),
        _pod("leaving", "10.1.0.7", deletionTimestamp="2026-11-29T08:00:00Z"),
    ]
    api = _KubeApi(pods, "sa-token")
    yield api
    api.server.shutdown()


def test_k8s_discovery_lists_running_pods_of_the_selector(kube: _KubeApi) -> None:
    discovery = K8sDiscovery("app=trainer", "ml", kube.url, token="sa-token")
    found = discovery.discover()
    assert found == [
        ProfilerTarget("10.1.0.5:9999", "trainer-0", "run-a", "k8s"),
        ProfilerTarget("10.1.0.6:7777", "trainer-1", "run-a", "k8s"),
    ]
    [(_path, query, auth)] = kube.requests
    assert query == {"labelSelector": ["app=trainer"]} and auth == "Bearer sa-token"


def test_k8s_errors_name_the_rbac(kube: _KubeApi) -> None:
    with pytest.raises(RuntimeError, match=r"answered 403 .*capture-rbac.yaml"):
        K8sDiscovery("app=x", "other", kube.url, token="sa-token").discover()
    with pytest.raises(RuntimeError, match="answered 401"):
        K8sDiscovery("app=x", "ml", kube.url, token="wrong").discover()


def test_k8s_in_cluster_needs_the_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="in-cluster config"):
        K8sDiscovery.in_cluster("app=x", None)


class _Failing:
    name = "flaky"

    def __init__(self) -> None:
        self.fail = False

    def discover(self) -> list[ProfilerTarget]:
        if self.fail:
            raise RuntimeError("API down")
        return [ProfilerTarget("10.0.0.9:9999", "h9", "run-b", "k8s")]


def test_registry_selects_known_targets_only_and_keeps_them_when_a_source_fails() -> None:
    flaky = _Failing()
    registry = TargetRegistry(
        [StaticDiscovery(["127.0.0.1:1"]), flaky, StaticDiscovery(["127.0.0.1:1"])]
    )
    registry.refresh(check=False)
    assert len(registry.known()) == 2  # one per address
    assert [t.host for t in registry.select(run_id="run-b")] == ["h9"]
    assert [t.host for t in registry.select(hosts=["H9"])] == ["h9"]
    assert [t.address for t in registry.select(hosts=["10.0.0.9"])] == ["10.0.0.9:9999"]
    assert registry.select(hosts=["10.0.0.10"]) == []
    assert registry.select(run_id="run-b", hosts=["127.0.0.1"]) == []
    flaky.fail = True
    registry.refresh(check=True)
    assert len(registry.known()) == 2
    assert registry.errors() == {"flaky": "API down"}
    health = registry.health("127.0.0.1:1")
    assert health.reachable is False and "cannot connect" in health.error


def test_shipped_rbac_grants_what_k8s_discovery_uses_and_no_more() -> None:
    import yaml

    from tests.harness import ROOT

    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/capture-rbac.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    [rule] = kinds["Role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    binding = kinds["RoleBinding"]
    assert binding["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == kinds["ServiceAccount"]["metadata"]["name"]
    assert kinds["Service"]["spec"]["clusterIP"] == "None"  # headless: one record per pod


def test_local_runs_of_another_container_are_reached_at_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compose: the runs are the workload container's, not the sidecar's loopback."""
    from exporter.config import load_settings
    from exporter.errors import ConfigError
    from exporter.pipeline.service import discoveries_from_settings

    _run_file(tmp_path, "r1", 9123, pid=11)
    monkeypatch.setenv("MLPROF_SHARED_DIR", str(tmp_path))
    monkeypatch.setenv("MLPROF_LOCAL_TARGETS_HOST", "workload")
    registry = TargetRegistry(discoveries_from_settings(load_settings()))
    registry.refresh(check=False)
    assert [(t.address, t.run_id) for t in registry.known()] == [("workload:9123", "r1")]
    monkeypatch.setenv("MLPROF_LOCAL_TARGETS_HOST", "workload:1/x")
    with pytest.raises(ConfigError, match="MLPROF_LOCAL_TARGETS_HOST"):
        load_settings()
