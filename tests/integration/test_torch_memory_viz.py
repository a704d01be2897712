"""Differential: our memory flame graph of a snapshot against PyTorch's own
``torch.cuda._memory_viz`` on the same file.

``_memory_viz memory`` writes one folded line per live block, ``stream;state;frames
requested_size`` (frames ``file:line:name``, outermost first, CPython and recorder frames
filtered out), plus a ``<gaps>`` line for the block's rounding (``size - requested``). So
per Python stack its live lines give our ``requested_bytes`` label and its block count our
``inuse_objects``, and all its ``active_allocated`` lines together our ``inuse_space``.
Segments are also run through ``segsum`` (``_memory_viz stats``), which raises unless
their blocks add up, so the hand-built snapshots are ones PyTorch accepts.
Needs PyTorch (``pip install 'torch==2.13.0'``, a CPU build is enough); skipped without.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from exporter.profiles.torch_memory import torch_memory_pprof
from exporter.proto import profile_pb2
from tests import torch_snapshots as ts

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="PyTorch not installed (pip install 'torch==2.13.0')",
    ),
]

# PyTorch's reader, run as the user would on a trusted file: one process for all files.
REFERENCE = textwrap.dedent("""
    import json, pickle, sys
    from torch.cuda import _memory_viz
    out = {}
    for path in sys.argv[1:]:
        with open(path, "rb") as handle:
            data = pickle.load(handle)
        if isinstance(data, list):  # segments only, as _memory_viz's own _read() does
            data = {"segments": data, "traces": []}
        out[path] = {
            "memory": _memory_viz.memory(data, format_flamegraph=lambda lines: lines),
            # `_memory_viz stats`: raises unless the segments add up, so a hand-built
            # snapshot that PyTorch would not write fails here, not in our reader.
            "stats": _memory_viz.segsum(data),
        }
    print(json.dumps(out))
""")

Key = tuple[str, ...]


def _reference(lines: str) -> tuple[Counter[Key], Counter[Key], int]:
    """(requested bytes, blocks) per Python stack and all live bytes, from PyTorch."""
    requested: Counter[Key] = Counter()
    blocks: Counter[Key] = Counter()
    live = 0
    for line in lines.splitlines():
        stack, value = line.rsplit(" ", 1)
        _stream, state, *frames = stack.split(";")
        if state != "active_allocated":
            continue
        live += int(value)
        if frames == ["<gaps>"]:
            continue
        key = tuple(f for f in frames if f.split(":", 1)[0].endswith(".py"))
        requested[key] += int(value)
        blocks[key] += 1
    return requested, blocks, live


def _ours(profile: profile_pb2.Profile) -> tuple[Counter[Key], Counter[Key], int]:
    table = profile.string_table
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    requested: Counter[Key] = Counter()
    blocks: Counter[Key] = Counter()
    live = 0
    for sample in profile.sample:
        key = []
        for loc_id in reversed(sample.location_id):
            line = locations[loc_id].line[0]
            fn = functions[line.function_id]
            file = table[fn.filename]
            if file.endswith(".py"):  # _memory_viz shows the raw name: system_name
                key.append(f"{file.rsplit('/', 1)[-1]}:{line.line}:{table[fn.system_name]}")
        labels = {table[label.key]: label for label in sample.label}
        requested[tuple(key)] += labels["requested_bytes"].num
        blocks[tuple(key)] += sample.value[0]
        live += sample.value[1]
    return requested, blocks, live


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("torch-snapshots")
    return {
        "training": ts.write(directory / "training.pickle", ts.training_snapshot()),
        "legacy": ts.write(directory / "legacy.pickle", ts.legacy_history_snapshot(), 2),
        **{
            f"random-{seed}": ts.write(directory / f"random-{seed}.pickle",
                                       ts.random_snapshot(seed, blocks=3000, devices=3))
            for seed in (1, 2)
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def reference(snapshots: dict[str, Path]) -> dict[str, dict[str, str]]:
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, *map(str, snapshots.values())],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, dict[str, str]] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize("name", ["training", "legacy", "random-1", "random-2"])
def test_per_stack_totals_match_memory_viz(
    name: str, snapshots: dict[str, Path], reference: dict[str, dict[str, str]]
) -> None:
    path = snapshots[name]
    profile = profile_pb2.Profile.FromString(torch_memory_pprof(path))
    want_requested, want_blocks, want_live = _reference(reference[str(path)]["memory"])
    requested, blocks, live = _ours(profile)
    assert want_live > 0
    assert live == want_live  # inuse_space: block sizes, rounding included
    assert blocks == want_blocks  # inuse_objects per stack
    assert requested == want_requested  # requested_bytes per stack
