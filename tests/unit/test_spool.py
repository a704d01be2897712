"""The bounded on-disk spool: order, bound with eviction, survival across restarts."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.sinks.spool import Spool


def test_items_come_back_oldest_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1000)
    for i in range(5):
        assert spool.put(f"payload-{i}".encode()).stored
    assert [spool.read(item) for item in spool.items()] == [
        f"payload-{i}".encode() for i in range(5)
    ]
    assert spool.size_bytes == 5 * len(b"payload-0")


def test_bound_evicts_oldest_and_says_so(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=250)
    for i in range(3):
        spool.put(bytes([i]) * 100)
    assert len(spool) == 2  # the third put evicted the first
    put = spool.put(b"x" * 100)
    assert put.stored and len(put.evicted) == 1
    assert spool.size_bytes <= 250
    assert [spool.read(i)[:1] for i in spool.items()] == [b"\x02", b"x"]


def test_too_big_payload_is_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10)
    put = spool.put(b"y" * 11)
    assert not put.stored and "exceeds the spool limit" in put.reason
    assert len(spool) == 0


def test_survives_restart_and_cleans_partial_writes(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1000)
    spool.put(b"first")
    spool.put(b"second")
    (tmp_path / ".tmp-crashed.spool").write_bytes(b"half")
    again = Spool(tmp_path, max_bytes=1000)
    assert [again.read(i) for i in again.items()] == [b"first", b"second"]
    assert not list(tmp_path.glob(".tmp-*"))
    again.remove(again.items()[0])
    assert [Spool(tmp_path, 1000).read(i) for i in Spool(tmp_path, 1000).items()] == [b"second"]


def test_negative_bound_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Spool(tmp_path, max_bytes=-1)


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG (RLIMIT_FSIZE), as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, keep the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_failed_write_evicts_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=250)
    assert spool.put(b"a" * 100).stored and spool.put(b"b" * 100).stored
    with _file_size_limit(50):
        put = spool.put(b"c" * 100)  # would need one eviction, but cannot be written
    assert not put.stored and put.evicted == []
    assert "cannot write spool file" in put.reason
    assert [spool.read(i) for i in spool.items()] == [b"a" * 100, b"b" * 100]
    assert sorted(p.name.startswith(".tmp-") for p in tmp_path.iterdir()) == [False, False]
    again = Spool(tmp_path, max_bytes=250)  # and on disk, after a restart
    assert [again.read(i) for i in again.items()] == [b"a" * 100, b"b" * 100]


class _Killed(BaseException):
    """Stands for kill -9 (nothing after it runs)."""


def test_a_push_in_flight_at_a_kill_is_not_delivered_twice(tmp_path: Path) -> None:
    import httpx

    from exporter.profiles.flamegraph import FlameGraph
    from exporter.sinks.pyroscope import PyroscopeSink

    received: list[bytes] = []
    answers = iter(["503", "kill"])

    def server(request: httpx.Request) -> httpx.Response:
        answer = next(answers, "ok")
        if answer == "503":
            return httpx.Response(503, text="ingester down")
        received.append(request.content)  # Pyroscope has it...
        if answer == "kill":
            raise _Killed  # ...and the sidecar dies before the spool forgets it
        return httpx.Response(200, json={})

    def sink(directory: Path) -> PyroscopeSink:
        return PyroscopeSink(
            "http://pyroscope:4040", spool=Spool(directory, 1 << 20), attempts=1,
            transport=httpx.MockTransport(server), sleep=lambda s: None,
        )  # fmt: skip

    first = sink(tmp_path)
    assert first.push(FlameGraph.from_folded("main;step 10\n"), {"service_name": "t"}).status == (
        "spooled"
    )  # 503: spooled
    with pytest.raises(_Killed):
        first.drain()
    assert len(received) == 1

    restarted = sink(tmp_path)  # Before: the spool resent it, and Pyroscope counted it twice.
    assert restarted.drain() == 0
    assert len(received) == 1
    assert len(restarted.spool) == 0  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # payload and marker gone


def test_a_push_that_failed_in_flight_is_sent_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1000)
    spool.put(b"payload")
    [item] = spool.items()
    spool.sending(item)
    spool.not_sent(item)  # e.g. Pyroscope answered 503: it does not have it
    assert [Spool(tmp_path, 1000).read(i) for i in Spool(tmp_path, 1000).items()] == [b"payload"]
