"""docs/metrics.md documents every catalogue metric beside its dcgm-exporter / libtpu name."""

from __future__ import annotations

import re

import pytest

from exporter.metrics.catalog import METRICS, prometheus_name
from tests.harness import ROOT

DOC = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
# The lines switched on in dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter,
# read for this issue): each must say where it went, or why it did not.
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)  # fmt: skip


def rows() -> dict[str, list[str]]:
    """Prometheus name -> the cells of its row in a metric table."""
    out = {}
    for line in DOC.splitlines():
        match = re.match(r"^\| `([a-z_]+)` \|", line)
        if match:
            out[match.group(1)] = [c.strip() for c in line.strip("|").split("|")]
    return out


@pytest.mark.parametrize("name", list(METRICS))
def test_every_metric_has_a_row_with_its_unit_and_origin(name: str) -> None:
    spec = METRICS[name]
    row = rows().get(prometheus_name(spec))
    assert row is not None, f"docs/metrics.md has no row for {prometheus_name(spec)}"
    _, kind, unit, labels, dcgm, libtpu, _ = row
    assert (kind, unit) == (spec.kind, f"`{spec.unit}`")
    assert [a.strip() for a in labels.split(",") if a.strip()] == list(spec.attributes)
    assert dcgm == (spec.dcgm or "—")
    assert libtpu == (spec.libtpu or "—")


def test_no_row_for_a_metric_that_does_not_exist() -> None:
    known = {prometheus_name(s) for s in METRICS.values()}
    assert set(rows()) <= known


def test_every_default_dcgm_counter_is_accounted_for() -> None:
    section = DOC.split("## dcgm-exporter's default counters", 1)[1].split("\n## ", 1)[0]
    missing = [f for f in DCGM_DEFAULT_COUNTERS if f not in section]
    assert not missing, missing


def test_readme_links_the_metric_reference() -> None:
    assert "(docs/metrics.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
