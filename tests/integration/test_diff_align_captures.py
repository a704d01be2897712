"""``diff.align`` and the one-pass step view held to their references on real JAX CPU
captures (the unit tests hold them on random graphs and a TPU-shaped capture)."""

from __future__ import annotations

import pytest

from exporter.analysis.compare.diff import align, align_reference
from exporter.analysis.sides.load import join_step_view, load_side
from tests.analysis_captures import AnalysisCaptures
from tests.unit.test_diff_align import assert_same, copy_and_merge, graph_shape

pytestmark = pytest.mark.integration


def test_real_captures_align_as_the_reference(analysis_captures: AnalysisCaptures) -> None:
    pairs = [
        (analysis_captures.compute, analysis_captures.heavy),
        (analysis_captures.demo, analysis_captures.demo_slow),
    ]
    for base_path, head_path in pairs:
        for kind in (None, "device", "host"):
            base, head = load_side(str(base_path), kind), load_side(str(head_path), kind)
            if base.steps and head.steps:
                assert_same(align(base.steps, head.steps), align_reference(base.steps, head.steps))
            assert_same(
                align([base.whole], [head.whole]), align_reference([base.whole], [head.whole])
            )


def test_real_step_views_are_the_copy_and_merge(analysis_captures: AnalysisCaptures) -> None:
    for path in (analysis_captures.compute, analysis_captures.demo_slow):
        device, host = load_side(str(path), "device"), load_side(str(path), "host")
        joined = join_step_view(device, host)
        assert joined.scope == "step" and joined.steps
        graphs = zip([device.whole, *device.steps], [host.whole, *host.steps], strict=True)
        expected = [copy_and_merge(d, h) for d, h in graphs]
        got = [joined.whole, *joined.steps]
        assert [graph_shape(g) for g in got] == [graph_shape(e) for e in expected]
