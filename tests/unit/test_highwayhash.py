"""HighwayHash-64, compiled core and pure-Python twin, against the published vectors.

The vectors are those of google/highwayhash ``c/highwayhash_test.c`` (``kExpected64``:
key 00..1f, data bytes 0, 1, ... of every length 0..64; and key 1, 2, 3, 4 over 33 bytes
128..160). Riegeli's own values come from its file format spec, which prints the first
64 bytes of every file: the block header's hash, the signature chunk's header hash and
its data hash (of no bytes), all under Riegeli's fixed key.
"""

from __future__ import annotations

import random

import pytest

from exporter.profiles import highwayhash as hh
from tests import riegeli_writer as rw

KEY1 = (0x0706050403020100, 0x0F0E0D0C0B0A0908, 0x1716151413121110, 0x1F1E1D1C1B1A1918)
KEY2 = (1, 2, 3, 4)
EXPECTED64 = [
    0x907A56DE22C26E53, 0x7EAB43AAC7CDDD78, 0xB8D0569AB0B53D62, 0x5C6BEFAB8A463D80,
    0xF205A46893007EDA, 0x2B8A1668E4A94541, 0xBD4CCC325BEFCA6F, 0x4D02AE1738F59482,
    0xE1205108E55F3171, 0x32D2644EC77A1584, 0xF6E10ACDB103A90B, 0xC3BBF4615B415C15,
    0x243CC2040063FA9C, 0xA89A58CE65E641FF, 0x24B031A348455A23, 0x40793F86A449F33B,
    0xCFAB3489F97EB832, 0x19FE67D2C8C5C0E2, 0x04DD90A69C565CC2, 0x75D9518E2371C504,
    0x38AD9B1141D3DD16, 0x0264432CCD8A70E0, 0xA9DB5A6288683390, 0xD7B05492003F028C,
    0x205F615AEA59E51E, 0xEEE0C89621052884, 0x1BFC1A93A7284F4F, 0x512175B5B70DA91D,
    0xF71F8976A0A2C639, 0xAE093FEF1F84E3E7, 0x22CA92B01161860F, 0x9FC7007CCF035A68,
    0xA0C964D9ECD580FC, 0x2C90F73CA03181FC, 0x185CF84E5691EB9E, 0x4FC1F5EF2752AA9B,
    0xF5B7391A5E0A33EB, 0xB9B84B83B4E96C9C, 0x5E42FE712A5CD9B4, 0xA150F2F90C3F97DC,
    0x7FA522D75E2D637D, 0x181AD0CC0DFFD32B, 0x3889ED981E854028, 0xFB4297E8C586EE2D,
    0x6D064A45BB28059C, 0x90563609B3EC860C, 0x7AA4FCE94097C666, 0x1326BAC06B911E08,
    0xB926168D2B154F34, 0x9919848945B1948D, 0xA2A98FC534825EBE, 0xE9809095213EF0B6,
    0x582E5483707BC0E9, 0x086E9414A88A6AF5, 0xEE86B98D20F6743D, 0xF89B7FF609B1C0A7,
    0x4C7D9CC19E22C3E8, 0x9A97005024562A6F, 0x5DD41CF423E6EBEF, 0xDF13609C0468E227,
    0x6E0DA4F64188155A, 0xB755BA4B50D7D4A1, 0x887A3484647479BD, 0xAB8EEBE9BF2139A0,
    0x75542C5D4CD2A6FF,
]  # fmt: skip


def _compiled() -> type:
    core = hh._compiled
    assert core is not None, "exporter.profiles._highwayhash was not built"
    return core


IMPLEMENTATIONS = {
    "compiled": lambda key: _compiled()(*key),
    "pure": hh._PureHighwayHash64,
}


def _hash(kind: str, data: bytes, key: hh.Key, pieces: int = 1) -> int:
    hasher = IMPLEMENTATIONS[kind](key)
    cuts = sorted(random.Random(len(data)).sample(range(len(data) + 1), pieces - 1))
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        hasher.update(data[start:end])
    return int(hasher.digest())


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_published_vectors(kind: str) -> None:
    data = bytes(range(65))
    got = [_hash(kind, data[:size], KEY1) for size in range(65)]
    assert [f"{g:016x}" for g in got] == [f"{e:016x}" for e in EXPECTED64]
    assert _hash(kind, bytes(range(128, 161)), KEY2) == 0x53C516CCE478CAD7


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_riegeli_values_printed_in_its_spec(kind: str) -> None:
    signature = rw.SIGNATURE
    block_hash = int.from_bytes(signature[0:8], "little")
    chunk_hash = int.from_bytes(signature[24:32], "little")
    data_hash = int.from_bytes(signature[40:48], "little")
    assert _hash(kind, signature[8:24], hh.RIEGELI_KEY) == block_hash
    assert _hash(kind, signature[32:64], hh.RIEGELI_KEY) == chunk_hash
    assert _hash(kind, b"", hh.RIEGELI_KEY) == data_hash


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_pieces_hash_like_the_whole(kind: str) -> None:
    rng = random.Random(5)
    for size in (*range(70), 1000, 4099):
        data = rng.randbytes(size)
        whole = _hash(kind, data, hh.RIEGELI_KEY)
        assert _hash(kind, data, hh.RIEGELI_KEY, pieces=min(7, size + 1)) == whole


def test_the_compiled_core_agrees_with_the_twin() -> None:
    rng = random.Random(6)
    for size in (31, 32, 33, 63, 95, 128, 777, 5000):
        data = rng.randbytes(size)
        key = tuple(rng.getrandbits(64) for _ in range(4))
        assert _hash("compiled", data, key) == _hash("pure", data, key)  # type: ignore[arg-type]


def test_digest_leaves_the_state_alone() -> None:
    for make in IMPLEMENTATIONS.values():
        hasher = make(hh.RIEGELI_KEY)
        hasher.update(b"partial packet")
        first = hasher.digest()
        assert hasher.digest() == first
        hasher.update(b" and more")
        assert hasher.digest() == hh.riegeli_hash(b"partial packet and more")
