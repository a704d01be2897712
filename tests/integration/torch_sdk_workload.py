"""A PyTorch training loop profiled through the SDK (``run.torch_profile``), on CPU.

Usage: ``python torch_sdk_workload.py SHARED_DIR``. The trace lands in
``SHARED_DIR/torch_traces/`` for the sidecar (run in its own process by the test).
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from exporter import sdk

STEPS = 6


def main(shared_dir: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with (
        sdk.run(name="torch-trainer", shared_dir=shared_dir, host="cpu-a", run_id="run-t") as run,
        run.torch_profile(
            "train",
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=STEPS, repeat=1),
            with_stack=True,
            profile_memory=True,
        ) as prof,
    ):
        for _ in range(STEPS + 1):
            with record_function("data_loader"):
                batch = data + 0.0
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch), target)
            loss.backward()
            optimizer.step()
            prof.step()


if __name__ == "__main__":
    main(sys.argv[1])
