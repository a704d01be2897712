"""What every mlprof dashboard shares: data sources, variables, matchers, panel defaults.

Every Prometheus query goes through the ``$datasource`` variable and every profile
query through ``$pyroscope``. The ``uid``s are stable: alert annotations
(``dashboard_url`` in alerts/thresholds.yaml) and links between the dashboards use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import ascii_uppercase

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models_dashboard
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    VariableHide,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from alerts.render import load_thresholds

__all__ = [
    "ALERT_THROTTLE_REASONS",
    "CAPTURE_PATH",
    "FLEET_UID",
    "HEALTH_UID",
    "PROFILES_UID",
    "PROMETHEUS",
    "PYROSCOPE",
    "RUN",
    "RUN_UID",
    "SIDECAR",
    "TAG",
    "RowSpec",
    "capture_link",
    "dashboard_link",
    "datasource_variables",
    "default_stat",
    "default_table",
    "default_timeseries",
    "field_links",
    "increase",
    "job_variable",
    "merged_columns",
    "mlprof_dashboard",
    "prom",
    "query_variable",
    "run_variables",
    "sidecar_url_variable",
    "url_link",
    "with_rows",
]

# Stable uids. The Run dashboard keeps the uid of the single overview it replaces, so
# the dashboard_url of alerts already sent and bookmarks keep working.
FLEET_UID = "mlprof-fleet"
RUN_UID = "mlprof-overview"
PROFILES_UID = "mlprof-profiles"
HEALTH_UID = "mlprof-exporter-health"
# Every dashboard carries this tag: the dashboards' link bar lists them all.
TAG = "mlprof"

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
PYROSCOPE = DataSourceRef(type_val="grafana-pyroscope-datasource", uid="${pyroscope}")
# The sidecar's page that starts an on-demand capture (a link cannot POST, and a GET
# must not start one by itself: the page shows a form that POSTs to the capture API).
CAPTURE_PATH = "/ui/capture"
DEFAULT_SIDECAR_URL = "http://127.0.0.1:9464"

# Label matchers every run-level query carries; the sidecar's own series by scrape job.
RUN = 'workload=~"$workload", run_id=~"$run_id", host=~"$host"'
SIDECAR = 'job=~"$job"'
# The series every run has from its first step-log line: the source of the run variables.
RUN_SERIES = "mlprof_workload_up"
# Clock event reasons that mean trouble, as MLAcceleratorThrottled has them (a regex).
ALERT_THROTTLE_REASONS: str = load_thresholds()["alerts"]["MLAcceleratorThrottled"]["reasons"]


def prom(
    expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, as_table: bool = False
) -> prometheus.Dataquery:
    """A PromQL target on ``$datasource`` (instant, or as a table, for stats and tables)."""
    query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
    query = query.datasource(PROMETHEUS)
    query = query.instant() if instant else query.range()
    if as_table:
        query = query.format(PromQueryFormat.TABLE)
    return query


def increase(series: str, window: str) -> str:
    """Events counted in ``window``, including a counter's first one.

    The sidecar's capture and webhook counters are born at their first increment (value
    1): ``increase()`` sees no change within a new series, so a series that appeared in
    the window counts with its value.
    """
    return f"((increase({series}[{window}]) > 0) or ({series} unless {series} offset {window}))"


def default_timeseries(title: str, description: str, unit: str) -> timeseries.Panel:
    """A time series on ``$datasource`` with the legend as a table of last values."""
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .span(12)
        .height(8)
        .legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull"])
        )
        .tooltip(
            common_builder.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )


def default_stat(
    title: str, description: str, expr: str, unit: str, decimals: int = 2
) -> stat.Panel:
    """One number, from an instant query."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .with_target(prom(expr, instant=True))
        .unit(unit)
        .decimals(decimals)
        .span(4)
        .height(4)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
    )


def default_table(title: str, description: str) -> table.Panel:
    """A table on ``$datasource``; the caller adds instant table-format targets."""
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .span(24)
        .height(8)
        .filterable(True)
    )


def merged_columns(
    panel: table.Panel, columns: Sequence[tuple[str, str]], first: Sequence[str] = ()
) -> table.Panel:
    """A table row per label set, one column per ``(name, expr)`` instant query.

    The queries become targets A, B, ...; Grafana merges their frames on the labels and
    names each value column; ``first`` are the label columns to put leftmost.
    """
    for ref, (_, expr) in zip(ascii_uppercase, columns, strict=False):
        panel = panel.with_target(prom(expr, ref=ref, instant=True, as_table=True))
    options: dict[str, object] = {"excludeByName": {"Time": True}}
    if first:
        options["indexByName"] = {label: i for i, label in enumerate(first)}
    options["renameByName"] = {
        f"Value #{ref}": name for ref, (name, _) in zip(ascii_uppercase, columns, strict=False)
    }
    return panel.with_transformation(
        DataTransformerConfig(id_val="merge", options={})
    ).with_transformation(DataTransformerConfig(id_val="organize", options=options))


# -- variables -------------------------------------------------------------------------


def datasource_variables() -> list[dashboard.DatasourceVariable]:
    """``$datasource`` (Prometheus) and ``$pyroscope``, on every dashboard."""
    return [
        dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"),
        dashboard.DatasourceVariable("pyroscope")
        .label("Pyroscope")
        .type("grafana-pyroscope-datasource"),
    ]


def query_variable(
    name: str, label: str, query: str, *, multi: bool, hide: bool = False
) -> dashboard.QueryVariable:
    """``label_values(...)`` on ``$datasource``; multi-value ones default to All (``.*``)."""
    variable = (
        dashboard.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(PROMETHEUS)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)  # runs come and go
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(multi)
    )
    if multi:
        variable = variable.all_value(".*").current(
            VariableOption(selected=True, text="All", value="$__all")
        )
    if hide:
        variable = variable.hide(VariableHide.HIDE_VARIABLE)
    return variable


def run_variables(*, multi_run: bool) -> list[dashboard.QueryVariable]:
    """``$workload``, ``$run_id`` (one run, or any number) and ``$host``, chained."""
    return [
        query_variable("workload", "Workload", f"label_values({RUN_SERIES}, workload)", multi=True),
        query_variable(
            "run_id",
            "Run",
            f'label_values({RUN_SERIES}{{workload=~"$workload"}}, run_id)',
            multi=multi_run,
        ),
        query_variable(
            "host",
            "Host",
            f'label_values({RUN_SERIES}{{workload=~"$workload", run_id=~"$run_id"}}, host)',
            multi=True,
        ),
    ]


def job_variable() -> dashboard.QueryVariable:
    """The sidecars' scrape jobs: ``target_info`` is exposed from the first scrape."""
    return query_variable(
        "job",
        "Sidecar job",
        'label_values(target_info{service_name="mlprof-exporter"}, job)',
        multi=True,
    )


def sidecar_url_variable() -> dashboard.TextBoxVariable:
    """Where the browser reaches the sidecar (capture page, reports, comparisons)."""
    return (
        dashboard.TextBoxVariable("sidecar_url")
        .label("Sidecar URL")
        .default_value(DEFAULT_SIDECAR_URL)
        .current(VariableOption(text=DEFAULT_SIDECAR_URL, value=DEFAULT_SIDECAR_URL))
    )


# -- links -----------------------------------------------------------------------------


def capture_link() -> dashboard.DashboardLink:
    """The sidecar's capture page for the selected run and hosts."""
    url = "${sidecar_url}" + CAPTURE_PATH + "?run_id=${run_id:percentencode}&host=${host:csv}"
    tooltip = "Open the sidecar's capture page for the selected run and hosts"
    return url_link("Capture a profile", url, tooltip).icon("bolt")


def dashboard_link() -> dashboard.DashboardLink:
    """A drop-down of every mlprof dashboard, carrying the variables and the time range."""
    return (
        dashboard.DashboardLink("mlprof dashboards")
        .type(DashboardLinkType.DASHBOARDS)
        .tags([TAG])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
        .target_blank(False)
        .tooltip("")
        .url("")
        .icon("external link")
    )


def mlprof_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    """A dashboard with the shared settings: uid, tags, refresh, UTC, shared crosshair."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, "ml", "accelerators"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("utc")
        .link(dashboard_link())
    )


# -- rows --------------------------------------------------------------------------------

# A row of panels: its title and its panels, left to right; spans add up to 24 per line.
RowSpec = tuple[str, list[cogbuilder.Builder[models_dashboard.Panel]]]


def with_rows(board: dashboard.Dashboard, rows: list[RowSpec]) -> dashboard.Dashboard:
    """Add each row and its panels (the SDK lays them out left to right, top to bottom)."""
    for title, panels in rows:
        board = board.with_row(dashboard.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


def field_links(*links: dashboard.DashboardLink) -> DynamicConfigValue:
    """An override property: data links on a field (``${__value.raw}``, ``${__data...}``)."""
    return DynamicConfigValue(id_val="links", value=[link.build().to_json() for link in links])


def url_link(title: str, url: str, tooltip: str = "") -> dashboard.DashboardLink:
    """A plain link opening ``url`` (Grafana variables interpolated) in a new tab."""
    return (
        dashboard.DashboardLink(title)
        .type(DashboardLinkType.LINK)
        .url(url)
        .target_blank(True)
        .tooltip(tooltip)
        .tags([])
        .as_dropdown(False)
        .include_vars(False)
        .keep_time(False)
        .icon("external link")
    )
