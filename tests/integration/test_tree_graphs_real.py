"""The frame-by-frame graph builder and the host steps read from columns against their
references on real JAX CPU captures.

The unit tests (tests/unit/test_tree_graphs.py) cover synthetic shapes; here each real
capture's whole graph and per-step graphs, as a comparison reads them, are built both
ways and must be identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.analysis.sides.load import capture_side
from exporter.profiles import xplane
from exporter.profiles.xplane import host_flamegraph, load_capture
from tests.analysis_captures import AnalysisCaptures
from tests.unit.test_tree_graphs import Both


@pytest.mark.parametrize("variant", ["compute", "demo", "recompiling", "sleepy"])
def test_real_captures_build_the_same_graphs_both_ways(
    analysis_captures: AnalysisCaptures, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = Both()
    monkeypatch.setattr(xplane, "graphs_by_frame", both)
    path: Path = getattr(analysis_captures, variant)
    with load_capture(path) as capture:
        assert host_flamegraph(capture) is not None
        kind, _, steps, _, source, _ = capture_side(capture, "host", {})
    assert (kind, source) == ("host", "host_step_annotations") and len(steps) >= 8
    assert both.calls == 2 and both.frames > 100


@pytest.mark.parametrize("variant", ["compute", "demo"])
def test_real_captures_host_steps_from_columns_are_the_event_by_event_reading(
    analysis_captures: AnalysisCaptures, variant: str
) -> None:
    from exporter.profiles.steps import step_windows
    from exporter.profiles.xspace import use_decoder

    found = {}
    for decoder in ("compiled", "python"):
        with use_decoder(decoder), load_capture(getattr(analysis_captures, variant)) as capture:
            names: set[str] = set()
            found[decoder] = (step_windows(capture, names), names)
    assert found["compiled"] == found["python"]
    (windows, source), names = found["compiled"]
    assert source == "host_step_annotations" and len(windows) >= 8 and "train" in names
