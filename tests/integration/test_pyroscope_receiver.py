"""The test receiver is faithful: the real pyroscope-io client pushes to it, and it
refuses what Pyroscope's validation refuses."""

from __future__ import annotations

import gzip
import subprocess
import sys
import textwrap

import httpx
import pytest

from exporter.proto import profile_pb2, pyroscope_push_pb2
from tests.pyroscope_receiver import PUSH_PATH, PyroscopeReceiver

pytestmark = pytest.mark.integration

AGENT = textwrap.dedent(
    """
    import sys, time
    import pyroscope

    pyroscope.configure(
        application_name="receiver-check",
        server_address=sys.argv[1],
        tags={"run_id": "r1"},
        upload_interval=1,
    )

    def busy_work():
        deadline = time.time() + 3
        while time.time() < deadline:
            sum(i * i for i in range(2000))

    busy_work()
    pyroscope.shutdown()
    """
)


def test_real_pyroscope_client_is_accepted_and_decoded() -> None:
    with PyroscopeReceiver() as receiver:
        done = subprocess.run(
            [sys.executable, "-c", AGENT, receiver.url], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        received = receiver.wait_for(1, timeout=30)
    assert receiver.rejected == []
    series = received[0]
    assert series.labels["service_name"] == "receiver-check"
    assert series.labels["__name__"] == "process_cpu"
    assert series.labels["run_id"] == "r1"
    assert series.headers["content-type"] == "application/proto"
    assert ("cpu", "nanoseconds") in series.sample_types
    stacks = {key for s in received for key in s.folded()}
    assert any("busy_work" in key for key in stacks), stacks


def _request(labels: dict[str, str], samples: int = 1) -> bytes:
    profile = profile_pb2.Profile(string_table=["", "cpu", "nanoseconds", "f"])
    profile.sample_type.add(type=1, unit=2)
    profile.function.add(id=1, name=3)
    profile.location.add(id=1, line=[profile_pb2.Line(function_id=1)])
    for _ in range(samples):
        profile.sample.add(location_id=[1], value=[1])
    request = pyroscope_push_pb2.PushRequest()
    series = request.series.add()
    for name, value in labels.items():
        series.labels.add(name=name, value=value)
    series.samples.add(raw_profile=gzip.compress(profile.SerializeToString()))
    return request.SerializeToString()


OK = {"__name__": "process_cpu", "service_name": "svc"}


@pytest.mark.parametrize(
    ("labels", "samples", "message"),
    [
        ({"service_name": "svc"}, 1, "invalid metric name"),
        ({"__name__": "process_cpu"}, 1, "service name is not provided"),
        ({**OK, "bad-name": "x"}, 1, "invalid label name"),
        ({**OK, **{f"l{i}": "v" for i in range(29)}}, 1, "31 label names; limit 30"),
        ({**OK, "v": "x" * 2049}, 1, "label value too long"),
        (OK, 16_001, "samples count limit"),
    ],
)
def test_receiver_refuses_what_pyroscope_refuses(
    labels: dict[str, str], samples: int, message: str
) -> None:
    with PyroscopeReceiver(legacy_names=True) as receiver:
        response = httpx.post(
            receiver.url + PUSH_PATH,
            content=_request(labels, samples),
            headers={"Content-Type": "application/proto"},
        )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument"
    assert message in response.json()["message"]
    assert receiver.received == []


def test_receiver_accepts_a_valid_push() -> None:
    with PyroscopeReceiver() as receiver:
        response = httpx.post(
            receiver.url + PUSH_PATH,
            content=_request({**OK, "otel.scope.name": "x"}),
            headers={"Content-Type": "application/proto"},
        )
        assert response.status_code == 200
        assert receiver.wait_for(1)[0].folded() == {"f": 1}
