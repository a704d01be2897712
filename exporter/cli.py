"""The ``mlprof`` command line: serve the sidecar, run the demo, and (later) captures."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from exporter import __version__, schema
from exporter.config import Settings, load_settings
from exporter.errors import ConfigError, MlprofError

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


class _Group(click.Group):
    """Prints MlprofError as one line with its exit code instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MlprofError as exc:
            click.echo(f"mlprof: {exc}", err=True)
            ctx.exit(exc.exit_code)


def settings_options(func: F) -> F:
    """The options every sidecar-facing command takes; each also has an MLPROF_ variable."""
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path, dir_okay=False),
            envvar="MLPROF_CONFIG",
            help="YAML file of settings (env MLPROF_CONFIG).",
        ),
        click.option("--listen", help="HTTP address, host:port (env MLPROF_LISTEN)."),
        click.option("--shared-dir", help="Directory shared with the workload."),
        click.option("--store", help="Session store path or URL."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _settings(config_file: Path | None, **overrides: Any) -> Settings:
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config {config_file}: no such file")
    return load_settings(config_file, **overrides)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlprof")
def main() -> None:
    """mlprof-exporter: ML workload metrics, flame graphs and captures for Grafana."""


def _build_server(settings: Settings) -> Any:
    import uvicorn

    from exporter.api.app import create_app
    from exporter.sidecar import Sidecar

    app = create_app(Sidecar(settings))
    config = uvicorn.Config(
        app,
        host=settings.listen_host,
        port=settings.listen_port,
        log_level="warning" if settings.log_level == "info" else settings.log_level,
        access_log=settings.log_level == "debug",
        lifespan="on",
    )
    return uvicorn.Server(config)


def _check_port_free(settings: Settings) -> None:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET) as s:
        try:
            s.bind((settings.listen_host, settings.listen_port))
        except OSError as exc:
            raise ConfigError(
                f"MLPROF_LISTEN={settings.listen}: cannot listen there ({exc.strerror})"
            ) from None


@main.command()
@settings_options
def serve(
    config_file: Path | None, listen: str | None, shared_dir: str | None, store: str | None
) -> None:
    """Run the sidecar: /metrics, health, API, and background collection."""
    settings = _settings(config_file, listen=listen, shared_dir=shared_dir, store=store)
    _configure_logging(settings.log_level)
    _check_port_free(settings)
    base = f"http://{settings.listen}"
    logging.getLogger("exporter").info(
        "serving %s/metrics (API docs %s/docs), tailing %s", base, base, settings.shared_dir
    )
    _build_server(settings).run()


@main.command()
@settings_options
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=0,
    help="Stop after N seconds (0 = until Ctrl-C).",
)
@click.option("--profiler-port", type=click.IntRange(0, 65535), default=9999, show_default=True)
@click.option(
    "--steps", type=click.IntRange(min=0), default=0, help="Stop the workload after N steps."
)
def demo(
    config_file: Path | None,
    listen: str | None,
    shared_dir: str | None,
    store: str | None,
    duration: float,
    profiler_port: int,
    steps: int,
) -> None:
    """Run the demo JAX workload and the sidecar together with embedded defaults."""
    settings = _settings(config_file, listen=listen, shared_dir=shared_dir, store=store)
    _configure_logging(settings.log_level)
    try:
        import jax  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the demo workload needs JAX: pip install 'mlprof-exporter[jax]'"
        ) from None
    _check_port_free(settings)
    shared = settings.shared_dir.resolve()
    shared.mkdir(parents=True, exist_ok=True)
    log_path = shared / "demo-workload.log"
    env = {**os.environ, "MLPROF_SHARED_DIR": str(shared)}
    cmd = [
        sys.executable, "-m", "exporter.demo.workload",
        "--shared-dir", str(shared),
        "--profiler-port", str(profiler_port),
        "--steps", str(steps),
    ]  # fmt: skip
    with log_path.open("ab") as out:
        workload = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = _build_server(settings)
    base = f"http://{settings.listen}"
    knob = shared / schema.DEMO_INPUT_DELAY_FILE
    click.echo(
        "\n".join(
            [
                f"mlprof demo: workload pid {workload.pid} (log {log_path}), sidecar on {base}",
                f"  metrics      {base}/metrics",
                f"  API docs     {base}/docs",
                f"  readiness    {base}/readyz",
                f"  shared dir   {shared}   (run.json, steps/*.jsonl)",
                f"  store        {settings.store}",
                *(
                    [f"  profiler     127.0.0.1:{profiler_port} (XProf remote capture)"]
                    if profiler_port
                    else []
                ),
                f"  slow it down echo 0.2 > {knob}   (remove the file to recover)",
                "  stop         Ctrl-C" + (f" (or after {duration:g}s)" if duration else ""),
            ]
        )
    )

    def watch() -> None:
        deadline = time.monotonic() + duration if duration else None
        while not server.should_exit:
            if workload.poll() is not None and steps == 0:
                click.echo(
                    f"mlprof demo: workload exited with {workload.returncode}; see {log_path}",
                    err=True,
                )
                server.should_exit = True
            if deadline is not None and time.monotonic() >= deadline:
                server.should_exit = True
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.run()
    finally:
        if workload.poll() is None:
            workload.send_signal(signal.SIGTERM)
            try:
                workload.wait(30)
            except subprocess.TimeoutExpired:
                workload.kill()
        click.echo(
            f"mlprof demo: stopped (workload exit {workload.wait()}); data kept in {shared.parent}"
        )


if __name__ == "__main__":
    main()
