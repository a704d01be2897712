"""HighwayHash-64 (google/highwayhash), as Riegeli/records hashes its headers and chunks.

Riegeli (``riegeli/chunk_encoding/hash.cc``) hashes with the 64-bit HighwayHash under a
fixed key, the ASCII of ``"Riegeli/records\\n"`` twice (:data:`RIEGELI_KEY`). The
algorithm is HighwayHash's portable C version (``c/highwayhash.c``): four 64-bit lanes,
32-byte packets, the last partial packet folded in by ``UpdateRemainder``, four
permute-and-update rounds to finish. Checked against its published test vectors
(``c/highwayhash_test.c``) in ``tests/unit/test_highwayhash.py``.

No maintained Python binding exists (the one on PyPI, ``highwayhash-cffi``, last
released in 2020, ships no wheels), so the work is done by the compiled core
``_highwayhash.c`` where the package was built with a compiler, and by the pure-Python
twin below otherwise (the same answers, a few hundred times slower: about 4 MB/s against
1.2 GB/s, measured by ``bench/riegeli_read.py``). Tests run both, as msgpack's do
(``_compiled`` set to ``None`` selects the twin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["RIEGELI_KEY", "HighwayHash64", "highwayhash64", "riegeli_hash"]

Key = tuple[int, int, int, int]

# 'Riegeli/' and 'records\n' as little-endian words (riegeli/chunk_encoding/hash.cc).
RIEGELI_KEY: Final[Key] = (
    0x2F696C6567656952,
    0x0A7364726F636572,
    0x2F696C6567656952,
    0x0A7364726F636572,
)

_M: Final = (1 << 64) - 1
_INIT_MUL0: Final = (0xDBE6D5D5FE4CCE2F, 0xA4093822299F31D0, 0x13198A2E03707344, 0x243F6A8885A308D3)
_INIT_MUL1: Final = (0x3BD39E10CB0EF593, 0xC0ACF169B5F18A8C, 0xBE5466CF34E90C6C, 0x452821E638D01377)


class _Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview) -> None: ...

    def digest(self) -> int: ...


def _rot32(x: int) -> int:
    """Swap the two 32-bit halves of a 64-bit word."""
    return ((x >> 32) | (x << 32)) & _M


def _zipper(v1: int, v0: int) -> tuple[int, int]:
    """``ZipperMergeAndAdd``'s two addends (for lane 1, for lane 0)."""
    add0 = (
        (((v0 & 0xFF000000) | (v1 & 0xFF00000000)) >> 24)
        | (((v0 & 0xFF0000000000) | (v1 & 0xFF000000000000)) >> 16)
        | (v0 & 0xFF0000)
        | ((v0 & 0xFF00) << 32)
        | ((v1 & 0xFF00000000000000) >> 8)
        | ((v0 << 56) & _M)
    )
    add1 = (
        (((v1 & 0xFF000000) | (v0 & 0xFF00000000)) >> 24)
        | (v1 & 0xFF0000)
        | ((v1 & 0xFF0000000000) >> 16)
        | ((v1 & 0xFF00) << 24)
        | ((v0 & 0xFF000000000000) >> 8)
        | ((v1 & 0xFF) << 48)
        | (v0 & 0xFF00000000000000)
    )
    return add1, add0


class _PureHighwayHash64:
    """The portable algorithm over Python ints (the reference the C core is held to)."""

    def __init__(self, key: Key) -> None:
        self.mul0 = list(_INIT_MUL0)
        self.mul1 = list(_INIT_MUL1)
        self.v0 = [m ^ k for m, k in zip(self.mul0, key, strict=True)]
        self.v1 = [m ^ _rot32(k) for m, k in zip(self.mul1, key, strict=True)]
        self.pending = b""  # the bytes of an incomplete packet

    def _packet(self, lanes: tuple[int, ...] | list[int]) -> None:
        v0, v1, mul0, mul1 = self.v0, self.v1, self.mul0, self.mul1
        for i in range(4):
            v1[i] = (v1[i] + mul0[i] + lanes[i]) & _M
            mul0[i] ^= (v1[i] & 0xFFFFFFFF) * (v0[i] >> 32)
            v0[i] = (v0[i] + mul1[i]) & _M
            mul1[i] ^= (v0[i] & 0xFFFFFFFF) * (v1[i] >> 32)
        # In this order: v0 takes v1's shuffles first, then v1 takes the new v0's.
        for source, target, lane in ((v1, v0, 0), (v1, v0, 2), (v0, v1, 0), (v0, v1, 2)):
            add1, add0 = _zipper(source[lane + 1], source[lane])
            target[lane + 1] = (target[lane + 1] + add1) & _M
            target[lane] = (target[lane] + add0) & _M

    def _words(self, packet: bytes | bytearray | memoryview) -> list[int]:
        return [int.from_bytes(packet[at : at + 8], "little") for at in range(0, 32, 8)]

    def update(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        if self.pending:
            take = 32 - len(self.pending)
            self.pending += data[:take]
            data = data[take:]
            if len(self.pending) < 32:
                return
            self._packet(self._words(self.pending))
            self.pending = b""
        whole = len(data) - len(data) % 32
        view = memoryview(data)
        for at in range(0, whole, 32):
            self._packet(self._words(view[at : at + 32]))
        self.pending = data[whole:]

    def digest(self) -> int:
        """The hash of everything updated so far (the state is left as it was)."""
        saved = (list(self.v0), list(self.v1), list(self.mul0), list(self.mul1))
        try:
            size = len(self.pending)
            if size:
                self._remainder(self.pending)
            for _ in range(4):
                v0 = self.v0
                self._packet([_rot32(v0[2]), _rot32(v0[3]), _rot32(v0[0]), _rot32(v0[1])])
            return (self.v0[0] + self.v1[0] + self.mul0[0] + self.mul1[0]) & _M
        finally:
            self.v0, self.v1, self.mul0, self.mul1 = saved

    def _remainder(self, rest: bytes) -> None:
        """``HighwayHashUpdateRemainder``: the last 1 to 31 bytes."""
        size = len(rest)
        for i in range(4):
            self.v0[i] = (self.v0[i] + (size << 32) + size) & _M
        for i in range(4):  # rotate each 32-bit half left by size
            lo, hi = self.v1[i] & 0xFFFFFFFF, self.v1[i] >> 32
            lo = ((lo << size) | (lo >> (32 - size))) & 0xFFFFFFFF
            hi = ((hi << size) | (hi >> (32 - size))) & 0xFFFFFFFF
            self.v1[i] = (hi << 32) | lo
        size_mod4 = size & 3
        aligned = size & ~3
        packet = bytearray(32)
        packet[:aligned] = rest[:aligned]
        if size & 16:
            packet[28:32] = rest[aligned + size_mod4 - 4 : aligned + size_mod4]
        elif size_mod4:
            packet[16] = rest[aligned]
            packet[17] = rest[aligned + (size_mod4 >> 1)]
            packet[18] = rest[aligned + size_mod4 - 1]
        self._packet(self._words(packet))


try:
    from exporter.profiles import _highwayhash  # type: ignore[attr-defined]

    _compiled: Callable[[int, int, int, int], _Hasher] | None = _highwayhash.HighwayHash64
except ImportError:
    _compiled = None


def HighwayHash64(key: Key = RIEGELI_KEY) -> _Hasher:  # noqa: N802 (a class to callers)
    """A streaming HighwayHash-64 under ``key``: ``update(bytes)`` then ``digest()``."""
    if _compiled is not None:
        return _compiled(*key)
    return _PureHighwayHash64(key)


def highwayhash64(data: bytes | bytearray | memoryview, key: Key = RIEGELI_KEY) -> int:
    """HighwayHash-64 of ``data`` under ``key``."""
    hasher = HighwayHash64(key)
    hasher.update(data)
    return hasher.digest()


def riegeli_hash(data: bytes | bytearray | memoryview) -> int:
    """The hash Riegeli/records stores for ``data`` (a header's rest, a chunk's data)."""
    return highwayhash64(data, RIEGELI_KEY)
