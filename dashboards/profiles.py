"""The Profiles dashboard: where the time and memory of a run go, beside a baseline run.

One row per profile the sidecar (or the workload's pyroscope-io agent) pushes to
Pyroscope: the selected run on the left, ``$baseline_run_id`` on the right. The
baseline panel links to Pyroscope's own diff view of the two selections and to the
sidecar's differential report (``GET /api/v1/compare``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from grafana_foundation_sdk.builders import dashboard, grafanapyroscope
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as models

from dashboards.common import (
    PROFILES_UID,
    PYROSCOPE,
    RowSpec,
    datasource_variables,
    mlprof_dashboard,
    query_variable,
    run_variables,
    sidecar_url_variable,
    url_link,
    with_rows,
)
from dashboards.plugins import FlameGraphPanel

__all__ = ["PROFILES", "ProfileKind", "profiles_dashboard"]

DEFAULT_PYROSCOPE_URL = "http://localhost:4040"


@dataclass(frozen=True)
class ProfileKind:
    """One profile type as Pyroscope names it, and how to compare two runs of it.

    ``type_id`` is ``<__name__>:<sample type>:<unit>:<period type>:<unit>`` of the pushed
    pprof; ``compare_kind`` is the ``kind`` of ``mlprof compare`` (None: not one of ours).
    """

    title: str
    type_id: str
    description: str
    compare_kind: str | None


# What the sidecar pushes (exporter/profiles: xplane.py device_flamegraph and
# host_flamegraph, memory.py memory_flamegraph) and what pyroscope-io sends from inside
# the workload (host CPU, labelled with the run's identity and the step phase).
PROFILES = (
    ProfileKind(
        "Device time",
        "device:device_time:nanoseconds:device_time:nanoseconds",
        "XLA ops on the accelerators (self and total), from XProf captures: program > "
        "name scope > op category > op.",
        "device",
    ),
    ProfileKind(
        "Host time",
        "wall:wall:nanoseconds:wall:nanoseconds",
        "Host threads and Python in the same XProf captures, stacked by time containment.",
        "host",
    ),
    ProfileKind(
        "Host CPU",
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "Continuous CPU samples of the workload process (pyroscope-io), tagged by step "
        "phase: where the host spends CPU between and during steps.",
        None,
    ),
    ProfileKind(
        "Device memory",
        "memory:inuse_space:bytes:space:bytes",
        "Bytes in use on the devices by allocation site, from JAX device-memory profiles.",
        "memory",
    ),
)
RUN_SELECTOR = '{service_name=~"$workload", run_id="$run_id", host=~"$host"}'
# The baseline run's hosts are other hosts: select the run only.
BASELINE_SELECTOR = '{service_name=~"$workload", run_id="$baseline_run_id"}'


def _flame(title: str, description: str, type_id: str, selector: str) -> FlameGraphPanel:
    query = (
        grafanapyroscope.Dataquery()
        .ref_id("A")
        .datasource(PYROSCOPE)
        .query_type("profile")
        .profile_type_id(type_id)
        .label_selector(selector)
        .group_by([])
    )
    panel = FlameGraphPanel().title(title).description(description).datasource(PYROSCOPE)
    return panel.with_target(query).span(12).height(12)


def _pyroscope_diff(kind: ProfileKind) -> str:
    """Pyroscope's comparison-diff view: the baseline run left, the selected run right."""

    def query(variable: str) -> str:
        # Static text percent-encoded here; the run id by Grafana (single-valued).
        return quote(f'{kind.type_id}{{run_id="') + f"${{{variable}:percentencode}}" + quote('"}')

    window = "${__from:date:seconds}", "${__to:date:seconds}"
    return (
        "${pyroscope_url}/comparison-diff?"
        f"leftQuery={query('baseline_run_id')}&rightQuery={query('run_id')}"
        f"&from={window[0]}&until={window[1]}"
        f"&leftFrom={window[0]}&leftUntil={window[1]}"
        f"&rightFrom={window[0]}&rightUntil={window[1]}"
    )


def _row(kind: ProfileKind) -> RowSpec:
    run = _flame(f"{kind.title}: $run_id", kind.description, kind.type_id, RUN_SELECTOR)
    baseline = _flame(
        f"{kind.title}: baseline $baseline_run_id",
        f"The same for the baseline run. {kind.description}",
        kind.type_id,
        BASELINE_SELECTOR,
    )
    links: list[cogbuilder.Builder[models.DashboardLink]] = [
        url_link("Pyroscope diff view: baseline vs run", _pyroscope_diff(kind))
    ]
    if kind.compare_kind is not None:
        links.append(
            url_link(
                "Differential report (mlprof compare)",
                "${sidecar_url}/api/v1/compare?base=run:${baseline_run_id:percentencode}"
                f"&head=run:${{run_id:percentencode}}&kind={kind.compare_kind}",
                "The sidecar's comparison of the two runs, with significance across steps",
            )
        )
    return kind.title, [run, baseline.links(links)]


def profiles_dashboard() -> dashboard.Dashboard:
    """The Profiles dashboard."""
    board = mlprof_dashboard(
        PROFILES_UID,
        "mlprof profiles",
        "Flame graphs (self and total) of a run's device time, host time, host CPU and "
        "device memory, beside a baseline run, with links to diff views.",
    )
    variables = [
        *datasource_variables(),
        *run_variables(multi_run=False),
        query_variable(
            "baseline_run_id",
            "Baseline run",
            'label_values(mlprof_workload_up{workload=~"$workload"}, run_id)',
            multi=False,
        ),
        sidecar_url_variable(),
        dashboard.TextBoxVariable("pyroscope_url")
        .label("Pyroscope URL")
        .default_value(DEFAULT_PYROSCOPE_URL),
    ]
    for variable in variables:
        board = board.with_variable(variable)
    return with_rows(board, [_row(kind) for kind in PROFILES])
