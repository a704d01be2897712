"""``run.record_memory_history()`` / ``run.memory_snapshot()``: snapshots land in the shared
dir, the sidecar's watcher converts them, requests are answered; without PyTorch or CUDA
one line on stderr and nothing else.

No CUDA device here: :class:`CudaTorch` stands in for ``torch`` with the two allocator
calls the SDK makes, returning a snapshot in PyTorch's documented format. Real CPU-only
PyTorch, when installed, is checked for the no-CUDA line in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from exporter import schema, sdk
from exporter.pipeline.memory_watcher import (
    MemoryProfileWatcher,
    answers_to,
    request_memory_profile,
)
from exporter.profiles.torch_memory import read_snapshot
from tests import torch_snapshots as ts


class CudaTorch:
    """``torch`` as the SDK sees it on a CUDA machine (``cuda.is_available``,
    ``cuda.memory._record_memory_history``, ``cuda.memory._snapshot``)."""

    def __init__(self, available: bool = True) -> None:
        self.history_calls: list[dict[str, Any]] = []
        self.snapshot = ts.training_snapshot()
        memory = SimpleNamespace(
            _record_memory_history=lambda **kw: self.history_calls.append(kw),
            _snapshot=lambda: self.snapshot,
        )
        self.cuda = SimpleNamespace(is_available=lambda: available, memory=memory)


@pytest.fixture
def cuda_torch(monkeypatch: pytest.MonkeyPatch) -> CudaTorch:
    fake = CudaTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_snapshot_is_written_converted_and_answers_requests(
    tmp_path: Path, cuda_torch: CudaTorch
) -> None:
    shared = tmp_path / "shared"
    with sdk.run("trainer", shared_dir=shared, run_id="r1", host="gpu-0") as run:
        assert run.record_memory_history(max_entries=5000)
        assert cuda_torch.history_calls == [
            {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000}
        ]
        path = run.memory_snapshot()
        assert path is not None and path.parent == shared / schema.MEMORY_DIR
        assert path.name.startswith("gpu-0-") and path.name.endswith(".pickle")
        assert read_snapshot(path.read_bytes()) == cuda_torch.snapshot
        meta = json.loads(path.with_name(path.name[: -len(".pickle")] + ".json").read_text())
        assert (meta["run_id"], meta["workload"], meta["trigger"]) == (
            "r1",
            "trainer",
            "programmatic",
        )
        assert not list(path.parent.glob(".*.tmp"))  # written atomically

        # The sidecar asks; the flusher's tick answers with a snapshot, not a JAX profile.
        request_id = request_memory_profile(shared)
        assert run._memory is not None
        run._memory.tick()
        (answer,) = answers_to(shared, request_id)
        assert answer.suffix == ".pickle"

    assert cuda_torch.history_calls[-1] == {"enabled": None}  # close() stops recording
    published: list[tuple[int, dict[str, str]]] = []
    results = MemoryProfileWatcher(
        shared, lambda graph, labels: published.append((graph.root.total, labels))
    ).poll()
    assert [r.error for r in results] == ["", ""]
    live_bytes = ts.live_totals(cuda_torch.snapshot)[1]
    assert [total for total, _ in published] == [live_bytes, live_bytes]
    assert published[1][1] == {"service_name": "trainer", "run_id": "r1", "host": "gpu-0",
                               "trigger": "manual", "profile_source": "device_memory"}  # fmt: skip


def test_cpp_stacks_are_asked_for(tmp_path: Path, cuda_torch: CudaTorch) -> None:
    with sdk.run("trainer", shared_dir=tmp_path) as run:
        run.record_memory_history(cpp_stacks=True)
    assert cuda_torch.history_calls[0]["stacks"] == "all"
    assert cuda_torch.history_calls[0]["max_entries"] == 100_000


def test_without_cuda_one_line_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", CudaTorch(available=False))
    with sdk.run("trainer", shared_dir=tmp_path) as run:
        assert run.record_memory_history() is False
        assert run.memory_snapshot() is None
    monkeypatch.setitem(sys.modules, "torch", None)  # not installed: import fails
    with sdk.run("trainer", shared_dir=tmp_path) as run:
        assert run.memory_snapshot() is None
    assert capsys.readouterr().err.splitlines() == [
        "mlprof: record_memory_history: no CUDA device (torch.cuda.is_available() is False); "
        "skipped",
        "mlprof: memory_snapshot: no CUDA device (torch.cuda.is_available() is False); skipped",
        "mlprof: memory_snapshot: PyTorch is not installed (pip install "
        "'mlprof-exporter[torch]'); skipped",
    ]
    assert not (tmp_path / schema.MEMORY_DIR).exists()


def test_cpu_only_pytorch_says_no_cuda_in_one_line(tmp_path: Path) -> None:
    # The dev extra installs CPU PyTorch (torch==2.13.0): a real torch without CUDA.
    script = textwrap.dedent(f"""
        from exporter import sdk
        with sdk.run("trainer", shared_dir={str(tmp_path)!r}) as run:
            print(run.record_memory_history(), run.memory_snapshot())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False None\n"
    lines = [line for line in done.stderr.splitlines() if line.startswith("mlprof: ")]
    assert lines == [
        "mlprof: record_memory_history: no CUDA device (torch.cuda.is_available() is False); "
        "skipped",
        "mlprof: memory_snapshot: no CUDA device (torch.cuda.is_available() is False); skipped",
    ]
    assert "Traceback" not in done.stderr
