"""Deployment files agree with the code: settings names and values, mounted files, configs
that Debian's promtool and amtool accept."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import Settings, load_settings
from tests.harness import ROOT

COMPOSE = ROOT / "docker-compose.yml"
K8S_DIR = ROOT / "deploy" / "k8s"


def _k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _check_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, where: str) -> Settings:
    fields = set(Settings.model_fields)
    for name, value in env.items():
        if name.startswith("MLPROF_") and name not in {"MLPROF_RUN_ID", "MLPROF_CONFIG"}:
            field = name.removeprefix("MLPROF_").lower()
            assert field in fields, f"{where}: {name} is not a setting"
            monkeypatch.setenv(name, value)
    return load_settings()


def test_compose_sidecar_environment_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    env = {
        k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(v))
        for k, v in compose["services"]["sidecar"]["environment"].items()
    }
    settings = _check_env(env, monkeypatch, "docker-compose sidecar")
    assert settings.listen_host == "0.0.0.0" and settings.token  # off loopback only with a token
    target_hosts = {t.split(":")[0] for t in settings.targets}
    assert target_hosts <= set(compose["services"]), "targets must name compose services"
    # The runs in the shared volume are the workload container's: reached by its name.
    assert settings.local_targets_host in compose["services"]
    workload_volumes = compose["services"]["workload"]["volumes"]
    assert workload_volumes == compose["services"]["sidecar"]["volumes"]


def test_compose_mounts_exist() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"service {name} mounts missing {source}"


def test_k8s_sidecar_environment_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    sidecars = [
        c for d in _k8s_docs() for c in _containers(d) if c.get("args", [None])[0] == "serve"
    ]
    assert sidecars, "no sidecar container in deploy/k8s"
    for container in sidecars:
        env = {e["name"]: e.get("value", "from-secret") for e in container["env"]}
        settings = _check_env(env, monkeypatch, f"k8s container {container['name']}")
        assert settings.listen_host == "0.0.0.0" and settings.token
        probes = {container["readinessProbe"]["httpGet"]["path"]}
        probes.add(container["livenessProbe"]["httpGet"]["path"])
        assert probes == {"/readyz", "/healthz"}


def test_k8s_workload_and_sidecar_share_the_data_volume() -> None:
    for doc in _k8s_docs():
        containers = _containers(doc)
        if len(containers) < 2:
            continue
        mounts = [{m["mountPath"] for m in c.get("volumeMounts", [])} for c in containers]
        assert set.intersection(*mounts), f"{doc['metadata']['name']}: no shared mount"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: install Debian's prometheus / prometheus-alertmanager"
    return path


def test_compose_prometheus_and_alertmanager_configs_pass_their_checkers(tmp_path: Path) -> None:
    prom = yaml.safe_load((ROOT / "deploy/compose/prometheus.yml").read_text())
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "alerts" / "mlprof-rules.yaml", rules)
    shutil.copy(ROOT / "alerts" / "mlprof-recording-rules.yaml", rules)
    prom["rule_files"] = [str(rules / "*.yaml")]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prom))
    result = subprocess.run([_tool("promtool"), "check", "config", str(config)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    found = [int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout)]
    assert sum(found) >= 8 + 6, result.stdout  # the shipped alert and recording rules loaded
    am = subprocess.run(
        [_tool("amtool"), "check-config", str(ROOT / "deploy/compose/alertmanager.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert am.returncode == 0, am.stdout + am.stderr


def test_k8s_prometheus_rule_matches_the_shipped_rules() -> None:
    from alerts.render import render_prometheus_rule

    committed = (K8S_DIR / "prometheusrule.yaml").read_text()
    assert committed == render_prometheus_rule(None, name="mlprof"), (
        "deploy/k8s/prometheusrule.yaml is stale: "
        "python -m alerts.render --prometheus-rule mlprof -o deploy/k8s/prometheusrule.yaml"
    )
    rule = yaml.safe_load(committed)
    shipped = yaml.safe_load((ROOT / "alerts" / "mlprof-rules.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == shipped["groups"]


def test_compose_and_k8s_ship_every_dashboard_and_the_recording_rules() -> None:
    from dashboards.generate import CONFIGMAP, FILES

    compose = yaml.safe_load(COMPOSE.read_text())
    grafana = compose["services"]["grafana"]
    [mount] = [v for v in grafana["volumes"] if v.startswith("./dashboards:")]
    provider = yaml.safe_load((ROOT / "deploy/compose/grafana/dashboards.yaml").read_text())
    assert mount.split(":")[1] == provider["providers"][0]["options"]["path"]
    assert all((ROOT / "dashboards" / name).is_file() for name in FILES)
    # The Run dashboard's session table needs the Infinity plugin and its data source.
    assert "yesoreyeram-infinity-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    sources = yaml.safe_load((ROOT / "deploy/compose/grafana/datasources.yaml").read_text())
    types = {d["type"] for d in sources["datasources"]}
    assert {"prometheus", "grafana-pyroscope-datasource", "yesoreyeram-infinity-datasource"} <= (
        types
    )
    mounted = {v.split(":")[0] for v in compose["services"]["prometheus"]["volumes"]}
    assert {"./alerts/mlprof-rules.yaml", "./alerts/mlprof-recording-rules.yaml"} <= mounted
    configmap = yaml.safe_load(CONFIGMAP.read_text())
    assert set(configmap["data"]) == set(FILES)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in _k8s_docs()}
    assert {("ConfigMap", "mlprof-dashboards"), ("PrometheusRule", "mlprof-recording")} <= kinds


def test_k8s_trainer_turns_host_profiling_on_with_the_sidecars_token() -> None:
    from exporter.sdk.host_profile import options_from_env

    for doc in _k8s_docs():
        containers = {c["name"]: c for c in _containers(doc)}
        if "trainer" not in containers:
            continue
        env = {e["name"]: e.get("value", "from-secret") for e in containers["trainer"]["env"]}
        assert options_from_env(None, env) is not None
        # The sidecar listens off loopback with a token: the agent must send it.
        assert "valueFrom" in next(
            e for e in containers["trainer"]["env"] if e["name"] == "MLPROF_AUTH_TOKEN"
        )
