#!/usr/bin/env python3
"""Record a real PyTorch CUDA memory snapshot of a small training loop, as a test fixture.

Needs an NVIDIA GPU and PyTorch with CUDA. Run from the repository root:

    python scripts/torch-memory-snapshot.py tests/fixtures/torch_memory/train.pickle
    python scripts/torch-memory-snapshot.py --cpp-stacks tests/fixtures/torch_memory/cpp.pickle

It goes through the SDK as a workload would (``run.record_memory_history()``, a few
training steps, ``run.memory_snapshot()``), copies the snapshot to OUTPUT, then checks the
reader against the allocator itself and against PyTorch's own ``_memory_viz``:

- live bytes of our pprof == ``torch.cuda.memory_allocated()`` taken at the snapshot
- live bytes of our pprof == the ``active_allocated`` lines of ``_memory_viz.memory``
- blocks of our pprof == the ``active_allocated`` blocks in the snapshot

It prints one ``ok``/``MISMATCH`` line per check and exits 1 on a mismatch, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _train(steps: int) -> tuple[object, list[object]]:
    """A two-layer model and Adam, with some activations kept alive (a leak-like cache)."""
    import torch as t

    class Block(t.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.linear = t.nn.Linear(width, width)

        def forward(self, x: t.Tensor) -> t.Tensor:
            return t.relu(self.linear(x))

    class Model(t.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.blocks = t.nn.Sequential(Block(width), Block(width))
            self.head = t.nn.Linear(width, 10)

        def forward(self, x: t.Tensor) -> t.Tensor:
            return self.head(self.blocks(x))

    device = t.device("cuda:0")
    model = Model(1024).to(device)
    optimizer = t.optim.Adam(model.parameters(), lr=1e-3)
    kept: list[object] = []
    for step in range(steps):
        x = t.randn(256, 1024, device=device)
        y = t.randint(0, 10, (256,), device=device)
        loss = t.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 2 == 0:
            kept.append(model.blocks(x).detach())  # live at the snapshot, its own stack
    t.cuda.synchronize()
    return model, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="where to write the snapshot pickle")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cpp-stacks", action="store_true", help="record C++ frames too")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        print("torch-memory-snapshot: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch-memory-snapshot: no CUDA device (torch.cuda.is_available() is False)",
              file=sys.stderr)  # fmt: skip
        return 2

    from exporter import sdk
    from exporter.profiles.torch_memory import torch_memory_pprof
    from exporter.proto import profile_pb2

    with tempfile.TemporaryDirectory() as shared, sdk.run("torch-fixture", shared) as run:
        if not run.record_memory_history(cpp_stacks=args.cpp_stacks):
            return 2
        model, kept = _train(args.steps)
        allocated = torch.cuda.memory_allocated(0)  # nothing allocates between the two
        path = run.memory_snapshot("programmatic")
        if path is None:
            return 2
        args.output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, args.output)
        del model, kept  # alive until the snapshot was taken
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}")  # fmt: skip

    profile = profile_pb2.Profile.FromString(torch_memory_pprof(args.output))
    ours_bytes = sum(s.value[1] for s in profile.sample)
    ours_blocks = sum(s.value[0] for s in profile.sample)
    with args.output.open("rb") as handle:
        snapshot = pickle.load(handle)  # our own file, just written
    live = [
        b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    ]
    from torch.cuda import _memory_viz

    viz_bytes = sum(
        int(line.rsplit(" ", 1)[1])
        for line in _memory_viz.memory(snapshot, format_flamegraph=lambda text: text).splitlines()
        if line.split(";")[1] == "active_allocated"
    )
    checks = [
        ("live bytes == torch.cuda.memory_allocated()", ours_bytes, allocated),
        ("live bytes == _memory_viz memory (active_allocated)", ours_bytes, viz_bytes),
        ("live blocks == active_allocated blocks", ours_blocks, len(live)),
    ]
    failed = False
    for what, ours, reference in checks:
        ok = ours == reference
        failed |= not ok
        print(f"{'ok' if ok else 'MISMATCH'}: {what}: {ours} vs {reference}")
    stacks = sum(1 for b in live if b.get("frames"))
    print(f"{len(profile.sample)} stacks; {stacks} of {len(live)} live blocks have frames")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
