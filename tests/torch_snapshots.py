"""PyTorch CUDA allocator snapshots built by hand, in the format ``torch.cuda.memory._snapshot()``
returns (documented in ``torch/cuda/memory.py``, written by
``torch/csrc/cuda/memory_snapshot.cpp``), without torch.

Frames are innermost first and shared between stacks, as PyTorch's symbolizer shares them;
segments are contiguous blocks whose sizes add up to ``total_size``, so PyTorch's own
``_memory_viz`` accepts them (its ``segsum`` checks that).
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Frame = dict[str, Any]
SNAPSHOT_TIME_US = 1_700_000_123_456_789


def frame(name: str, filename: str, line: int) -> Frame:
    return {"filename": filename, "line": line, "name": name}


def block(
    size: int,
    frames: Sequence[Frame] = (),
    state: str = "active_allocated",
    requested: int | None = None,
) -> dict[str, Any]:
    return {
        "size": size,
        "requested_size": size if requested is None else requested,
        "state": state,
        "frames": list(frames),
    }


def segment(
    blocks: Iterable[dict[str, Any]],
    device: int = 0,
    stream: int = 0,
    address: int = 0x7F0000000000,
) -> dict[str, Any]:
    blocks = list(blocks)
    offset = address
    for item in blocks:
        item["address"] = offset
        offset += item["size"]
    live = [b for b in blocks if b["state"] == "active_allocated"]
    return {
        "device": device,
        "address": address,
        "total_size": offset - address,
        "allocated_size": sum(b["size"] for b in live),
        "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
        "requested_size": sum(b["requested_size"] for b in live),
        "stream": stream,
        "segment_type": "large" if offset - address > 2**20 else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def snapshot(
    segments: Iterable[dict[str, Any]],
    traces: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    return {
        "segments": list(segments),
        "device_traces": traces if traces is not None else [[]],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "roundup_power2_divisions": {"1": 0},
        },
    }


def write(path: Path, data: object, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


# -- a small training job, recorded with stacks="all" (Python and C++ frames) ---------------
MAIN = frame("<module>", "/job/train.py", 88)
LOOP = frame("train", "/job/train.py", 61)
STEP = frame("train_step", "/job/train.py", 40)
MODEL_FWD = frame("forward", "/job/model.py", 22)  # two functions named forward, two files
ATTN_FWD = frame("forward", "/job/attention.py", 15)
OPT_STEP = frame("step", "/venv/torch/optim/adam.py", 213)
EVAL = frame("_PyEval_EvalFrameDefault", "/usr/src/python/Python/ceval.c", 4200)
CALL = frame("_PyObject_Call", "/usr/src/python/Objects/call.c", 305)
VECTORCALL = frame("PyObject_Vectorcall", "/usr/src/python/Include/cpython/abstract.h", 114)
THP_ADD = frame(
    "torch::autograd::THPVariable_matmul(_object*, _object*, _object*)",
    "/pytorch/torch/csrc/autograd/generated/python_torch_functions_0.cpp",
    4312,
)
EMPTY = frame(
    "at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>)",
    "/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp",
    50,
)
MALLOC = frame(
    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
    "(signed char, unsigned long, CUstream_st*)",
    "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
    1204,
)
UNKNOWN = frame("??", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x2A4F10)  # dladdr/fast mode
RECORDER = [
    frame("torch::unwind::unwind()", "/pytorch/torch/csrc/profiler/unwind/unwind.cpp", 301),
    frame(
        "torch::CapturedTraceback::gather(bool, bool, bool)",
        "/pytorch/torch/csrc/profiler/combined_traceback.cpp",
        12,
    ),
    frame(
        "torch::cuda::(anonymous namespace)::gather_with_cpp()",
        "/pytorch/torch/csrc/cuda/memory_snapshot.cpp",
        96,
    ),
]


def _cpp_stack(python: Sequence[Frame]) -> list[Frame]:
    """An innermost-first stack with C++ frames, as symbolize() interleaves them."""
    out = [*RECORDER, MALLOC, UNKNOWN, EMPTY, THP_ADD]
    for py in python:
        out += [py, EVAL, CALL, VECTORCALL]
    return out


MODEL_STACK = _cpp_stack([MODEL_FWD, STEP, LOOP, MAIN])
ATTN_STACK = _cpp_stack([ATTN_FWD, MODEL_FWD, STEP, LOOP, MAIN])
OPT_STACK = [OPT_STEP, STEP, LOOP, MAIN]  # stacks="python": no C++ frames


def training_snapshot() -> dict[str, Any]:
    """Two devices, live and freed blocks, stacks with and without C++ frames, one block
    allocated before recording started (no stack), rounding (requested < size)."""
    dev0 = [
        segment(
            [
                block(2 * 2**20, MODEL_STACK, requested=2 * 2**20 - 100),
                block(4 * 2**20, ATTN_STACK),
                block(1 * 2**20, MODEL_STACK, state="active_pending_free"),
                block(3 * 2**20, [], state="inactive"),
                block(2 * 2**20, OPT_STACK, requested=1_500_000),
            ],
            device=0,
            address=0x7F0000000000,
        ),
        segment(
            [
                block(512, MODEL_STACK, requested=4),
                block(1024, []),  # allocated before _record_memory_history()
                block(512, ATTN_STACK, state="inactive"),
            ],
            device=0,
            stream=7,
            address=0x7F1000000000,
        ),
    ]
    dev1 = [
        segment(
            [
                block(8 * 2**20, ATTN_STACK, requested=8 * 2**20 - 512),
                block(8 * 2**20, [], state="inactive"),
            ],
            device=1,
            address=0x7E0000000000,
        ),
    ]
    trace0 = [
        {
            "action": "alloc",
            "addr": 0x7F0000000000,
            "size": 2 * 2**20,
            "stream": 0,
            "time_us": SNAPSHOT_TIME_US - 50,
            "frames": MODEL_STACK,
        },
        {
            "action": "free_requested",
            "addr": 0x7F0000600000,
            "size": 2**20,
            "stream": 0,
            "time_us": SNAPSHOT_TIME_US - 10,
            "frames": MODEL_STACK,
        },
        {
            "action": "snapshot",
            "addr": 0,
            "size": 0,
            "stream": 0,
            "time_us": SNAPSHOT_TIME_US,
            "frames": [],
        },
    ]
    return snapshot([*dev0, *dev1], [trace0, []])


def live_totals(data: dict[str, Any]) -> tuple[int, int]:
    """(live blocks, live bytes) straight from the snapshot: what the reader must show."""
    live = [b for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    return len(live), sum(b["size"] for b in live)


def legacy_history_snapshot() -> list[dict[str, Any]]:
    """torch 2.0's format, dumped as a bare list of segments: blocks carry ``history``
    (newest allocation first) instead of ``frames``/``requested_size``."""
    segments = [
        segment([
            block(4096, state="active_allocated"),
            block(2048, state="inactive"),
            block(1024, state="active_allocated"),
        ], device=0),
    ]  # fmt: skip
    first, freed, second = segments[0]["blocks"]
    for item in (first, freed, second):
        del item["frames"], item["requested_size"]
    first["history"] = [{"addr": first["address"], "real_size": 4000, "frames": OPT_STACK}]
    freed["history"] = [{"addr": freed["address"], "real_size": 2048, "frames": OPT_STACK}]
    second["history"] = [{"addr": second["address"], "real_size": 1000}]  # no context
    return segments


def random_snapshot(
    seed: int, blocks: int = 2000, devices: int = 2, trace_entries: int = 0
) -> dict[str, Any]:
    """Many stacks of Python and C++ frames over several devices and streams, every
    state, rounding: the shape of a real snapshot, for totals checked against PyTorch.
    ``trace_entries`` alloc/free events on device 0 make it as large as a real one."""
    rng = random.Random(seed)
    files = [f"/job/pkg/mod{i}.py" for i in range(12)]
    python = [frame(rng.choice(["forward", "step", "_call_impl", f"fn{i}"]),
                    rng.choice(files), rng.randrange(1, 500)) for i in range(60)]  # fmt: skip
    native = [MALLOC, EMPTY, THP_ADD, UNKNOWN, EVAL, CALL, VECTORCALL]
    stacks: list[list[Frame]] = [[]]
    for _ in range(80):
        depth = rng.randrange(1, 12)
        stack = [rng.choice(python) for _ in range(depth)]
        if rng.random() < 0.5:  # stacks="all"
            stack = [*RECORDER, *rng.sample(native, 3), *stack]
        stacks.append(stack)
    states = ["active_allocated"] * 6 + ["inactive"] * 2 + ["active_pending_free"]
    segments = []
    left = blocks
    address = 0x7F0000000000
    while left > 0:
        count = min(left, rng.randrange(1, 40))
        left -= count
        items = []
        for _ in range(count):
            size = rng.randrange(1, 8192) * 512
            items.append(block(size, rng.choice(stacks), rng.choice(states),
                               requested=size - rng.randrange(0, 512)))  # fmt: skip
        seg = segment(items, device=rng.randrange(devices), stream=rng.choice([0, 0, 7]),
                      address=address)  # fmt: skip
        address += seg["total_size"] + 2**21
        segments.append(seg)
    trace = [{"action": rng.choice(["alloc", "free_requested", "free_completed"]),
              "addr": address + 512 * i, "size": 512 * rng.randrange(1, 64), "stream": 0,
              "time_us": SNAPSHOT_TIME_US - trace_entries + i, "frames": rng.choice(stacks)}
             for i in range(trace_entries)]  # fmt: skip
    trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
                  "time_us": SNAPSHOT_TIME_US, "frames": []})  # fmt: skip
    return snapshot(segments, [trace] + [[] for _ in range(devices - 1)])
