"""``mlprof capture``, ``mlprof snapshot``, ``mlprof sessions``, ``mlprof targets``.

They talk to a running sidecar's API (``--url``, default ``http://$MLPROF_LISTEN``) with
``$MLPROF_AUTH_TOKEN``; ``capture`` shows a progress bar until the session ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from exporter import schema
from exporter.config import MAX_ALERT_CAPTURES, load_settings
from exporter.errors import ConfigError, MlprofError

__all__ = ["COMMANDS"]

F = TypeVar("F", bound=Callable[..., Any])


def api_options(func: F) -> F:
    """``--url``, ``--config``, ``--json``: which sidecar to ask and how to print."""
    options = [
        click.option(
            "--url", envvar="MLPROF_API_URL",
            help="Sidecar base URL (env MLPROF_API_URL; default http://<MLPROF_LISTEN>).",
        ),
        click.option(
            "--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
            envvar="MLPROF_CONFIG", help="YAML file of settings (env MLPROF_CONFIG).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def _client(url: str | None, config_file: Path | None) -> Any:
    from exporter.api.client import ApiClient

    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config {config_file}: no such file")
    settings = load_settings(config_file)
    return ApiClient(url or f"http://{settings.listen}", settings.token)


def _selector(targets: tuple[str, ...], run_id: str | None) -> dict[str, Any]:
    return {"targets": list(targets) or None, "run_id": run_id}


target_option = click.option(
    "-t", "--target", "targets", multiple=True,
    help="Known target by address or host (repeat; default: all known targets).",
)  # fmt: skip
run_option = click.option("--run-id", help="Only targets of this run.")


@click.command()
@api_options
@target_option
@run_option
@click.option(
    "-d",
    "--duration-ms",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="How long to trace, in milliseconds (clamped to MLPROF_CAPTURE_MAX_DURATION_MS).",
)
@click.option(
    "--host-tracer-level",
    type=click.IntRange(0, 3),
    default=2,
    show_default=True,
    help="Host (CPU) trace detail: 0 off, 1 user annotations, 2 + high-level runtime, 3 all.",
)
@click.option(
    "--device-tracer-level",
    type=click.IntRange(0, 1),
    default=1,
    show_default=True,
    help="Device (TPU/GPU) trace: 0 off, 1 on.",
)
@click.option(
    "--python-tracer-level",
    type=click.IntRange(0, 1),
    default=0,
    show_default=True,
    help="Python function calls in the host trace: 0 off, 1 on (slows the workload).",
)
@click.option(
    "--delay-ms",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Wait this long before tracing starts, in milliseconds.",
)
@click.option(
    "--kind",
    type=click.Choice(["trace", "snapshot"]),
    default="trace",
    show_default=True,
    help="trace: a new trace now; snapshot: store the newest snapshot window kept.",
)
@click.option("--name", help="Session name (A-Z a-z 0-9 . _ -); a time stamp is appended.")
@click.option(
    "--captures",
    type=click.IntRange(1, MAX_ALERT_CAPTURES),
    default=1,
    show_default=True,
    help="Traces of each target one after another, the duration split among them "
    "(replicates for the session's report).",
)
@click.option("--no-wait", is_flag=True, help="Print the session id and return at once.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0,
              show_default=True, help="Seconds to wait for the session to end.")  # fmt: skip
def capture(
    url: str | None,
    config_file: Path | None,
    as_json: bool,
    targets: tuple[str, ...],
    run_id: str | None,
    duration_ms: int,
    host_tracer_level: int,
    device_tracer_level: int,
    python_tracer_level: int,
    delay_ms: int,
    kind: str,
    name: str | None,
    captures: int,
    no_wait: bool,
    timeout_s: float,
) -> None:
    """Capture an XProf trace (or snapshot) of known targets into the session store."""
    client = _client(url, config_file)
    body = _selector(targets, run_id) | {
        "kind": kind,
        "duration_ms": duration_ms,
        "host_tracer_level": host_tracer_level,
        "device_tracer_level": device_tracer_level,
        "python_tracer_level": python_tracer_level,
        "delay_ms": delay_ms,
        "name": name,
    }
    if captures != 1:  # absent, the request is what a sidecar before the setting accepts
        body["captures"] = captures
    started = client.post("/api/v1/captures", body)
    session_id, status_url = started["session_id"], started["status_url"]
    for key, clamp in started.get("clamped", {}).items():
        click.echo(f"{key} {clamp['requested']} clamped to {clamp['max']}", err=True)
    if no_wait:
        click.echo(json.dumps(started, indent=2) if as_json else session_id)
        return
    try:
        record = _wait(client, status_url, started, timeout_s)
    except KeyboardInterrupt:
        # Ctrl-C stops this command's waiting, not the capture: the sidecar runs it to its
        # end and stores it (there is no cancel). click alone said "Aborted!".
        click.echo(
            f"\nmlprof: stopped waiting; session {session_id} continues in the sidecar and "
            f"is stored when it ends: {client.base_url}{status_url}",
            err=True,
        )
        raise click.exceptions.Exit(130) from None  # 128 + SIGINT, as shells report it
    _report(record, as_json)
    if not as_json:
        # The analysis runs after the capture, in the sidecar: say where its answer lands.
        click.echo(
            f"  report: {client.base_url}/api/v1/sessions/{session_id}/report "
            "(written shortly after; HTML in a browser, JSON otherwise)"
        )


def _wait(client: Any, status_url: str, started: dict[str, Any], timeout_s: float) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    options = started.get("options", {})
    expected_s = (options.get("duration_ms", 0) + options.get("delay_ms", 0)) / 1000
    total = len(started["targets"])
    deadline = time.monotonic() + timeout_s
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(), transient=True, console=None,
    ) as progress:  # fmt: skip
        task = progress.add_task(started["session_id"], total=total, state="starting")
        began = time.monotonic()
        while True:
            record = client.get(status_url)
            done = sum(1 for t in record["targets"] if t["status"] != "running")
            elapsed = time.monotonic() - began
            state = (
                f"capturing {min(elapsed, expected_s):.1f}/{expected_s:g}s"
                if elapsed < expected_s
                else "collecting"
            )
            progress.update(task, completed=done, state=f"{state}, {done}/{total} targets")
            if record["status"] != "running":
                return record
            if time.monotonic() > deadline:
                raise MlprofError(
                    f"session {record['id']} still running after {timeout_s:g}s; "
                    f"see {client.base_url}{status_url}"
                )
            time.sleep(0.25)


def _report(record: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(record, indent=2))
    else:
        click.echo(f"session {record['id']}: {record['status']}")
        for target in record["targets"]:
            files = ", ".join(target["files"]) or "-"
            line = f"  {target['address']:<24} {target['host']:<20} {target['status']:<11} {files}"
            click.echo(line + (f"  ({target['error']})" if target["error"] else ""))
            if target.get("note"):
                click.echo(f"    note: {target['note']}")
    if record["status"] != "done":
        bad = [t["address"] for t in record["targets"] if t["status"] != "ok"]
        raise MlprofError(f"session {record['id']} {record['status']}: {', '.join(bad)} failed")


@click.group()
def snapshot() -> None:
    """Keep snapshots of targets (TPU continuous profiling, else a ring) and take them."""


@snapshot.command("start")
@api_options
@target_option
@run_option
def snapshot_start(
    url: str | None, config_file: Path | None, as_json: bool, targets: tuple[str, ...],
    run_id: str | None,
) -> None:  # fmt: skip
    """Start keeping snapshots of the chosen targets."""
    answer = _client(url, config_file).post("/api/v1/snapshots/start", _selector(targets, run_id))
    _print_snapshots(answer["snapshots"], as_json)


@snapshot.command("stop")
@api_options
@target_option
@run_option
def snapshot_stop(
    url: str | None, config_file: Path | None, as_json: bool, targets: tuple[str, ...],
    run_id: str | None,
) -> None:  # fmt: skip
    """Stop keeping snapshots (of the chosen targets, default all)."""
    answer = _client(url, config_file).post("/api/v1/snapshots/stop", _selector(targets, run_id))
    click.echo(
        json.dumps(answer) if as_json else "stopped: " + (", ".join(answer["stopped"]) or "none")
    )


@snapshot.command("status")
@api_options
def snapshot_status(url: str | None, config_file: Path | None, as_json: bool) -> None:
    """Show the targets kept for snapshots."""
    _print_snapshots(_client(url, config_file).get("/api/v1/snapshots")["snapshots"], as_json)


@snapshot.command("take")
@api_options
@target_option
@run_option
@click.option("--name", help="Session name (A-Z a-z 0-9 . _ -); a time stamp is appended.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the session to end.",
)
def snapshot_take(
    url: str | None, config_file: Path | None, as_json: bool, targets: tuple[str, ...],
    run_id: str | None, name: str | None, timeout_s: float,
) -> None:  # fmt: skip
    """Store the newest snapshot of the chosen targets as a session."""
    client = _client(url, config_file)
    body = _selector(targets, run_id) | {"kind": "snapshot", "name": name}
    started = client.post("/api/v1/captures", body)
    _report(_wait(client, started["status_url"], started | {"options": {}}, timeout_s), as_json)


def _print_snapshots(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no targets kept for snapshots")
    for row in rows:
        error = row.get("error") or row.get("last_error") or ""
        click.echo(
            f"{row['address']:<24} {row['mode']:<11} windows={row.get('windows', 0)}"
            + (f"  ({error})" if error else "")
        )


@click.command()
@api_options
@click.option("--run-id", help="Only sessions of this run.")
@click.option(
    "--trigger", type=click.Choice(list(schema.TRIGGERS)), help="Only sessions started so."
)
@click.option(
    "--since",
    callback=lambda ctx, param, value: _iso_time(value),
    help="Created at or after (ISO 8601, e.g. 2026-11-29T08:00).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, 10000),
    default=20,
    show_default=True,
    help="Sessions shown at most.",
)
@click.option(
    "--store", envvar="MLPROF_STORE",
    help="Read this session store directly, with no sidecar (env MLPROF_STORE; "
    "default: ask the sidecar at --url).",
)  # fmt: skip
def sessions(
    url: str | None, config_file: Path | None, as_json: bool, run_id: str | None,
    trigger: str | None, since: str | None, limit: int, store: str | None,
) -> None:  # fmt: skip
    """List capture sessions in the store, newest first.

    With --store (or MLPROF_STORE) the store is read here, as `mlprof analyze` and
    `mlprof compare` read it; without, the sidecar at --url answers for its own store.
    """
    source = click.get_current_context().get_parameter_source
    asked_url = url is not None and source("url") == ParameterSource.COMMANDLINE
    if asked_url and store is not None and source("store") == ParameterSource.COMMANDLINE:
        raise ConfigError("--store and --url: give one (a store read here, or a sidecar)")
    if store is not None and not asked_url:  # --url on the command line beats MLPROF_STORE
        answer = _stored_sessions(store, config_file, run_id, trigger, since, limit)
    else:
        answer = _client(url, config_file).get(
            "/api/v1/sessions", run_id=run_id, trigger=trigger, since=since, limit=limit
        )
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    rows = [
        (
            record["id"], record["status"], record["trigger"], record["created"][:19],
            record.get("run_id") or "-", ",".join(t["host"] for t in record["targets"]) or "-",
        )
        for record in answer["sessions"]
    ]  # fmt: skip
    if rows:
        _table(("SESSION", "STATUS", "TRIGGER", "CREATED (UTC)", "RUN", "HOSTS"), rows)
    shown, matching = len(answer["sessions"]), answer["total"]
    stored = answer.get("stored", matching)  # an older sidecar does not say
    filtered = any(v is not None for v in (run_id, trigger, since))
    note = f" ({matching} match; --limit {limit})" if filtered and matching > shown else ""
    click.echo(f"{shown} of {stored} sessions{note}", err=True)


@click.command()
@api_options
def targets(url: str | None, config_file: Path | None, as_json: bool) -> None:
    """List the profiler targets the sidecar knows, with their last reachability."""
    client = _client(url, config_file)
    answer = client.get("/api/v1/targets")
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    rows = []
    for target in answer["targets"]:
        health = target["health"]
        state = {True: "reachable", False: "unreachable", None: "unknown"}[health["reachable"]]
        rows.append(
            (target["address"], target["host"], target["run_id"] or "-", target["source"],
             state + (" busy" if target["busy"] else ""))
        )  # fmt: skip
    if rows:
        _table(("ADDRESS", "HOST", "RUN", "SOURCE", "STATE"), rows)
    else:
        click.echo(
            f"no profiler targets known to the sidecar at {client.base_url}: start the "
            "workload with sdk.run(..., profiler_port=9999), or set MLPROF_TARGETS or "
            "discovery (docs/capture.md)"
        )
    for source, error in answer.get("discovery_errors", {}).items():
        click.echo(f"discovery {source}: {error}", err=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns as wide as their widest cell, a header row first."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo(
            "  ".join(f"{cell!s:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip()
        )


def _stored_sessions(
    store: str, config_file: Path | None, run_id: str | None, trigger: str | None,
    since: str | None, limit: int,
) -> dict[str, Any]:  # fmt: skip
    """``GET /api/v1/sessions``'s answer, from the store itself."""
    from datetime import UTC

    from exporter.capture.store import SessionStore
    from exporter.usecases import list_sessions

    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config {config_file}: no such file")
    url = load_settings(config_file, store=store).store
    moment = datetime.fromisoformat(since) if since else None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # as the API reads a time without a zone
    return list_sessions(
        SessionStore(url), run_id=run_id, trigger=trigger, since=moment, limit=limit
    )


def _iso_time(value: str | None) -> str | None:
    """Check an ISO 8601 time before asking the sidecar: a usage error names the option."""
    if value is None:
        return None
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 time; expected e.g. 2026-11-29 or 2026-11-29T08:00",
            param_hint="'--since'",
        ) from None
    return value


COMMANDS = [capture, snapshot, sessions, targets]
