"""A capture's side-cache print is hashed once per process while the file stays as it
was: a session's job asks for it up to three times, each hash a full read of the file."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.sides import cache

LATER = 2**62  # a clock (year 2116) far past any file's times: every file is settled


class CountingHash:
    """hashlib.blake2b, counted (the real hash: the digests stay the real ones)."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = hashlib.blake2b

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingHash]:
    counting = CountingHash()
    monkeypatch.setattr(cache.hashlib, "blake2b", counting)
    monkeypatch.setattr(cache, "_PRINTS", {}, raising=False)
    monkeypatch.setattr(cache, "_now_ns", lambda: LATER, raising=False)
    yield counting


REAL_BLAKE2B = hashlib.blake2b


def real_print(path: Path) -> str:
    return REAL_BLAKE2B(path.read_bytes(), digest_size=32).hexdigest()


def test_an_unchanged_capture_is_hashed_once(tmp_path: Path, hashes: CountingHash) -> None:
    capture = tmp_path / "one.xplane.pb"
    capture.write_bytes(b"x" * 5000)
    first, second = cache.fingerprint(capture), cache.fingerprint(capture)
    assert first is not None and first == second
    assert first.blake2b == real_print(capture)
    assert hashes.calls == 1


def test_a_rewritten_capture_is_hashed_again(tmp_path: Path, hashes: CountingHash) -> None:
    capture = tmp_path / "one.xplane.pb"
    capture.write_bytes(b"x" * 5000)
    before = cache.fingerprint(capture)
    st = capture.stat()
    capture.write_bytes(b"y" * 5000)  # same size, its mtime set back: the ctime moved
    os.utime(capture, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = cache.fingerprint(capture)
    assert before is not None and after is not None
    assert after.blake2b == real_print(capture) != before.blake2b
    assert hashes.calls == 2


def test_a_capture_written_just_now_is_not_remembered(
    tmp_path: Path, hashes: CountingHash, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = tmp_path / "one.xplane.pb"
    capture.write_bytes(b"x" * 5000)
    # The clock at the file's own last change: it may still be being written.
    touched = max(capture.stat().st_mtime_ns, capture.stat().st_ctime_ns)
    monkeypatch.setattr(cache, "_now_ns", lambda: touched)
    cache.fingerprint(capture)
    cache.fingerprint(capture)
    assert hashes.calls == 2


def test_the_remembered_prints_are_bounded(tmp_path: Path, hashes: CountingHash) -> None:
    for index in range(cache._MAX_PRINTS + 5):
        path = tmp_path / f"c{index}.xplane.pb"
        path.write_bytes(b"z" * index)
        assert cache.fingerprint(path) is not None
    assert len(cache._PRINTS) == cache._MAX_PRINTS
