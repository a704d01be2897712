"""Pyroscope ingest formats read by the sidecar: push.v1 requests and legacy /ingest calls."""

from __future__ import annotations

import gzip

import pytest

from exporter.profiles.ingest import (
    IngestError,
    IngestLimits,
    parse_app_name,
    push_from_connect,
    push_from_ingest,
)
from exporter.proto import profile_pb2, pyroscope_push_pb2
from tests.pyroscope_receiver import ReceivedSeries


def agent_pprof(period_ns: int = 10_000_000) -> bytes:
    """A pprof shaped like pyroscope-rs's encoder output: cpu/nanoseconds, tags as labels."""
    strings = ["", "cpu", "nanoseconds", "prepare_batch", "train.py", "main", "phase", "data"]
    profile = profile_pb2.Profile(string_table=strings, period=period_ns)
    profile.sample_type.add(type=1, unit=2)
    profile.period_type.type, profile.period_type.unit = 1, 2
    profile.function.add(id=1, name=3, filename=4)
    profile.function.add(id=2, name=5, filename=4)
    profile.location.add(id=1, line=[profile_pb2.Line(function_id=1, line=12)])
    profile.location.add(id=2, line=[profile_pb2.Line(function_id=2, line=40)])
    sample = profile.sample.add(location_id=[1, 2], value=[3 * period_ns])
    sample.label.add(key=6, str=7)
    profile.sample.add(location_id=[2], value=[period_ns])
    return bytes(profile.SerializeToString())


def push_body(labels: dict[str, str], raw: bytes | None = None) -> bytes:
    request = pyroscope_push_pb2.PushRequest()
    series = request.series.add()
    for name, value in labels.items():
        series.labels.add(name=name, value=value)
    series.samples.add(raw_profile=gzip.compress(raw or agent_pprof()), ID="x")
    return bytes(request.SerializeToString())


AGENT_LABELS = {
    "__name__": "process_cpu",
    "service_name": "trainer",
    "run_id": "r1",
    "host": "h0",
    "otel.scope.name": "com.grafana.pyroscope/python",
}


def test_agent_push_is_accepted_as_sent() -> None:
    body = gzip.compress(push_body(AGENT_LABELS))
    request = push_from_connect(body, "application/proto", "gzip")
    (series,) = request.series
    assert {p.name: p.value for p in series.labels} == AGENT_LABELS
    assert gzip.decompress(series.samples[0].raw_profile) == agent_pprof()


@pytest.mark.parametrize(
    ("ctype", "encoding", "status", "words"),
    [
        ("application/json", "", 415, "application/proto"),
        ("application/proto", "br", 415, "'br'"),
    ],
)
def test_push_of_another_type_or_encoding_is_415(
    ctype: str, encoding: str, status: int, words: str
) -> None:
    with pytest.raises(IngestError) as caught:
        push_from_connect(push_body(AGENT_LABELS), ctype, encoding)
    assert caught.value.status == status
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("labels", "raw", "words"),
    [
        ({k: v for k, v in AGENT_LABELS.items() if k != "service_name"}, None, "service_name"),
        ({k: v for k, v in AGENT_LABELS.items() if k != "__name__"}, None, "__name__"),
        ({**AGENT_LABELS, **{f"l{i}": "v" for i in range(30)}}, None, "35 labels"),
        (AGENT_LABELS, b"not a profile at all", "not a pprof"),
        (AGENT_LABELS, b"\x1f\x8b\x08\x00garbage", "gzip data"),
    ],
)
def test_bad_push_is_400_naming_the_problem(
    labels: dict[str, str], raw: bytes | None, words: str
) -> None:
    body = push_body(labels)
    if raw is not None:
        request = pyroscope_push_pb2.PushRequest.FromString(body)
        request.series[0].samples[0].raw_profile = raw
        body = request.SerializeToString()
    with pytest.raises(IngestError) as caught:
        push_from_connect(body, "application/proto", "")
    assert caught.value.status == 400
    assert words in caught.value.message


def test_gzip_bomb_is_refused_without_inflating_it() -> None:
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB of zeros: a few KiB compressed
    limits = IngestLimits(max_decompressed_bytes=1 << 20)
    with pytest.raises(IngestError, match="more than 1048576 bytes once decompressed"):
        push_from_connect(bomb, "application/proto", "gzip", limits)
    request = pyroscope_push_pb2.PushRequest.FromString(push_body(AGENT_LABELS))
    request.series[0].samples[0].raw_profile = bomb
    with pytest.raises(IngestError, match="samples\\[0\\]: more than"):
        push_from_connect(request.SerializeToString(), "application/proto", "", limits=IngestLimits(
            max_profile_bytes=1 << 20))  # fmt: skip


def test_app_name_with_suffix_and_tags() -> None:
    assert parse_app_name("trainer.cpu{env=prod,run_id=r1}") == (
        "trainer",
        "process_cpu",
        {"env": "prod", "run_id": "r1"},
    )
    assert parse_app_name("my.app") == ("my.app", None, {})  # an unknown suffix is the name
    assert parse_app_name("trainer{__name__=x,phase=data}")[2] == {"phase": "data"}
    for bad in ("trainer{env}", "trainer{env=a", "{env=a}", "tr{1x=a}"):
        with pytest.raises(IngestError, match="name="):
            parse_app_name(bad)


def legacy_series(query: dict[str, str], body: bytes, ctype: str = "binary/octet-stream",
                  encoding: str = "") -> ReceivedSeries:  # fmt: skip
    request = push_from_ingest(query, body, ctype, encoding, now_s=1_700_000_000)
    (series,) = request.series
    profile = profile_pb2.Profile.FromString(gzip.decompress(series.samples[0].raw_profile))
    return ReceivedSeries({p.name: p.value for p in series.labels}, profile, {}, 0)


def test_legacy_pprof_upload_of_an_older_agent() -> None:
    """pyroscope-rs < 1.0: name=app{tags}&from&until&format=pprof&sampleRate&spyName."""
    query = {"name": "trainer{run_id=r1,host=h0}", "from": "1700000000", "until": "1700000010",
             "format": "pprof", "sampleRate": "100", "spyName": "pyspy"}  # fmt: skip
    series = legacy_series(query, gzip.compress(agent_pprof()), encoding="gzip")
    assert series.labels == {
        "__name__": "process_cpu",
        "service_name": "trainer",
        "run_id": "r1",
        "host": "h0",
        "pyroscope_spy": "pyspy",
    }
    assert series.folded() == {"main;prepare_batch": 30_000_000, "main": 10_000_000}
    assert series.folded_where(phase="data") == {"main;prepare_batch": 30_000_000}
    assert series.profile.time_nanos == 1_700_000_000 * 10**9
    assert series.profile.duration_nanos == 10 * 10**9


def test_legacy_folded_counts_become_cpu_nanoseconds() -> None:
    query = {"name": "trainer.cpu", "format": "folded", "sampleRate": "100",
             "from": "1700000000", "until": "1700000010"}  # fmt: skip
    series = legacy_series(query, b"main;prepare_batch 3\nmain 1\n", "text/plain")
    assert series.labels == {"__name__": "process_cpu", "service_name": "trainer"}
    assert series.sample_types == [("cpu", "nanoseconds")]
    assert series.folded() == {"main;prepare_batch": 30_000_000, "main": 10_000_000}


def test_service_name_tag_keeps_the_app_as_app_name() -> None:
    query = {"name": "legacy-app{service_name=trainer}", "format": "pprof"}
    labels = legacy_series(query, agent_pprof()).labels
    assert (labels["service_name"], labels["app_name"]) == ("trainer", "legacy-app")


@pytest.mark.parametrize(
    ("query", "body", "ctype", "status", "words"),
    [
        ({"format": "pprof"}, b"", "", 400, "name is required"),
        ({"name": "a", "format": "jfr"}, b"", "", 415, "format='jfr'"),
        ({"name": "a", "format": "pprof"}, b"x", "multipart/form-data; boundary=b", 415,
         "multipart"),
        ({"name": "a", "format": "folded"}, b"a;b x\n", "", 400, "line 1"),
        ({"name": "a", "format": "folded", "sampleRate": "0"}, b"a 1\n", "", 400, "sampleRate"),
        ({"name": "a", "format": "pprof", "from": "now-1h"}, b"", "", 400, "from='now-1h'"),
        ({"name": "a", "format": "pprof"}, b"junk", "", 400, "not a pprof"),
    ],
)  # fmt: skip
def test_bad_legacy_upload_names_the_problem(
    query: dict[str, str], body: bytes, ctype: str, status: int, words: str
) -> None:
    with pytest.raises(IngestError) as caught:
        push_from_ingest(query, body, ctype, "", now_s=1_700_000_000)
    assert caught.value.status == status
    assert words in caught.value.message


def _push_of(samples: list[bytes]) -> bytes:
    request = pyroscope_push_pb2.PushRequest()
    series = request.series.add()
    for name, value in AGENT_LABELS.items():
        series.labels.add(name=name, value=value)
    for number, raw in enumerate(samples):
        series.samples.add(raw_profile=gzip.compress(raw, 1), ID=str(number))
    return bytes(request.SerializeToString())


def test_a_push_of_many_samples_is_refused_before_they_are_parsed() -> None:
    # One series of 40 samples (an agent sends one): each could inflate to 4 MiB.
    body = _push_of([agent_pprof()] * 40)
    with pytest.raises(IngestError, match=r"40 samples, at most 16 per series") as info:
        push_from_connect(body, "application/proto", "")
    assert info.value.status == 413


def test_a_pushs_profiles_share_one_decompressed_budget() -> None:
    # 8 samples of 3 MiB each once decompressed (a few KB each as gzip): 24 MiB in all,
    # over the request's 16 MiB; each alone is within the 4 MiB per profile.
    profile = profile_pb2.Profile()
    profile.ParseFromString(agent_pprof())
    profile.string_table.append("x" * (3 << 20))
    big = profile.SerializeToString()
    body = _push_of([big] * 8)
    assert len(body) < 200_000
    with pytest.raises(IngestError, match=r"samples\[5\]: the request's profiles exceed") as info:
        push_from_connect(body, "application/proto", "")
    assert info.value.status == 413
    push_from_connect(_push_of([big] * 5), "application/proto", "")  # within it: accepted


def test_a_folded_stack_of_many_frames_is_refused_before_building_it() -> None:
    # 100,000 frames in one stack from a 1 KB gzip (2M frames from 4 KB added 1.7 GB):
    # refused by counting separators, before any frame is made.
    import tracemalloc

    query = {"name": "app.cpu", "format": "folded"}
    deep = gzip.compress((";".join(["f"] * 100_000) + " 1\n").encode())
    assert len(deep) < 2048
    tracemalloc.start()
    try:
        with pytest.raises(IngestError, match=r"line 1 is a stack of 100000 frames") as info:
            push_from_ingest(query, deep, "text/plain", "gzip", now_s=1_700_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.status == 413
    assert peak < 8 << 20  # the text (200 KB) and its decoded copy, no frame tree
    # Many stacks within the depth but too many frames in all.
    wide = "".join(f"{';'.join(['g'] * 1000)};leaf{n} 1\n" for n in range(300)).encode()
    with pytest.raises(IngestError, match=r"more than 200000 frames in all"):
        push_from_ingest(query, wide, "text/plain", "", now_s=1_700_000_000)
    # An ordinary folded upload still passes.
    push_from_ingest(query, b"main;step 3\nmain;load 1\n", "text/plain", "", now_s=1)
