"""The communication-bound verdict on real 4-device JAX CPU captures with known shares.

``bench/communication_workload.py`` runs a step on 4 forced CPU devices whose
all-reduces (``lax.psum``, named ``psum.N`` on the host threads) take a set share of
the step, calibrated in the capture's own process. ``bench/communication.py`` measured
the product against that calibration; the tolerances here come from it (see
``docs/analysis.md``, "Communication-bound (measured)").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter.analysis.report.document import analyze
from exporter.analysis.report.rules import COMMUNICATION_P2_PCT
from tests.harness import ROOT

WORKLOAD = ROOT / "bench" / "communication_workload.py"
STEPS = 20  # ~0.3-0.6 s of capture on a quiet 2-core machine
# Measured minus calibrated share at a nominal 60 %, in bench/communication.py's run on
# this 2-core machine at load average ~9: -39, -24, -10, -9 points (the calibration is
# itself noisy, 42-88 % for the same nominal share). 45 holds those; the rule must
# still fire, which a product that sees no collectives (0 %) never does.
TOLERANCE_PCT = 45.0


def _capture(out: Path, share: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out), str(share), str(STEPS)],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
        timeout=280,
        check=False,
    )
    if done.returncode:
        pytest.fail(f"communication workload failed ({done.returncode}):\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("DONE "))
    _, path, step_ms, comm_ms, *_ = line.split()
    return {"path": path, "reference_pct": 100 * float(comm_ms) / float(step_ms)}


NOMINAL_PCT = 60.0


def test_collectives_that_take_most_of_the_step_are_found_and_named(tmp_path: Path) -> None:
    found = _capture(tmp_path / "heavy", NOMINAL_PCT)
    report = analyze(found["path"], xprof=False)
    breakdown = report.facts.breakdown
    assert breakdown is not None
    share = breakdown["communication_pct"]
    # The workload's own calibration times the collectives apart from the step, so a busy
    # machine can make it no share at all: stressed CI runs calibrated 275 % (the product
    # read 64 % at a nominal 60) and 9.4 % (the product read 58 %). A calibration that is
    # no share, or farther from the nominal share than the tolerance, leaves the nominal
    # share as the reference.
    calibrated = found["reference_pct"]
    plausible = 0 < calibrated <= 100 and abs(calibrated - NOMINAL_PCT) <= TOLERANCE_PCT
    reference = calibrated if plausible else NOMINAL_PCT
    assert abs(share - reference) <= TOLERANCE_PCT, (share, found)
    finding = next(f for f in report.findings if f.rule == "CommunicationBoundRule")
    assert finding.evidence["communication_pct"] >= COMMUNICATION_P2_PCT
    # lax.psum is an all-reduce, named by its HLO opcode, not by "psum".
    assert "all-reduce" in breakdown["communication_by_kind_ms"]
    assert "all-reduce" in finding.detail
