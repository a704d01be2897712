"""PyroscopeSink against the Pyroscope-compatible receiver: push, limits, retry, spool."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from exporter.profiles.flamegraph import OTHER, FlameGraph
from exporter.profiles.frames import FrameLabel
from exporter.sinks.pyroscope import PyroscopeLimits, PyroscopeSink, profile_labels
from exporter.sinks.spool import Spool
from tests.harness import free_port
from tests.pyroscope_receiver import PyroscopeReceiver

pytestmark = pytest.mark.integration

LABELS = profile_labels(
    "trainer",
    run_id="run-1",
    host="tpu-vm-0",
    trigger="alert",
    profile_source="xprof_device",
    session_id="20250101-120000-ab12",
)


def _graph(leaves: int = 3, depth: int = 3) -> FlameGraph:
    graph = FlameGraph(sample_type="device_time", unit="nanoseconds", profile_name="device")
    for i in range(leaves):
        stack: list[str | FrameLabel] = [f"scope{j}" for j in range(depth - 1)]
        stack.append(FrameLabel(f"fusion.{i}", "model.py", i + 1))
        graph.add(stack, 1000 + i)
    return graph


def _metrics(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:  # type: ignore[attr-defined]
                    key = tuple(sorted((k, str(v)) for k, v in point.attributes.items()))
                    out[(metric.name, key)] = point.value
    return out


@pytest.fixture
def receiver() -> Iterator[PyroscopeReceiver]:
    with PyroscopeReceiver(legacy_names=True) as server:
        yield server


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


def _sink(url: str, spool_dir: Path, reader: InMemoryMetricReader, **kw: object) -> PyroscopeSink:
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    return PyroscopeSink(
        url,
        spool=Spool(spool_dir, 10 * 1024 * 1024),
        meter=meter,
        sleep=lambda s: None,  # retries without waiting; the backoff values are not asserted
        **kw,  # type: ignore[arg-type]
    )


def test_push_delivers_labels_and_profile(
    receiver: PyroscopeReceiver, tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    sink = _sink(receiver.url, tmp_path, reader, tenant="team-a")
    result = sink.push(_graph(), LABELS)
    assert result.status == "ok"
    (series,) = receiver.wait_for(1)
    assert series.labels == {
        "__name__": "device",
        "service_name": "trainer",
        "run_id": "run-1",
        "host": "tpu-vm-0",
        "trigger": "alert",
        "profile_source": "xprof_device",
        "session_id": "20250101-120000-ab12",
    }
    assert series.headers["content-type"] == "application/proto"
    assert series.headers["content-encoding"] == "gzip"
    assert series.headers["x-scope-orgid"] == "team-a"
    assert series.sample_types == [("device_time", "nanoseconds")]
    assert series.folded() == {"scope0;scope1;fusion.0": 1000, "scope0;scope1;fusion.1": 1001,
                               "scope0;scope1;fusion.2": 1002}  # fmt: skip
    assert (
        _metrics(reader)[("mlprof.profile.pushes", (("sink", "pyroscope"), ("status", "ok")))] == 1
    )
    sink.close()


def test_pyroscope_session_id_goes_to_the_reserved_label() -> None:
    labels = profile_labels(
        "t", run_id="r", host="h", trigger="manual", profile_source="xprof_host",
        session_id="0123456789abcdef",
    )  # fmt: skip
    assert labels["__session_id__"] == "0123456789abcdef" and "session_id" not in labels


def test_limits_are_met_by_truncation_not_rejection(
    receiver: PyroscopeReceiver, tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    sink = _sink(receiver.url, tmp_path, reader)
    wide = _graph(leaves=20_000, depth=2)
    deep = FlameGraph(sample_type="wall", unit="nanoseconds", profile_name="wall")
    deep.add([f"frame{i}" for i in range(1500)], 7)
    assert sink.push(wide, LABELS).status == "ok"
    assert sink.push(deep, LABELS).status == "ok"
    wide_series, deep_series = receiver.wait_for(2)
    assert len(wide_series.profile.sample) <= 16_000
    assert sum(wide_series.folded().values()) == wide.root.total  # nothing lost
    assert any(key.endswith(OTHER) for key in wide_series.folded())
    assert deep_series.truncated_stacks == 0
    assert max(len(s.location_id) for s in deep_series.profile.sample) <= 1000
    assert sum(deep_series.folded().values()) == 7
    sink.close()


def test_small_size_limit_folds_more(
    receiver: PyroscopeReceiver, tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    limits = PyroscopeLimits(max_profile_bytes=20_000)
    sink = _sink(receiver.url, tmp_path, reader, limits=limits)
    graph = _graph(leaves=3000, depth=2)
    assert sink.push(graph, LABELS).status == "ok"
    (series,) = receiver.wait_for(1)
    assert series.raw_size <= 20_000
    assert sum(series.folded().values()) == graph.root.total
    sink.close()


def test_transient_failures_are_retried(
    receiver: PyroscopeReceiver, tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    receiver.fail_next(2, 503)
    sink = _sink(receiver.url, tmp_path, reader, attempts=3)
    result = sink.push(_graph(), LABELS)
    assert (result.status, result.attempts) == ("ok", 3)
    assert receiver.requests == 3
    sink.close()


def test_client_errors_are_recorded_not_retried(
    receiver: PyroscopeReceiver, tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    receiver.fail_next(1, 400)
    sink = _sink(receiver.url, tmp_path, reader, attempts=5)
    result = sink.push(_graph(), LABELS)
    assert (result.status, result.http_status, result.message) == (
        "rejected",
        400,
        "injected failure",
    )
    assert receiver.requests == 1
    assert sink.rejections[-1].message == "injected failure"
    assert len(sink.spool or []) == 0
    counts = _metrics(reader)
    assert counts[("mlprof.profile.pushes", (("sink", "pyroscope"), ("status", "rejected")))] == 1
    sink.close()


def test_too_many_requests_is_transient(
    receiver: PyroscopeReceiver, tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    receiver.fail_next(1, 429)
    sink = _sink(receiver.url, tmp_path, reader, attempts=2)
    assert sink.push(_graph(), LABELS).status == "ok"
    sink.close()


def test_down_then_up_loses_nothing(tmp_path: Path, reader: InMemoryMetricReader) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spool_dir = tmp_path / "spool"
    sink = _sink(url, spool_dir, reader, attempts=2)
    graphs = [_graph(leaves=i + 1) for i in range(4)]
    results = [sink.push(g, LABELS) for g in graphs]
    assert [r.status for r in results] == ["spooled"] * 4
    assert "ConnectError" in results[0].message
    counts = _metrics(reader)
    assert counts[("mlprof.profile.pushes", (("sink", "pyroscope"), ("status", "spooled")))] == 4
    assert counts[("mlprof.spool.size", (("sink", "pyroscope"),))] > 0
    assert sink.drain() == 0  # still down: nothing delivered, nothing dropped
    sink.close()

    # The sidecar restarts; Pyroscope comes back on the same address.
    with PyroscopeReceiver(port=port, legacy_names=True) as server:
        reader2 = InMemoryMetricReader()
        again = _sink(url, spool_dir, reader2)
        assert len(again.spool or []) == 4
        assert again.drain() == 4
        received = server.wait_for(4)
        assert [sum(s.folded().values()) for s in received] == [g.root.total for g in graphs]
        assert len(again.spool or []) == 0
        counts = _metrics(reader2)
        assert counts[("mlprof.spool.size", (("sink", "pyroscope"),))] == 0
        assert counts[("mlprof.profile.pushes", (("sink", "pyroscope"), ("status", "ok")))] == 4
        again.close()


def test_full_spool_drops_oldest_and_counts_it(
    tmp_path: Path, reader: InMemoryMetricReader
) -> None:
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    url = f"http://127.0.0.1:{free_port()}"
    one = len(PyroscopeSink(url).build_request(_graph(), LABELS).SerializeToString())
    sink = PyroscopeSink(
        url, spool=Spool(tmp_path, one * 2 + 10), meter=meter, attempts=1, sleep=lambda s: None
    )
    statuses = [sink.push(_graph(), LABELS).status for _ in range(3)]
    assert statuses == ["spooled"] * 3
    assert len(sink.spool or []) == 2
    counts = _metrics(reader)
    assert counts[("mlprof.profile.pushes", (("sink", "pyroscope"), ("status", "dropped")))] == 1
    sink.close()


def test_bad_labels_are_refused_before_sending(tmp_path: Path) -> None:
    sink = PyroscopeSink(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="label name 'bad-name'"):
        sink.push(_graph(), {**LABELS, "bad-name": "x"})
    with pytest.raises(ValueError, match="30"):
        sink.push(_graph(), {**LABELS, **{f"l{i}": "v" for i in range(30)}})
    sink.close()


def test_unknown_trigger_or_source_is_refused() -> None:
    with pytest.raises(ValueError, match=r"label trigger='deploy; x': expected one of"):
        profile_labels("t", run_id="r", host="h", trigger="deploy; x", profile_source="xprof_host")
    with pytest.raises(ValueError, match=r"label profile_source='xprof': expected one of"):
        profile_labels("t", run_id="r", host="h", trigger="manual", profile_source="xprof")


def test_spool_dir_that_cannot_be_created_is_one_config_line(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MLPROF_PYROSCOPE_URL": f"http://127.0.0.1:{free_port()}",
        "MLPROF_SPOOL_DIR": "/proc/mlprof-no-such-dir",  # procfs: mkdir always fails
        "MLPROF_SHARED_DIR": str(tmp_path / "shared"),
        "MLPROF_LISTEN": f"127.0.0.1:{free_port()}",
    }
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "serve"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mlprof:")]
    assert errors == [
        "mlprof: MLPROF_SPOOL_DIR=/proc/mlprof-no-such-dir: cannot create it "
        "(No such file or directory)"
    ]
