"""Top ops' HLO neighbourhood against XProf's own answer on the same file: ``xprof
get_hlo_neighborhood --radius=1 --direction=operands|users`` on a copy of a real JAX CPU
capture (XProf writes caches beside its input), for each top op and data-formatting op."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts import CaptureFacts, gather_facts
from exporter.analysis.rules import _between
from tests.harness import ROOT

pytestmark = pytest.mark.integration

XPROF = Path(sys.executable).parent / "xprof"
WORKLOAD = ROOT / "tests" / "integration" / "analysis_workload.py"
# "  [dist=1] [main.1] ROOT name = f32[512,512]{1,0} fusion(a, b), kind=kLoop, ..."
LINE = re.compile(
    r"^\s*\[dist=(?P<dist>\d+)\] \[[^\]]*\] (?:ROOT )?(?P<name>\S+) = "
    r"(?P<shape>\(.*?\)|\S+) (?P<opcode>[\w-]+)\("
)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CaptureFacts]:
    if not XPROF.exists():
        pytest.skip("XProf's CLI is not installed")
    out = tmp_path_factory.mktemp("neighbourhood")
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out), "compute"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    path = Path(next(ln.split()[2] for ln in done.stdout.splitlines() if ln.startswith("DONE ")))
    return path, gather_facts([path], xprof=False)


def xprof_neighbours(
    path: Path, where: Path, module: str, op: str, direction: str
) -> list[tuple[str, str, str]]:
    """(name, opcode, shape) of XProf's radius-1 neighbours of ``op`` in ``module``."""
    folder = where / f"cli-{op}-{direction}"
    folder.mkdir(parents=True)
    copy = folder / path.name
    shutil.copyfile(path, copy)
    done = subprocess.run(
        [str(XPROF), "get_hlo_neighborhood", f"--session_id={copy}", f"--module_name={module}",
         f"--instruction_name={op}", "--radius=1", f"--direction={direction}"],
        capture_output=True, text=True, timeout=60, cwd=folder, check=False,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "GLOG_minloglevel": "3"},
    )  # fmt: skip
    assert "Neighborhood of" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
    found = [m for m in map(LINE.match, done.stdout.splitlines()) if m]
    centre = next(m for m in found if m["dist"] == "0")
    assert centre["name"] == op
    return [(m["name"], m["opcode"], m["shape"]) for m in found if m["dist"] == "1"]


def _ours(entries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(e["name"], e["opcode"], e["shape"]) for e in entries]


def test_neighbourhoods_agree_with_xprof_get_hlo_neighborhood(
    capture: tuple[Path, CaptureFacts], tmp_path: Path
) -> None:
    path, facts = capture
    assert facts.compiler is not None
    checked = [*facts.top_ops[:5], *facts.compiler["ops"][:1]]
    for op in checked:
        near = op["neighbourhood"]
        assert near is not None, (op, facts.unavailable)
        for direction, key in (("operands", "producers"), ("users", "consumers")):
            theirs = xprof_neighbours(path, tmp_path, near["module"], op["name"], direction)
            assert near[f"{key}_total"] == len(theirs), (op["name"], direction, theirs)
            # XProf orders neighbours its own way (by name); ours keep operand order.
            assert sorted(_ours(near[key])) == sorted(theirs), (op["name"], direction)
    # The workload's matmul (x.T @ tanh(...)): a dot between the parameter and a tanh
    # fusion, whose own time is in the capture; the parameter ran as no op.
    dot = next(o for o in facts.top_ops if o["neighbourhood"]["opcode"] == "dot")
    near = dot["neighbourhood"]
    assert near["module"].startswith("jit_update(") and near["shape"] == "f32[512,512]{1,0}"
    timed = {e["name"]: e["share_pct"] for e in near["producers"] + near["consumers"]}
    tops = {o["name"]: o["share_pct"] for o in facts.top_ops}
    for name, share in timed.items():
        assert share is None or share > 0
        if name in tops:
            assert share == tops[name]
    assert any(e["opcode"] == "parameter" and e["share_pct"] is None for e in near["producers"])
    copy = facts.compiler["ops"][0]
    assert " between " in _between(copy) and copy["name"] in _between(copy)
    assert "neighbourhood" not in facts.unavailable
