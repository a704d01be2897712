"""Comparison and analysis of real JAX CPU captures (made once per test session), checked
against what the workloads did, against XProf's own converters, through the CLI, and in
headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.analysis.compare import noise
from exporter.analysis.compare.comparison import compare_sides
from exporter.analysis.report import rules
from exporter.analysis.report.document import analyze
from exporter.analysis.report.render import comparison_html, report_html
from exporter.analysis.sides.load import load_side
from tests.analysis_captures import AnalysisCaptures
from tests.harness import ROOT

pytestmark = pytest.mark.integration

# analysis_workload.DEMO_DELAY_S (not imported: that module imports JAX): the demo_slow
# capture's input sleep per step.
DEMO_DELAY_MS = 20.0


def mlprof(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def reports(analysis_captures: AnalysisCaptures) -> dict[str, object]:
    """The analysis of each capture (XProf's converters included, once)."""
    return {
        "sleepy": analyze(str(analysis_captures.sleepy)),
        "compute": analyze(str(analysis_captures.compute), xprof=False),
    }


def test_heavy_function_is_the_top_regression_and_trips_the_gate(
    analysis_captures: AnalysisCaptures, tmp_path: Path
) -> None:
    out = tmp_path / "diff.json"
    done = mlprof(
        "compare",
        str(analysis_captures.compute),
        str(analysis_captures.heavy),
        "--format",
        "json",
        "-o",
        str(out),
        "--fail-on-regression",
        "2",
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mlprof: regression gate 2 %: ") and "jit_heavy_extra" in last, last
    data = json.loads(out.read_text())
    assert (data["kind"], data["view"], data["normalisation"]) == ("device", "step", "per_step")
    top = [e for e in data["regressions"] if e["regression"]][:3]
    # The step view holds the XLA ops grouped by program: the new program is named, as
    # new work, whether its verdict is on an op's self time or the program's total.
    assert top and all(e["frame"].split(";")[0] == "jit_heavy_extra" for e in top), top
    assert data["regressions"][0] == top[0]  # the most important change is a regression
    assert all(e["significant"] and e["new"] for e in top)
    assert top[0]["base_ms"] == 0 and top[0]["step_pct"] > 2
    # The gate agrees with the verdicts: it names the first one above its limit.
    assert top[0]["frame"] in last


def test_same_workload_twice_has_no_verdict(analysis_captures: AnalysisCaptures) -> None:
    for kind in (None, "device", "host"):
        a = load_side(str(analysis_captures.compute), kind)  # type: ignore[arg-type]
        b = load_side(str(analysis_captures.compute_again), kind)  # type: ignore[arg-type]
        result = compare_sides(a, b)
        assert result.normalisation == "per_step" and result.verdict_possible
        loud = [(e.frame.name, e.step_pct, e.q_value) for e in result.regressions if e.regression]
        assert loud == [], f"{kind}: {loud}"
        assert result.gate_reasons(3) == [] or result.step_verdict.verdict == "slower"
    # On CPU every view takes the host's measured noise (analysis.noise).
    assert result.noise_view in {"xla_host", "host"}
    assert noise.MIN_GROWN_STEP_PCT["xla_host"] == noise.MIN_GROWN_STEP_PCT["host"]


def test_slow_data_loading_needs_attention_quoting_the_share(reports: dict[str, object]) -> None:
    report = reports["sleepy"]
    assert report.status == "NEEDS_ATTENTION"  # type: ignore[attr-defined]
    finding = next(f for f in report.findings if f.rule == "InputWaitRule")  # type: ignore[attr-defined]
    assert finding.priority in ("P0", "P1")
    share = finding.evidence["input_pct"]
    # data_loading sleeps twice the compute time: about two thirds of every step.
    assert 40 <= share <= 90, finding.evidence
    assert f"{share:.1f}%" in finding.title
    assert finding.evidence["data_phase_pct"] >= 0.9 * share
    assert "prefetch" in finding.suggestion


def test_compute_bound_workload_has_no_input_finding(reports: dict[str, object]) -> None:
    report = reports["compute"]
    assert not [f for f in report.findings if f.rule == "InputWaitRule"]  # type: ignore[attr-defined]
    breakdown = report.facts.breakdown  # type: ignore[attr-defined]
    assert breakdown["data_phase_pct"] + breakdown["between_steps_pct"] < rules.INPUT_WAIT_P2_PCT


def test_step_times_agree_with_xprof(reports: dict[str, object]) -> None:
    """Our step windows against XProf's input_pipeline_analyzer on the same file."""
    report = reports["sleepy"]
    xprof = report.facts.xprof  # type: ignore[attr-defined]
    assert xprof["available"], xprof
    ipa = xprof["tools"]["input_pipeline_analyzer"]["summary"]
    assert ipa["hardware_type"] == "CPU_ONLY"
    from exporter.profiles.steps import step_windows
    from exporter.profiles.xplane import load_capture

    with load_capture(Path(report.facts.files[0])) as capture:  # type: ignore[attr-defined]
        windows, source = step_windows(capture)
    assert source == "host_step_annotations"
    ours = {w.step: (w.end_ns - w.start_ns) / 1e6 for w in windows}
    theirs = {int(k.split()[-1]): v for k, v in ipa["step_times_ms"].items()}
    assert len(theirs) >= len(ours) - 2  # XProf leaves out the first and last step
    for step, ms in theirs.items():
        assert ours[step] == pytest.approx(ms, abs=0.01), step


def test_extra_buffer_is_the_top_memory_regression(
    analysis_captures: AnalysisCaptures, tmp_path: Path
) -> None:
    done = mlprof(
        "compare",
        str(analysis_captures.memory_base),
        str(analysis_captures.memory_extra),
        "--kind",
        "memory",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["kind"], data["normalisation"]) == ("memory", "share")
    top = data["regressions"][0]
    assert top["significant"] and top["regression"]
    # The stack ends inside JAX (jnp.ones ... __call__); the site is the workload's frame.
    assert ";allocate_extra_buffer;" in top["frame"]
    assert (
        top["site"].startswith("allocate_extra_buffer (") and "analysis_workload.py" in top["site"]
    )
    assert top["self_head"] - top["self_base"] == 64 * 1024 * 1024
    # Buffers the extra one only out-shared are no improvement.
    assert not [e for e in data["improvements"] if e["regression"]]


def test_cli_text_and_errors(analysis_captures: AnalysisCaptures, tmp_path: Path) -> None:
    text = mlprof(
        "compare", str(analysis_captures.compute), str(analysis_captures.heavy), "--top", "3"
    )
    assert text.returncode == 0, text.stderr
    assert "REGRESSION" in text.stdout and "jit_heavy_extra" in text.stdout
    missing = mlprof("compare", str(tmp_path / "nope.xplane.pb"), str(analysis_captures.heavy))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    wrong = mlprof("compare", str(analysis_captures.memory_base), str(analysis_captures.heavy))
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    usage = mlprof("compare", str(analysis_captures.compute))
    assert usage.returncode == 2
    report = mlprof("analyze", str(analysis_captures.sleepy), "--no-xprof", "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["status"] == "NEEDS_ATTENTION"


def _browser() -> str:
    path = shutil.which("chromium")
    assert path, "Debian 'chromium' is required (apt-get install chromium)"
    return path


def test_pages_in_headless_chromium(
    analysis_captures: AnalysisCaptures, reports: dict[str, object], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    base = load_side(str(analysis_captures.compute))
    head = load_side(str(analysis_captures.heavy))
    diff_page = tmp_path / "diff.html"
    diff_page.write_text(comparison_html(compare_sides(base, head)))
    report = analyze(
        str(analysis_captures.sleepy), baseline=str(analysis_captures.compute), xprof=False
    )
    report_page = tmp_path / "summary.html"
    report_page.write_text(report_html(report))
    for page_file in (diff_page, report_page):
        text = page_file.read_text()
        assert "<script src" not in text and "<link" not in text  # self-contained
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_browser(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(diff_page.as_uri())
            page.wait_for_function("document.body.dataset.ready === '1'")
            grown = page.locator(".frame.regression").first
            assert "jit_heavy_extra" in grown.get_attribute("data-path")  # type: ignore[operator]
            grown.hover()
            tip = page.inner_text("#tip")
            assert "base self: 0 ns" in tip and "head self:" in tip
            assert "significant" in tip and "q=" in tip
            colour = grown.evaluate("el => getComputedStyle(el).backgroundColor")
            red, green, _ = (int(c) for c in colour[colour.index("(") + 1 : -1].split(",")[:3])
            assert red > green  # grew: red
            page.fill("#search", "heavy")
            page.wait_for_function("document.querySelectorAll('.frame.match').length > 0")
            assert all("heavy" in t for t in page.locator(".frame.match").all_inner_texts())

            page.goto(report_page.as_uri())
            page.wait_for_function("document.body.dataset.ready === '1'")
            assert page.inner_text("#banner").startswith("NEEDS_ATTENTION")
            priorities = page.locator(".finding").evaluate_all(
                "els => els.map(e => e.dataset.priority)"
            )
            assert priorities[0] in ("P0", "P1") and len(priorities) == len(report.findings)
            assert "Steps wait for input" in page.inner_text("#findings")
            frames = page.locator("iframe").evaluate_all("els => els.map(e => e.dataset.name)")
            assert "diff-host" in frames and any(f.startswith("flamegraph-") for f in frames)
            page.screenshot(path=str(tmp_path / "report.png"))
        finally:
            browser.close()


def test_cpu_device_view_splits_time_across_windows_exactly(
    analysis_captures: AnalysisCaptures,
) -> None:
    """XLA ops of the client threads per window, against a brute-force overlap sweep."""
    import numpy as np

    from exporter.analysis.sides import xla_host
    from exporter.analysis.sides.load import step_cycles
    from exporter.profiles.steps import step_windows
    from exporter.profiles.xplane import load_capture

    with load_capture(analysis_captures.heavy) as capture:
        events = xla_host.xla_host_events(capture)
        cycles = step_cycles(step_windows(capture)[0])
    assert len(events) and {p[0] for p in events.paths} >= {"jit_update", "jit_heavy_extra"}
    # Shifted windows: events straddle their edges.
    spans = [(w.start_ns + 777, w.end_ns + 777) for w in cycles]
    for (lo, hi), graph in zip(spans, xla_host.graphs(events, spans), strict=True):
        part = np.clip(np.minimum(events.end, hi) - np.maximum(events.start, lo), 0, None)
        expected: dict[tuple[str, ...], float] = {}
        for i, ns in enumerate(part.tolist()):
            expected[events.paths[events.path_index[i]]] = (
                expected.get(events.paths[events.path_index[i]], 0) + ns
            )
            if events.parent[i] >= 0:
                outer = events.paths[events.path_index[events.parent[i]]]
                expected[outer] = expected.get(outer, 0) - ns
        got = {tuple(f.name for f in (*a, n)): n.self_value for a, n in graph.paths()}
        assert {k: v for k, v in got.items() if v} == {
            k: round(v) for k, v in expected.items() if round(v) > 0
        }
    [whole] = xla_host.graphs(events, None)
    assert whole.root.total == int((events.end - events.start)[events.parent < 0].sum())


def test_the_demos_input_slowdown_is_the_first_regression_and_trips_the_gate(
    analysis_captures: AnalysisCaptures, tmp_path: Path
) -> None:
    """The README's `echo ... > demo-input-delay`, compared as a new user would: no --kind."""
    demo, demo_slow = analysis_captures.demo, analysis_captures.demo_slow
    out = tmp_path / "demo.json"
    done = mlprof(
        "compare",
        str(demo),
        str(demo_slow),
        "--format",
        "json",
        "-o",
        str(out),
        "--fail-on-regression",
        "5",
    )
    assert done.returncode == 1, done.stderr
    assert "input_pipeline" in done.stderr.strip().splitlines()[-1], done.stderr
    data = json.loads(out.read_text())
    assert data["view"] == "step"
    first = data["regressions"][0]
    assert first["name"] == "input_pipeline" and first["regression"], first
    assert first["frame"].startswith("host;"), first
    # Its excess is the workload's sleep, in ms per step: a sleep is never shorter, and
    # 15 of the 16 fall in the 16 cycles (the first comes before the first step): 18.8 ms.
    assert first["excess_ms"] >= 0.8 * DEMO_DELAY_MS, first
    # The step times are what each process's own clock measured, not a fixed change: the
    # two captures are two processes, and on a busy machine the unchanged one can run
    # slower than the slowed one (57.2 ms against 36.1 ms a cycle at load ~7), or the
    # slowed one slow enough that the sleep was 47.7 % of the change.
    step = data["step_verdict"]
    clocks = [float((p.parents[3] / "cycle_ms").read_text()) for p in (demo, demo_slow)]
    assert [step["base_median_ms"], step["head_median_ms"]] == pytest.approx(clocks, rel=0.02)
    # "Explains" is the excess as a share of that change, and is said only of a change
    # beyond noise (a share of a noise-sized change is no explanation). A step that got
    # faster beyond noise gives a negative share.
    if step["verdict"] in ("slower", "faster"):
        change_ms = step["head_median_ms"] - step["base_median_ms"]
        explains = 100 * first["excess_ms"] / change_ms
        assert first["explains_pct"] == pytest.approx(explains, rel=0.02), (first, step)
    else:
        assert first["explains_pct"] is None, first


def test_a_recompiling_capture_leads_with_recompilation(
    analysis_captures: AnalysisCaptures,
) -> None:
    report = analyze(str(analysis_captures.recompiling), xprof=False)
    lead = report.findings[0]
    assert lead.rule == "RecompilationRule" and lead.priority == "P0", report.findings
    # Compiling is not loading data: backend_compile_and_load is no data phase.
    assert not [f for f in report.findings if f.rule == "InputWaitRule"], report.findings
    assert report.facts.breakdown["compile_pct"] > 25  # type: ignore[index]
    assert not any("compile" in n for n in report.facts.data_phase_names)
    # The top op is an op, never the executor waiting for its thunks.
    assert not report.facts.top_ops[0]["name"].startswith("ThunkExecutor")
