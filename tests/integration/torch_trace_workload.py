"""A small PyTorch training loop profiled by torch.profiler on CPU (run in its own process).

Usage: ``python torch_trace_workload.py OUT_DIR [--extra-op] [--steps N] [--memory]``.
Writes ``OUT_DIR/trace.pt.trace.json`` (Kineto's Chrome-trace JSON, ``with_stack=True``)
and ``OUT_DIR/key_averages.json``: torch's own per-op self/total CPU time and call counts
(``prof.key_averages()``, in microseconds), the reference the reader is checked against.
``--extra-op`` adds an ``aten::cumsum`` in each step (new work, for comparisons).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(64, 128)
        self.second = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    extra = "--extra-op" in argv
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 16
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64)
    target = torch.randint(0, 10, (32,))
    wide = torch.randn(256, 256)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out / "trace.pt.trace.json")),
        with_stack=True,
        record_shapes=True,
        profile_memory="--memory" in argv,
    ) as prof:
        for _ in range(steps + 1):
            with record_function("data_loader"):
                batch = data + 0.0
            with record_function("train_step"):
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(batch), target)
                if extra:  # new work, about as long as the rest of the step
                    loss = loss + wide.cumsum(0).sum() * 0.0
                loss.backward()
                optimizer.step()
            prof.step()
    averages = {
        e.key: {
            "self_cpu_us": e.self_cpu_time_total,
            "cpu_us": e.cpu_time_total,
            "count": e.count,
        }
        for e in prof.key_averages()
    }
    (out / "key_averages.json").write_text(json.dumps(averages, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
