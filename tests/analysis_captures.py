"""Real JAX CPU captures for the comparison and analysis tests, made once per session.

Two processes run ``tests/integration/analysis_workload.py``: one captures the
``compute``, ``heavy`` and ``sleepy`` workloads and two device-memory profiles, the other
captures ``compute`` again, so "the same workload twice" is two processes, as in life,
and the README demo's slowed input and a recompiling step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import ROOT, Proc, wait_until

WORKLOAD = ROOT / "tests" / "integration" / "analysis_workload.py"


@dataclass(frozen=True)
class AnalysisCaptures:
    compute: Path
    compute_again: Path
    heavy: Path
    sleepy: Path
    memory_base: Path
    memory_extra: Path
    demo: Path  # the README demo's loop shape, in the first process
    demo_slow: Path  # ... with its input slowed, in the second
    recompiling: Path  # a step whose input shape changes every step


def _run(out: Path, variants: list[str]) -> dict[str, Path]:
    proc = Proc.python(
        [str(WORKLOAD), str(out), *variants],
        out.with_suffix(".log"),
        env={"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_until(lambda: not proc.alive(), timeout=280, interval=0.5, what=f"{variants}")
        output = proc.output()
    finally:
        code = proc.stop()
    if code != 0:
        pytest.fail(f"analysis workload failed ({code}):\n{output[-3000:]}")
    return {
        line.split()[1]: Path(line.split()[2])
        for line in output.splitlines()
        if line.startswith("DONE ")
    }


@pytest.fixture(scope="session")
def analysis_captures(tmp_path_factory: pytest.TempPathFactory) -> AnalysisCaptures:
    base = tmp_path_factory.mktemp("analysis-captures")
    first = _run(base / "a", ["compute", "heavy", "sleepy", "memory_base", "memory_extra", "demo"])
    second = _run(base / "b", ["compute", "demo_slow", "recompiling"])
    return AnalysisCaptures(
        first["compute"],
        second["compute"],
        first["heavy"],
        first["sleepy"],
        first["memory_base"],
        first["memory_extra"],
        first["demo"],
        second["demo_slow"],
        second["recompiling"],
    )
