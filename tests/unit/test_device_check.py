"""The device check's value checks, run on the NVML golden exposition (no GPU here).

scripts/device-check.sh runs them on hardware; here they must pass on what the NVML
source emits for the double's boards, so a renamed metric or label cannot make the
hardware check fail (or pass) for the wrong reason.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.device_check import REQUIRED, Report, Series, check_values, finish
from tests.harness import ROOT

GOLDEN = ROOT / "tests" / "fixtures" / "nvml_3gpus.prom"


def golden() -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(GOLDEN.read_text(encoding="utf-8")):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_values_of_the_nvml_source_pass_the_device_check() -> None:
    report = Report()
    check_values(report, golden(), {"pid": 4242, "run_id": "golden-run"})
    assert report.failed == []
    passed = {name for status, name, _ in report.results if status == "PASS"}
    assert {f"present: {name}" for name in REQUIRED} <= passed
    assert "its memory carries the run_id" in passed
    assert finish(report) == 0


def test_a_value_out_of_range_fails_the_check() -> None:
    series = golden()
    hot = {k: (99.0 + 50 if k[0] == "accelerator_temperature_celsius" else v)
           for k, v in series.items()}  # fmt: skip
    report = Report()
    check_values(report, hot, {"pid": 4242, "run_id": "golden-run"})
    assert "GPU temperature in range" in report.failed
    assert finish(report) == 1
