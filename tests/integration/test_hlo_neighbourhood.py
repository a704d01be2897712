"""Top ops' HLO neighbourhood against XProf's own answer on the same file: ``xprof
get_hlo_neighborhood --radius=1 --direction=operands|users`` on a copy of a real JAX CPU
capture (XProf writes caches beside its input), for each top op and data-formatting op;
the capture's step has a layout copy between two matmuls, which the data-formatting
finding places between them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.facts.capture import CaptureFacts, gather_facts
from exporter.analysis.report.rules import CompilerInefficiencyRule
from tests.harness import ROOT
from tests.xprof_cli import XPROF, require_xprof

pytestmark = pytest.mark.integration

WORKLOAD = ROOT / "tests" / "integration" / "formatting_workload.py"
# "  [dist=1] [main.1] ROOT name = f32[512,512]{1,0} fusion(a, b), kind=kLoop, ..."
LINE = re.compile(
    r"^\s*\[dist=(?P<dist>\d+)\] \[[^\]]*\] (?:ROOT )?(?P<name>\S+) = "
    r"(?P<shape>\(.*?\)|\S+) (?P<opcode>[\w-]+)\("
)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CaptureFacts]:
    require_xprof()
    out = tmp_path_factory.mktemp("neighbourhood")
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out)],
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
    checked = {o["name"]: o for o in [*facts.top_ops[:5], *facts.compiler["ops"][:1]]}
    for name, op in checked.items():
        near = op["neighbourhood"]
        assert near is not None, (op, facts.unavailable)
        for direction, key in (("operands", "producers"), ("users", "consumers")):
            theirs = xprof_neighbours(path, tmp_path, near["module"], name, direction)
            assert near[f"{key}_total"] == len(theirs), (name, direction, theirs)
            # XProf orders neighbours its own way (by name); ours keep operand order.
            assert sorted(_ours(near[key])) == sorted(theirs), (name, direction)
            for entry in near[key]:  # a neighbour's time is its own, as a top op's
                if entry["name"] in checked:
                    assert entry["self_ms"] == checked[entry["name"]]["self_ms"]
                elif entry["opcode"] == "parameter":
                    assert entry["share_pct"] is None
    assert "neighbourhood" not in facts.unavailable


def test_the_formatting_finding_places_the_layout_copy(capture: tuple[Path, CaptureFacts]) -> None:
    _, facts = capture
    assert facts.compiler is not None
    copy = facts.compiler["ops"][0]
    near = copy["neighbourhood"]
    assert near["module"].startswith("jit_layout(") and near["shape"] == "f32[512,512]{1,0}"
    # Between the fusion of the first matmul (a @ b, sin) and that of the second (t @ b).
    (producer,) = near["producers"]
    (consumer,) = near["consumers"]
    assert producer["opcode"] == consumer["opcode"] == "fusion"
    assert producer["share_pct"] > 0 and consumer["share_pct"] > 0
    found = CompilerInefficiencyRule().apply(facts)
    assert found is not None, facts.compiler  # the copy is about half of the XLA time
    assert (
        f"{copy['name']} f32[512,512]{{1,0}} between {producer['name']} (producer) and "
        f"{consumer['name']} (consumer)" in found.detail
    )
    placed = found.to_json()["formatting_ops"][0]
    assert placed["producers"][0]["name"] == producer["name"]
    assert placed["consumers"][0]["name"] == consumer["name"]
