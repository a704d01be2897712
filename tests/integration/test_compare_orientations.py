"""Both orientations of a comparison of real JAX CPU captures are judged alike: swapping
base and head mirrors the step verdict and turns each regression into the improvement
of the same frame (issue 29: a pair read one way was "SLOWER", the other way "unchanged").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.analysis.compare.comparison import Comparison, compare_sides
from exporter.analysis.sides.load import load_side
from tests.analysis_captures import AnalysisCaptures

pytestmark = pytest.mark.integration

MIRROR = {"slower": "faster", "faster": "slower", "unchanged": "unchanged", "unknown": "unknown"}


def _named(entries: list, basis: str | None = None) -> list[str]:  # type: ignore[type-arg]
    return [e.to_json()["frame"] for e in entries if e.regression]


def _both(a: Path, b: Path) -> tuple[Comparison, Comparison]:
    one, other = load_side(str(a)), load_side(str(b))
    return compare_sides(one, other), compare_sides(other, one)


def test_swapping_real_captures_mirrors_the_verdicts(analysis_captures: AnalysisCaptures) -> None:
    pairs = [
        (analysis_captures.compute, analysis_captures.compute_again),  # the same workload
        (analysis_captures.compute, analysis_captures.heavy),  # new work
        (analysis_captures.demo, analysis_captures.demo_slow),  # a slower input phase
    ]
    for a, b in pairs:
        forward, backward = _both(a, b)
        fv, bv = forward.step_verdict, backward.step_verdict
        assert bv.verdict == MIRROR[fv.verdict], (a.name, b.name, fv.sentence(), bv.sentence())
        assert fv.change_pct is not None and bv.change_pct is not None
        # The same ratio read backwards: (1 + x)(1 + y) = 1.
        assert (1 + fv.change_pct / 100) * (1 + bv.change_pct / 100) == pytest.approx(1, rel=1e-6)
        # What grew one way shrank the other: the first verdict of each is the same frame.
        grew, shrank = _named(forward.regressions), _named(backward.improvements)
        assert bool(grew) == bool(shrank), (grew, shrank)
        if grew:
            assert grew[0] == shrank[0]
    # The same workload twice has no verdict either way.
    same, same_back = _both(analysis_captures.compute, analysis_captures.compute_again)
    for result in (same, same_back):
        assert not _named(result.regressions) and not _named(result.improvements)
        assert result.to_json()["min_detectable"]["between_run_noise"] == "not measured"
