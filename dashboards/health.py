"""The Exporter health dashboard: is the sidecar itself doing its job?

Scrapes, metric sources, the step log, profile pushes and the spool, the Alertmanager
webhook, captures, reports and events, per sidecar (``$job``).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    HEALTH_UID,
    SIDECAR,
    RowSpec,
    datasource_variables,
    default_stat,
    default_timeseries,
    increase,
    job_variable,
    mlprof_dashboard,
    prom,
    sidecar_url_variable,
    url_link,
    with_rows,
)

__all__ = ["ROWS", "health_dashboard"]

RATE = "$__rate_interval"
# Each source's state, why it is off, and the metrics this machine's hardware does not
# offer (skipped once, never retried): what a panel of counts cannot say.
READYZ = url_link(
    "Sources' state and skipped metrics (/readyz)",
    "${sidecar_url}/readyz",
    "The sidecar's readiness: each source's state, its error, and the metrics it skips",
)


def scrapes() -> RowSpec:
    """Can Prometheus read the sidecars, and how long does it take."""
    return "Scrapes", [
        default_stat(
            "Sidecars up", "Sidecars Prometheus scraped successfully last time.",
            f"sum(up{{{SIDECAR}}})", "none", decimals=0,
        ).span(6),
        default_stat(
            "Series exposed", "Samples in the last scrape, over all sidecars.",
            f"sum(scrape_samples_scraped{{{SIDECAR}}})", "short", decimals=0,
        ).span(6),
        default_stat(
            "Workloads up", "Runs/hosts whose step-log heartbeat is fresh.",
            f"sum(mlprof_workload_up{{{SIDECAR}}})", "none", decimals=0,
        ).span(6),
        default_stat(
            "Spool", "Profile bytes waiting to be pushed, over all sidecars.",
            f"sum(mlprof_spool_size_bytes{{{SIDECAR}}}) or vector(0)", "bytes", decimals=0,
        ).span(6),
        default_timeseries(
            "Scrape duration", "How long each scrape of /metrics took.", "s"
        ).min(0).with_target(prom(f"scrape_duration_seconds{{{SIDECAR}}}", "{{instance}}")),
        default_timeseries(
            "Failed scrapes", "Share of scrapes that failed (the target was down or erred).",
            "percentunit",
        ).min(0).max(1).with_target(
            prom(f"1 - avg_over_time(up{{{SIDECAR}}}[{RATE}])", "{{instance}}")
        ),
    ]  # fmt: skip


def sources() -> RowSpec:
    """Which metric sources deliver, and which fail."""
    return "Metric sources and step log", [
        default_timeseries(
            "Series per source",
            "Accelerator series each source delivers (libtpu, nvml, jax, sdk): a source at "
            "zero delivers nothing; /readyz says why.",
            "none",
        )
        .span(8)
        .min(0)
        .with_target(
            prom(f'count by (source) ({{__name__=~"accelerator_.+", {SIDECAR}}})', "{{source}}")
        )
        .links([READYZ]),
        default_timeseries(
            "Source errors", "Failed collections per source (gRPC, NVML, ...).", "none"
        )
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"sum by (source) (increase(mlprof_source_errors_total{{{SIDECAR}}}[{RATE}]))",
                "{{source}}",
            )
        )
        .links([READYZ]),
        default_timeseries(
            "Step-log errors", "Malformed step-log lines skipped, by reason.", "none"
        )
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"sum by (reason) (increase(mlprof_step_log_errors_total{{{SIDECAR}}}[{RATE}]))",
                "{{reason}}",
            )
        ),
    ]


def profiles() -> RowSpec:
    """Flame graphs leaving for Pyroscope, and what waits in the spool."""
    return "Profile pushes", [
        default_timeseries(
            "Profile pushes",
            "Pushes per second by sink and status: ok, spooled (retried later), rejected "
            "(the server refused it) or dropped.",
            "ops",
        )
        .min(0)
        .no_value("0")  # no push yet (or no sink): the counters appear with the first one
        .with_target(
            prom(
                f"sum by (sink, status) (rate(mlprof_profile_pushes_total{{{SIDECAR}}}[{RATE}]))",
                "{{sink}} {{status}}",
            )
        ),
        default_timeseries("Spool", "Bytes of profiles waiting to be pushed.", "bytes")
        .min(0)
        .no_value("0")  # no sink configured: nothing can wait
        .with_target(
            prom(f"sum by (instance, sink) (mlprof_spool_size_bytes{{{SIDECAR}}})", "{{instance}}")
        ),
    ]


def captures() -> RowSpec:
    """Alerts at the webhook, the captures they and others started, and the reports."""
    return "Webhook, captures and reports", [
        default_timeseries(
            "Webhook outcomes",
            "Alertmanager alerts at the webhook by outcome (started, cooldown, duplicate, "
            "resolved, refused ...).",
            "none",
        )
        .span(8)
        .min(0)
        .no_value("0")  # no alert has reached the webhook yet
        .with_target(
            prom(
                "sum by (outcome) "
                f"({increase(f'mlprof_alerts_received_total{{{SIDECAR}}}', RATE)})",
                "{{outcome}}",
            )
        ),
        default_timeseries("Captures", "Finished capture sessions by status and trigger.", "none")
        .span(8)
        .min(0)
        .with_target(
            prom(
                "sum by (status, trigger) "
                f"({increase(f'mlprof_captures_total{{{SIDECAR}}}', RATE)})",
                "{{status}} ({{trigger}})",
            )
        ),
        default_timeseries("Reports", "Analysis reports written, by verdict.", "none")
        .span(8)
        .min(0)
        .with_target(
            prom(
                f"sum by (status) (increase(mlprof_reports_total{{{SIDECAR}}}[{RATE}]))",
                "{{status}}",
            )
        ),
    ]


def events() -> RowSpec:
    """Run events leaving for the event sink, and those it had to drop."""
    return "Events", [
        default_timeseries("Events", "Run events emitted, by type.", "none")
        .min(0)
        .with_target(
            prom(
                f"sum by (type) (increase(mlprof_events_total{{{SIDECAR}}}[{RATE}]))",
                "{{type}}",
            )
        ),
        default_timeseries(
            "Events dropped", "Events the sink could not deliver (queue full, errors).", "none"
        )
        .min(0)
        .with_target(
            prom(
                f"sum by (sink) (increase(mlprof_events_dropped_total{{{SIDECAR}}}[{RATE}]))",
                "{{sink}}",
            )
        ),
    ]


ROWS = (scrapes, sources, profiles, captures, events)


def health_dashboard() -> dashboard.Dashboard:
    """The Exporter health dashboard."""
    board = mlprof_dashboard(
        HEALTH_UID,
        "mlprof exporter health",
        "The mlprof sidecars themselves: scrapes, metric sources, step log, profile pushes "
        "and spool, webhook outcomes, captures, reports and events.",
    )
    for variable in [*datasource_variables(), job_variable(), sidecar_url_variable()]:
        board = board.with_variable(variable)
    return with_rows(board, [row() for row in ROWS])
