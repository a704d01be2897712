"""Pyroscope selections as comparison sides: profiles pushed with the real sink to the
test receiver, fetched back with ``querier.v1.QuerierService/SelectMergeProfile`` (Connect,
the real protobufs), compared through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from exporter.analysis.sides.load import load_side
from exporter.profiles.flamegraph import FlameGraph
from exporter.proto import pyroscope_querier_pb2
from exporter.sinks.pyroscope import PyroscopeSink
from tests.analysis_captures import AnalysisCaptures
from tests.harness import ROOT
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.integration

DEVICE = "device:device_time:nanoseconds:device_time:nanoseconds"
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def cpu_profile(extra: int) -> FlameGraph:
    """A CPU profile as the pyroscope-io agent's ingest stores it (process_cpu, cpu ns)."""
    folded = "main;train_step;forward 600000000\nmain;train_step;backward 400000000\n"
    if extra:
        folded += f"main;train_step;load_batch;decode_jpeg {extra}\n"
    graph = FlameGraph.from_folded(
        folded, sample_type="cpu", unit="nanoseconds", profile_name="process_cpu"
    )
    graph.time_nanos = time.time_ns() - 60_000_000_000
    return graph


@pytest.fixture(scope="module")
def pushed(analysis_captures: AnalysisCaptures) -> Iterator[PyroscopeReceiver]:
    with PyroscopeReceiver() as receiver:
        sink = PyroscopeSink(receiver.url)
        for run_id, capture in (
            ("r-base", analysis_captures.compute),
            ("r-head", analysis_captures.heavy),
        ):
            graph = load_side(str(capture), "device").whole
            labels = {"service_name": "trainer", "run_id": run_id, "host": "h0"}
            assert sink.push(graph, labels).status == "ok"
            extra = 900_000_000 if run_id == "r-head" else 0
            assert sink.push(cpu_profile(extra), labels).status == "ok"
        sink.close()
        receiver.wait_for(4)
        yield receiver


def mlprof(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLPROF_")}
    if url:
        env["MLPROF_PYROSCOPE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )


BASE = 'pyroscope:{service_name="trainer",run_id="r-base"}'
HEAD = 'pyroscope:{service_name="trainer",run_id="r-head"}'


def test_device_profiles_fetched_back_and_compared(pushed: PyroscopeReceiver) -> None:
    done = mlprof("compare", BASE, HEAD, "--format", "json", "--from", "now-1h", url=pushed.url)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["kind"], data["normalisation"]) == ("device", "share")
    assert data["base"]["source"] == "pyroscope" and data["base"]["steps"] == 0
    assert any("no step markers" in n for n in data["notes"])
    top = data["regressions"][0]
    # Without steps the noise floor is high: the new program as a whole (its total) is
    # the regression, as no single op of it clears the floor alone.
    assert top["frame"].split(";")[0] == "jit_heavy_extra" and top["regression"]
    queries = [q for q in pushed.queries if q.profile_typeID == DEVICE]
    assert {q.label_selector for q in queries} >= {
        BASE[len("pyroscope:") :],
        HEAD[len("pyroscope:") :],
    }
    assert all(q.end - q.start == pytest.approx(3_600_000, abs=60_000) for q in queries)


def test_agent_cpu_profiles_with_kind_host(pushed: PyroscopeReceiver) -> None:
    done = mlprof("compare", BASE, HEAD, "--kind", "host", "--format", "json", url=pushed.url)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["sample_type"] == "cpu" and data["base"]["notes"] == [f"profile type {CPU}"]
    top = data["regressions"][0]
    assert top["name"] == "decode_jpeg" and top["significant"]
    assert top["self_base"] == 0 and top["self_head"] == 900_000_000
    assert top["delta_self_pts"] == pytest.approx(100 * 0.9 / 1.9, abs=0.01)


def test_errors_are_one_line(pushed: PyroscopeReceiver) -> None:
    off = mlprof("compare", BASE, HEAD, url=None)
    assert off.returncode == 2 and "MLPROF_PYROSCOPE_URL" in off.stderr
    empty = mlprof("compare", 'pyroscope:{service_name="nobody"}', HEAD, url=pushed.url)
    assert empty.returncode == 1 and "has no" in empty.stderr
    bad = mlprof("compare", "pyroscope:service_name=x", HEAD, url=pushed.url)
    assert bad.returncode == 2 and "label selector" in bad.stderr
    for done in (off, empty, bad):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_request_wire_format_is_pyroscopes() -> None:
    """Field numbers and types as in Pyroscope's api/querier/v1/querier.proto, by hand."""
    request = pyroscope_querier_pb2.SelectMergeProfileRequest(
        profile_typeID=CPU, label_selector='{a="b"}', start=1000, end=2000
    )

    def varint(n: int) -> bytes:
        out = b""
        while True:
            byte, n = n & 0x7F, n >> 7
            out += bytes([byte | (0x80 if n else 0)])
            if not n:
                return out

    expected = (
        b"\x0a"
        + varint(len(CPU))
        + CPU.encode()  # 1: string profile_typeID
        + b"\x12"
        + varint(7)
        + b'{a="b"}'  # 2: string label_selector
        + b"\x18"
        + varint(1000)  # 3: int64 start (ms)
        + b"\x20"
        + varint(2000)  # 4: int64 end (ms)
    )
    assert request.SerializeToString() == expected
