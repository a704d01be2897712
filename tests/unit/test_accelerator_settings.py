"""Settings of the accelerator sources and OTLP push, and the resource attributes."""

from __future__ import annotations

import pytest

from exporter.config import load_settings
from exporter.errors import ConfigError
from exporter.metrics.otlp import otlp_endpoint, otlp_headers, otlp_reader
from exporter.metrics.telemetry import build_resource, k8s_attributes


def test_sources_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().sources == ["auto"]
    monkeypatch.setenv("MLPROF_SOURCES", "TPU, jax,tpu")
    assert load_settings().sources == ["tpu", "jax"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu", "MLPROF_SOURCES='gpu': expected auto or a list of tpu, nvml, jax, got 'gpu'"),
        ("auto,nvml", "MLPROF_SOURCES='auto,nvml': 'auto' cannot be combined with named sources"),
    ],
)
def test_bad_sources_name_the_setting(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(sources=value)
    assert str(err.value) == message


def test_tpu_address_is_checked() -> None:
    assert load_settings(tpu_metrics_addr="10.0.0.2:8431").tpu_metrics_addr == "10.0.0.2:8431"
    with pytest.raises(ConfigError, match="MLPROF_TPU_METRICS_ADDR='localhost'"):
        load_settings(tpu_metrics_addr="localhost")


def test_otlp_headers_never_echo_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLPROF_OTLP_HEADERS", "Authorization=Bearer s3cret,x-scope-orgid=a")
    assert load_settings().otlp_headers == {"authorization": "Bearer s3cret", "x-scope-orgid": "a"}
    monkeypatch.setenv("MLPROF_OTLP_HEADERS", "s3cret-without-equals")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "s3cret" not in str(err.value)
    assert str(err.value).startswith("MLPROF_OTLP_HEADERS: expected key=value")


def test_otlp_endpoint_path_and_header_precedence() -> None:
    assert otlp_endpoint("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert otlp_endpoint("http://c:4318/v1/metrics/") == "http://c:4318/v1/metrics"
    settings = load_settings(otlp_endpoint="http://c:4318", otlp_headers="x-team=mine")
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "X-Team=theirs,x-other=1"}
    assert otlp_headers(settings, env) == {"x-team": "mine", "x-other": "1"}


def test_otlp_reader_only_with_an_endpoint() -> None:
    assert otlp_reader(load_settings()) is None
    reader = otlp_reader(load_settings(otlp_endpoint="http://127.0.0.1:4318"), environ={})
    assert reader is not None
    reader.shutdown()


def test_k8s_resource_attributes_from_the_downward_api() -> None:
    env = {"K8S_POD_NAME": "trainer-0", "POD_NAMESPACE": "ml", "NODE_NAME": "n1"}
    assert k8s_attributes(env) == {
        "k8s.pod.name": "trainer-0",
        "k8s.namespace.name": "ml",
        "k8s.node.name": "n1",
    }
    assert k8s_attributes({}) == {}
    attrs = build_resource(environ=env).attributes
    assert (attrs["service.name"], attrs["k8s.pod.name"]) == ("mlprof-exporter", "trainer-0")
