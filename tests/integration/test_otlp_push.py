"""OTLP/HTTP push: a local receiver parses ExportMetricsServiceRequest with the real protobufs."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from exporter.config import Settings
from exporter.faketpu import FakeTpuRuntime, default_script
from tests.harness import wait_until

pytestmark = pytest.mark.integration


class OtlpReceiver:
    """An OTLP/HTTP metrics endpoint (``POST /v1/metrics``, protobuf, gzip or plain)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], ExportMetricsServiceRequest]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest.FromString(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append((headers | {"path": self.path}, request))
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def _attrs(kvs: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in kvs}


def _gauges(request: ExportMetricsServiceRequest) -> dict[str, tuple[str, list[Any]]]:
    found: dict[str, tuple[str, list[Any]]] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.WhichOneof("data") == "gauge":
                    found[metric.name] = (metric.unit, list(metric.gauge.data_points))
    return found


def test_sidecar_pushes_accelerator_metrics_over_otlp(
    receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.api.app import create_app
    from exporter.sidecar import Sidecar

    monkeypatch.setenv("K8S_POD_NAME", "trainer-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-scope-orgid=team-a")
    with FakeTpuRuntime(default_script(4), "127.0.0.1:0") as fake:
        settings = Settings(
            sources=["tpu"],
            tpu_metrics_addr=fake.addr,
            shared_dir=tmp_path / "shared",
            store=str(tmp_path / "store"),
            collect_interval_s=0.5,
            otlp_endpoint=receiver.url,
            otlp_headers={"authorization": "Bearer otlp-secret"},
            otlp_interval_s=0.5,
        )

        def pushed_chips() -> bool:
            return any(
                len(_gauges(req).get("accelerator.duty_cycle", ("", []))[1]) == 4
                for _, req in list(receiver.requests)
            )

        with TestClient(create_app(Sidecar(settings))):
            wait_until(pushed_chips, what="an OTLP push with four chips")

    headers, request = next(
        (h, r) for h, r in receiver.requests if "accelerator.duty_cycle" in _gauges(r)
    )
    assert headers["path"] == "/v1/metrics"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["content-encoding"] == "gzip"
    assert headers["authorization"] == "Bearer otlp-secret"  # MLPROF_OTLP_HEADERS
    assert headers["x-scope-orgid"] == "team-a"  # OTEL_EXPORTER_OTLP_HEADERS still honoured

    resource = _attrs(request.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "mlprof-exporter"
    assert resource["host.name"] == socket.gethostname()
    assert resource["k8s.pod.name"] == "trainer-0"
    assert resource["k8s.namespace.name"] == "ml"

    gauges = _gauges(request)
    expected_units = {
        "accelerator.duty_cycle": "1",
        "accelerator.tensorcore.utilization": "1",
        "accelerator.memory.usage": "By",
        "accelerator.memory.limit": "By",
    }
    assert {name: gauges[name][0] for name in expected_units} == expected_units
    duty = {
        _attrs(p.attributes)["chip"]: (p.as_double, _attrs(p.attributes))
        for p in gauges["accelerator.duty_cycle"][1]
    }
    assert sorted(duty) == ["0", "1", "2", "3"]
    value, attrs = duty["0"]
    assert value == pytest.approx(0.95)
    assert attrs == {
        "chip": "0",
        "source": "libtpu",
        "accelerator": "tpu",
        "host": socket.gethostname(),
    }
    usage = {
        _attrs(p.attributes)["chip"]: p.as_double or float(p.as_int)
        for p in gauges["accelerator.memory.usage"][1]
    }
    assert usage["3"] == 7 * (1 << 30)
