"""``mlprof compare``, ``mlprof analyze``, ``mlprof baseline`` and ``mlprof mcp``.

They run here, on files, sessions of the store (``--store``, ``MLPROF_STORE``), runs
and Pyroscope selections (``MLPROF_PYROSCOPE_URL``); no sidecar is needed. Exit codes:
0 done, 1 a failure (or ``--fail-on-regression`` tripped), 2 a usage error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from exporter.cli_output import check_output, write_output
from exporter.config import Settings, load_settings
from exporter.errors import ConfigError, InputError, MlprofError

__all__ = ["COMMANDS"]

KIND_CHOICE = click.Choice(["device", "host", "memory"])


def _settings(store: str | None) -> Settings:
    return load_settings(None, store=store)


format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
)
output_option = click.option(
    "-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Write to FILE."
)
store_option = click.option(
    "--store", help="Session store, to name sessions by id (env MLPROF_STORE)."
)


@click.command()
@click.argument("sides", nargs=-1, metavar="[BASE HEAD]")
@click.option(
    "--base",
    "bases",
    multiple=True,
    metavar="SPEC",
    help="A base capture (repeat: each capture is a replicate, a separate process of the "
    "same workload, and their spread is the between-run noise).",
)
@click.option("--head", "heads", multiple=True, metavar="SPEC", help="A head capture (repeat).")
@click.option(
    "--kind",
    type=KIND_CHOICE,
    help="Narrow to device, host or memory (default for captures: the step view, XLA "
    "work and the host's phases such as input_pipeline; memory for memory profiles).",
)
@format_option
@output_option
@click.option(
    "--fail-on-regression",
    "fail_pct",
    type=click.FloatRange(min=0),
    help="Exit 1 when a regression verdict adds more than PCT % of the base step, or the "
    "step time is slower (beyond noise) by more than PCT %.",
    metavar="PCT",
)
@click.option(
    "--top", type=click.IntRange(min=1), default=20, show_default=True, help="Entries per list."
)
@click.option(
    "--history",
    multiple=True,
    metavar="SPEC",
    help="An earlier run of the same workload, one capture (repeat, or run:<id>~N; 3 or "
    "more): their spread between runs judges the step time and each frame, in place of "
    "the fixed floors with one capture a side.",
)
@store_option
@click.option("--from", "time_from", help="Pyroscope sides: start (now-1h, Unix s, ISO 8601).")
@click.option("--until", "time_until", help="Pyroscope sides: end (default now).")
@click.option("--profile-type", help="Pyroscope sides: profile type (name:type:unit:ptype:punit).")
def compare(
    sides: tuple[str, ...],
    bases: tuple[str, ...],
    heads: tuple[str, ...],
    kind: str | None,
    fmt: str,
    output: Path | None,
    fail_pct: float | None,
    top: int,
    history: tuple[str, ...],
    store: str | None,
    time_from: str | None,
    time_until: str | None,
    profile_type: str | None,
) -> None:
    """Compare HEAD against BASE: did the step get slower, beyond noise, and which work
    explains it (time per step).

    BASE and HEAD are each an .xplane.pb, a memory or project pprof, a session (its
    directory or id in the store), run:<run_id> (run:<run_id>~N: its N newest sessions,
    each a replicate), or pyroscope:{label="value",...}. Give them as the two arguments,
    or as --base/--head, repeated for several captures a side.
    """
    from exporter import usecases
    from exporter.heap import keep_freed_memory

    if len(sides) not in (0, 2):
        raise ConfigError(f"compare: expected BASE HEAD (or --base/--head), got {len(sides)}")
    base = [*sides[:1], *bases]
    head = [*sides[1:], *heads]
    if not base or not head:
        raise ConfigError("compare: expected BASE HEAD, or at least one --base and one --head")
    check_output(fmt, output)
    keep_freed_memory()  # a short-lived process: numpy temporaries reuse faulted-in pages
    context = usecases.side_context(
        _settings(store), time_from=time_from, time_until=time_until, profile_type=profile_type
    )
    comparison = usecases.compare(base, head, context, kind=kind, history=history)  # type: ignore[arg-type]
    data = usecases.comparison_document(comparison, fmt, top)
    regressions = sum(e.regression for e in comparison.regressions)
    write_output(
        data, output, f"{comparison.kind}, {comparison.normalisation}, {regressions} regressions"
    )
    if fail_pct is not None:
        reasons = comparison.gate_reasons(fail_pct)
        if reasons:
            more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
            raise MlprofError(f"regression gate {fail_pct:g} %: {reasons[0]}{more}")
        click.echo(
            f"regression gate {fail_pct:g} %: passed (no regression verdict adds more than "
            f"{fail_pct:g} % of the step; step time {comparison.step_verdict.verdict})",
            err=True,
        )


@click.command()
@click.argument("input_text", metavar="INPUT")
@format_option
@output_option
@click.option("--baseline", help="Also compare against this (any side compare accepts).")
@click.option("--no-xprof", is_flag=True, help="Skip XProf's converters (faster).")
@store_option
def analyze(
    input_text: str,
    fmt: str,
    output: Path | None,
    baseline: str | None,
    no_xprof: bool,
    store: str | None,
) -> None:
    """Analysis report of an .xplane.pb, a session (directory or id) or run:<run_id>."""
    from exporter import usecases
    from exporter.heap import keep_freed_memory

    check_output(fmt, output)
    keep_freed_memory()  # a short-lived process: numpy temporaries reuse faulted-in pages
    context = usecases.side_context(_settings(store))
    report = usecases.analyze(input_text, context, baseline=baseline, xprof=not no_xprof)
    data = usecases.report_document(report, fmt)
    counts = report.counts()
    write_output(
        data, output, f"{report.status}, {counts['P0']} P0, {counts['P1']} P1, {counts['P2']} P2"
    )


@click.group()
def baseline() -> None:
    """Mark the session later captures of a workload (or run) are compared against."""


def _baselines(store: str | None) -> Any:
    from exporter.analysis.sides.baselines import BaselineStore
    from exporter.capture.store import SessionStore

    return BaselineStore(SessionStore(_settings(store).store))


@baseline.command("set")
@click.argument("session")
@click.option("--workload", help="Workload name (default: the session's workload).")
@click.option("--run-id", help="Mark it as this run's baseline instead.")
@store_option
def baseline_set(session: str, workload: str | None, run_id: str | None, store: str | None) -> None:
    """Mark SESSION (an id in the store) as the baseline."""
    from exporter.capture.session import check_session_id

    marks = _baselines(store)
    try:
        check_session_id(session)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    record = marks.store.read_record(session)
    if record is None:
        raise InputError(f"no session {session!r} in the store {marks.store.url}")
    name = run_id or workload or record.workload or _workload_from_run(record.run_id)
    if not name:
        raise ConfigError(
            f"session {session}: its workload is unknown; give --workload NAME or --run-id ID"
        )
    try:
        mark = marks.set(name, session, run=run_id is not None, by="cli")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(json.dumps(mark))


def _workload_from_run(run_id: str | None) -> str | None:
    if not run_id:
        return None
    from exporter.capture.session import SessionRecord
    from exporter.pipeline.worker import workload_from_shared_dir

    # The workload's file, read as the sidecar reads it (regular, no link, bounded).
    workload_of = workload_from_shared_dir(load_settings(None).shared_dir)
    return workload_of(SessionRecord(id="cli", run_id=run_id))


@baseline.command("show")
@store_option
def baseline_show(store: str | None) -> None:
    """Every workload's baseline mark (JSON lines)."""
    for mark in _baselines(store).marks():
        click.echo(json.dumps(mark))


@click.command()
@store_option
@click.option(
    "--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
    envvar="MLPROF_CONFIG", help="YAML file of settings (env MLPROF_CONFIG).",
)  # fmt: skip
@click.option("--shared-dir", help="Directory shared with the workload (for run:<id>).")
@click.option(
    "--allow-capture", is_flag=True,
    help="Add a capture tool that asks the sidecar (--url) for traces; off: read-only.",
)  # fmt: skip
@click.option(
    "--url", envvar="MLPROF_API_URL",
    help="Sidecar base URL for --allow-capture (env MLPROF_API_URL; default http://<MLPROF_LISTEN>).",
)  # fmt: skip
def mcp(
    store: str | None,
    config_file: Path | None,
    shared_dir: str | None,
    allow_capture: bool,
    url: str | None,
) -> None:
    """Serve the analysis tools to a Model Context Protocol client over stdio.

    Tools: list_sessions, list_runs, analyze, compare, top_ops, gpu_kernels,
    flamegraph_subtree, hosts, memory_peak, xprof (an allow-list of XProf's CLI tools on
    a session), and capture with --allow-capture. Answers are the CLI's JSON; analyses run
    in a bounded child (MLPROF_REPORT_TIMEOUT_S, MLPROF_REPORT_MAX_MEMORY_MB).
    """
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config {config_file}: no such file")
    settings = load_settings(config_file, store=store, shared_dir=shared_dir)
    try:
        from exporter.mcp_server import ProfileTools, build_server

        tools = ProfileTools(
            settings.store,
            settings.shared_dir,
            api_url=(url or f"http://{settings.listen}") if allow_capture else None,
            token=settings.token,
            settings=settings,
        )
        server = build_server(tools, allow_capture=allow_capture)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("mcp"):
            raise
        raise ConfigError(
            "mlprof mcp needs the MCP SDK: pip install 'mlprof-exporter[mcp]'"
        ) from None
    server.run("stdio")


COMMANDS = [compare, analyze, baseline, mcp]
