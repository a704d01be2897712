"""PyTorch CUDA memory snapshots -> memory flame graphs: what is live, per-stack totals,
frame labels, format variants, and bad or hostile input (the restricted unpickler and the
memory- and time-limited converter process)."""

from __future__ import annotations

import copy
import copyreg
import gzip
import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from exporter.errors import InputError
from exporter.profiles import torch_memory
from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.frames import TRAMPOLINE, FrameLabel
from exporter.profiles.memory import memory_flamegraph
from exporter.profiles.torch_memory import (
    NO_STACK,
    is_torch_snapshot,
    read_snapshot,
    snapshot_profile,
    torch_frame_label,
    torch_memory_pprof,
)
from exporter.proto import profile_pb2
from tests import torch_snapshots as ts

MiB = 2**20
Stack = tuple[tuple[str, str, int], ...]


def samples(profile: profile_pb2.Profile) -> dict[tuple[str, Stack], tuple[int, int, int]]:
    """{(device, outermost-first (name, file, line)): (blocks, bytes, requested bytes)}."""
    table = profile.string_table
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    out = {}
    for sample in profile.sample:
        frames = []
        for loc_id in reversed(sample.location_id):
            line = locations[loc_id].line[0]
            fn = functions[line.function_id]
            frames.append((table[fn.name], table[fn.filename], line.line))
        labels = {table[label.key]: label for label in sample.label}
        device = table[labels["device"].str]
        key = (device, tuple(frames))
        assert key not in out, f"two samples for one stack: {key}"
        out[key] = (sample.value[0], sample.value[1], labels["requested_bytes"].num)
    return out


def names(stack: Stack) -> tuple[str, ...]:
    return tuple(name for name, _, _ in stack)


def graph_of(snapshot: dict[str, Any]) -> FlameGraph:
    return memory_flamegraph(snapshot_profile(snapshot).SerializeToString(), "test")


PY_LOOP = ("<module>", "train", "train_step")
CPP_LEAF = ("THPVariable_matmul", "empty_cuda", "0x2a4f10", "DeviceCachingAllocator > malloc")


def with_trampolines(python: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for name in python:
        out += [TRAMPOLINE, name]
    return tuple(out)


def test_live_bytes_and_blocks_per_allocation_stack() -> None:
    snapshot = ts.training_snapshot()
    profile = snapshot_profile(snapshot)
    table = profile.string_table
    assert [(table[t.type], table[t.unit]) for t in profile.sample_type] == [
        ("inuse_objects", "count"), ("inuse_space", "bytes")]  # fmt: skip
    assert table[profile.default_sample_type] == "inuse_space"
    model = with_trampolines((*PY_LOOP, "forward")) + CPP_LEAF
    attention = with_trampolines((*PY_LOOP, "forward", "forward")) + CPP_LEAF
    found = {(device, names(stack)): value for (device, stack), value in samples(profile).items()}
    # The model's 1 MiB block waits on a stream (active_pending_free) and the 3 MiB and
    # the attention's 512 B are cached (inactive): freed memory is not live.
    assert found == {
        ("cuda:0", model): (2, 2 * MiB + 512, 2 * MiB - 100 + 4),
        ("cuda:0", attention): (1, 4 * MiB, 4 * MiB),
        ("cuda:0", (*PY_LOOP, "step")): (1, 2 * MiB, 1_500_000),
        ("cuda:0", (NO_STACK,)): (1, 1024, 1024),
        ("cuda:1", attention): (1, 8 * MiB, 8 * MiB - 512),
    }
    blocks, size = ts.live_totals(snapshot)
    assert sum(v[0] for v in found.values()) == blocks
    graph = graph_of(snapshot)
    assert (graph.sample_type, graph.unit, graph.profile_name) == ("inuse_space", "bytes", "memory")
    assert graph.root.total == size == 16 * MiB + 1536
    assert "cuda:0;<module>;train;train_step;step 2097152" in graph.to_folded().splitlines()


def test_only_active_allocated_blocks_count() -> None:
    snapshot = ts.snapshot([ts.segment([
        ts.block(4096, ts.OPT_STACK, state="active_pending_free"),
        ts.block(8192, ts.OPT_STACK, state="inactive"),
        ts.block(512, ts.OPT_STACK, state="active_awaiting_free"),  # the docstring's name
    ])])  # fmt: skip
    profile = snapshot_profile(snapshot)
    assert list(profile.sample) == []
    assert graph_of(snapshot).root.total == 0


def test_a_block_without_stack_is_one_named_frame() -> None:
    snapshot = ts.snapshot([ts.segment([ts.block(1536, [])])])
    assert graph_of(snapshot).to_folded() == f"cuda:0;{NO_STACK} 1536\n"


def test_native_frames_keep_addresses_and_the_recorder_is_dropped() -> None:
    profile = snapshot_profile(ts.snapshot([ts.segment([ts.block(512, ts.MODEL_STACK)])]))
    ((_, stack),) = samples(profile)
    assert stack[-4:] == (
        ("THPVariable_matmul",
         "/pytorch/torch/csrc/autograd/generated/python_torch_functions_0.cpp", 4312),
        ("empty_cuda", "/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp", 50),
        ("0x2a4f10", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0),
        ("DeviceCachingAllocator > malloc", "/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1204),
    )  # fmt: skip
    # CPython's _PyEval_EvalFrameDefault, _PyObject_Call and PyObject_Vectorcall between
    # two Python frames are one trampoline frame, not three.
    assert names(stack)[:4] == (TRAMPOLINE, "<module>", TRAMPOLINE, "train")
    raw = {profile.string_table[f.system_name] for f in profile.function}
    assert ts.MALLOC["name"] in raw  # the demangled symbol stays in the pprof
    assert not any("gather" in name or "unwind" in name for name in raw)


@pytest.mark.parametrize(
    ("frame", "label"),
    [
        (("forward", "/m/model.py", 3), FrameLabel("forward", "/m/model.py", 3)),
        (("Block.forward", "/m/model.py", 3), FrameLabel("Block > forward", "/m/model.py", 3)),
        (("<module>", "<string>", 1), FrameLabel("<module>", "<string>", 1)),
        (("_PyEval_EvalFrameDefault.cold", "Python/ceval.c", 9),
         FrameLabel(TRAMPOLINE, "Python/ceval.c", 9)),
        (("void at::native::(anonymous namespace)::copy_kernel<float>(at::TensorIterator&)",
          "Copy.cu", 7), FrameLabel("copy_kernel", "Copy.cu", 7)),
        (("std::_Function_handler<void (), at::Foo>::_M_invoke(std::_Any_data const&)",
          "/usr/include/c++/11/bits/std_function.h", 290),
         FrameLabel("_M_invoke", "/usr/include/c++/11/bits/std_function.h", 290)),
        (("at::Tensor::Storage::data() const", "Storage.h", 4),
         FrameLabel("Storage > data", "Storage.h", 4)),
        # fast/dladdr symbolizers: library as file, offset as line
        (("??", "/lib/libcudart.so.12", 0x1F2E), FrameLabel("0x1f2e", "/lib/libcudart.so.12")),
        (("cudaMalloc", "/lib/libcudart.so.12", 0x1F2E),
         FrameLabel("cudaMalloc", "/lib/libcudart.so.12")),
        # addr2line knew nothing: no address to show
        (("??", "??", 0), FrameLabel("??", "", 0)),
        (("<unwind unsupported>", "??", 0), FrameLabel("<unwind unsupported>", "", 0)),
        (("torch::CapturedTraceback::gather(bool, bool, bool)", "traceback.cpp", 12), None),
    ],
)  # fmt: skip
def test_frame_labels(frame: tuple[str, str, int], label: FrameLabel | None) -> None:
    assert torch_frame_label(*frame) == label


def _same_name_snapshot() -> dict[str, Any]:
    step = ts.frame("step", "/job/train.py", 5)
    foo_a, foo_b = ts.frame("foo", "/job/a.py", 10), ts.frame("foo", "/job/b.py", 10)
    return ts.snapshot([ts.segment([ts.block(100, [foo_a, step]), ts.block(50, [foo_b, step])])])


def test_same_name_functions_in_different_files_are_two_functions_in_the_pprof() -> None:
    profile = snapshot_profile(_same_name_snapshot())
    assert sorted(samples(profile).items()) == [
        (("cuda:0", (("step", "/job/train.py", 5), ("foo", "/job/a.py", 10))), (1, 100, 100)),
        (("cuda:0", (("step", "/job/train.py", 5), ("foo", "/job/b.py", 10))), (1, 50, 50)),
    ]


def test_same_name_functions_in_different_files_stay_two_frames() -> None:
    graph = graph_of(_same_name_snapshot())
    leaves = {(node.name, node.file, node.total) for _, node in graph.paths() if not node.children}
    assert leaves == {("foo", "/job/a.py", 100), ("foo", "/job/b.py", 50)}


def test_format_variants() -> None:
    # torch 2.0: a bare list of segments whose blocks carry history, newest first.
    legacy = snapshot_profile(read_snapshot(pickle.dumps(ts.legacy_history_snapshot(), 2)))
    assert {(d, names(s)): v for (d, s), v in samples(legacy).items()} == {
        ("cuda:0", (*PY_LOOP, "step")): (1, 4096, 4000),
        ("cuda:0", (NO_STACK,)): (1, 1024, 1000),
    }
    # Only the newest history entry is the live allocation.
    older = ts.legacy_history_snapshot()
    older[0]["blocks"][0]["history"].append({"real_size": 96, "frames": ts.MODEL_STACK})
    assert samples(snapshot_profile({"segments": older})) == samples(legacy)
    # No requested_size, tuple frames, a frame without a line, a segment without device.
    seg = ts.segment(
        [ts.block(2048, (ts.frame("f", "/x.py", 1), {"name": "g", "filename": "/y.py"}))]
    )
    del seg["blocks"][0]["requested_size"], seg["device"]
    seg["blocks"][0]["frames"] = tuple(seg["blocks"][0]["frames"])
    assert samples(snapshot_profile(ts.snapshot([seg]))) == {
        ("cuda", (("g", "/y.py", 0), ("f", "/x.py", 1))): (1, 2048, 2048)
    }  # fmt: skip


def test_snapshot_time_comes_from_its_trace_entry() -> None:
    assert snapshot_profile(ts.training_snapshot()).time_nanos == ts.SNAPSHOT_TIME_US * 1000
    assert snapshot_profile(ts.snapshot([], [[]])).time_nanos == 0


def _broken(change: str) -> dict[str, Any]:
    snapshot = copy.deepcopy(ts.training_snapshot())
    block = snapshot["segments"][0]["blocks"][1]
    if change == "size":
        block["size"] = "4096"
    elif change == "negative":
        block["requested_size"] = -1
    elif change == "state":
        block["state"] = None
    elif change == "frames":
        block["frames"] = "train.py:3"
    elif change == "frame":
        block["frames"][2] = {"name": 3, "filename": "x.py", "line": 1}
    elif change == "segments":
        snapshot["segments"] = {"0": snapshot["segments"][0]}
    elif change == "shared":  # the same block object twice: a hostile amplifier
        snapshot["segments"][1]["blocks"].append(block)
    return snapshot


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("size", "segments[0].blocks[1].size: expected a byte count, got str '4096'"),
        (
            "negative",
            "segments[0].blocks[1].requested_size: expected a non-negative byte count, got -1",
        ),
        ("state", "segments[0].blocks[1].state: expected a string, got NoneType None"),
        ("frames", "segments[0].blocks[1].frames: expected a list of frames, got str 'train.py:3'"),
        ("frame", "segments[0].blocks[1].frames[2].name: expected a string, got int 3"),
        ("segments", "segments: expected a list, got dict"),
        ("shared", "segments[1].blocks[3]: the same block object appears twice"),
    ],
)
def test_bad_snapshots_name_the_field(change: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        snapshot_profile(_broken(change), "snap.pickle")
    assert str(info.value) == f"snap.pickle: {message}"


# -- the restricted unpickler ---------------------------------------------------------------
class _Evil:
    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.sentinel}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_pickle_that_runs_code_is_refused(tmp_path: Path, protocol: int) -> None:
    sentinel = tmp_path / "pwned"
    snapshot = ts.training_snapshot()
    snapshot["segments"][0]["blocks"][0]["frames"] = [_Evil(sentinel)]  # deep inside
    data = pickle.dumps(snapshot, protocol=protocol)
    pickle.loads(pickle.dumps(_Evil(tmp_path / "proof")))  # the payload does work...
    assert (tmp_path / "proof").exists()
    with pytest.raises(InputError, match=r"refused global (posix|os|nt)\.system") as info:
        read_snapshot(data, "evil.pickle")  # ...but not here
    assert not sentinel.exists()
    assert str(info.value).startswith("evil.pickle: not a safe PyTorch memory snapshot")


def test_extension_codes_and_persistent_ids_are_refused(tmp_path: Path) -> None:
    # An extension code names a global through copyreg's registry, not a GLOBAL opcode.
    module = os.system.__module__
    copyreg.add_extension(module, "system", 0xF0)
    try:
        data = pickle.dumps(_Evil(tmp_path / "pwned"), protocol=2)
        assert b"\x82\xf0" in data  # EXT1 240
        with pytest.raises(InputError, match=f"refused global {module}.system"):
            read_snapshot(data)
    finally:
        copyreg.remove_extension(module, "system", 0xF0)

    class Persistent(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return "tensor-0" if obj == "weights" else None

    buffer = io.BytesIO()
    Persistent(buffer, protocol=4).dump({"segments": ["weights"]})
    with pytest.raises(InputError, match="refused persistent id"):
        read_snapshot(buffer.getvalue())
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty file"),
        (b"\x80\x04\x95\x10\x00", "not a PyTorch memory snapshot pickle"),  # truncated
        (pickle.dumps(ts.training_snapshot())[:-40], "not a PyTorch memory snapshot pickle"),
        (b"\x1f\x8b\x08\x00garbage", "not a PyTorch memory snapshot pickle"),
        (pickle.dumps(42), "expected a dict with 'segments'"),
        (pickle.dumps({"device_traces": []}), "expected a dict with 'segments'"),
    ],
)
def test_not_a_snapshot_is_one_line(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        read_snapshot(data, "x.pickle")
    assert "\n" not in str(info.value) and str(info.value).startswith("x.pickle: ")


def test_size_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    data = pickle.dumps(ts.training_snapshot())
    monkeypatch.setattr(torch_memory, "MAX_SNAPSHOT_BYTES", len(data) - 1)
    with pytest.raises(InputError, match=f"{len(data)} bytes is over the {len(data) - 1}"):
        read_snapshot(data)


# -- files and the limited converter process -------------------------------------------------
def test_converter_process_gives_the_same_pprof(tmp_path: Path) -> None:
    snapshot = ts.random_snapshot(3, blocks=300)
    path = ts.write(tmp_path / "snap.pickle", snapshot)
    assert torch_memory_pprof(path) == snapshot_profile(snapshot, str(path)).SerializeToString()


def test_converter_process_refuses_code_and_memory_bombs(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [_Evil(sentinel)]}))
    with pytest.raises(InputError, match="refused global"):
        torch_memory_pprof(evil)
    assert not sentinel.exists()
    # 4 MB of EMPTY_DICT opcodes unpickle into ~350 MB of dicts.
    bomb = tmp_path / "bomb.pickle"
    bomb.write_bytes(b"\x80\x04](" + b"}" * 4_000_000 + b"e.")
    with pytest.raises(InputError, match="more than the converter's 64000000 bytes memory limit"):
        torch_memory_pprof(bomb, memory_limit=64_000_000)
    with pytest.raises(InputError, match=r"took over 0.001s; stopped"):
        torch_memory_pprof(bomb, timeout_s=0.001)


def test_a_fifo_named_like_a_snapshot_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "h-1-2-3.pickle"
    os.mkfifo(fifo)  # no writer: open() or read() without care would wait forever
    with pytest.raises(InputError, match="not a regular file"):
        torch_memory_pprof(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        torch_memory.convert_file(fifo)


def test_snapshot_files_are_recognised(tmp_path: Path) -> None:
    data = pickle.dumps(ts.training_snapshot())
    assert is_torch_snapshot(ts.write(tmp_path / "a.pickle", {}))
    (tmp_path / "dump").write_bytes(data)  # no suffix: the pickle header tells
    assert is_torch_snapshot(tmp_path / "dump")
    (tmp_path / "p.pb.gz").write_bytes(gzip.compress(b"\x0a\x02"))
    assert not is_torch_snapshot(tmp_path / "p.pb.gz")
    assert not is_torch_snapshot(tmp_path / "missing")
