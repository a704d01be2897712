"""The ``mlprof`` command line: serve the sidecar, run the demo, and (later) captures."""

from __future__ import annotations

# What only the sidecar commands use (logging, subprocess, shutil, signal, threading,
# the schema's hashlib and json) is imported in them: ``mlprof flamegraph``'s process
# on a small capture is mostly start-up (tests/unit/test_flamegraph_startup.py holds it).
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from exporter import __version__
from exporter.cli_output import check_output, write_output
from exporter.errors import ConfigError, InputError, MlprofError

if TYPE_CHECKING:  # settings (pydantic) load when a command needs them, not at start-up
    import subprocess

    from exporter.config import Settings
    from exporter.profiles.pprof import InflateLimits

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


class _Group(click.Group):
    """Prints MlprofError as one line with its exit code instead of a traceback.

    The capture commands (``exporter.cli_capture``) and the analysis commands
    (``exporter.cli_analysis``: compare, analyze, baseline) are registered when first
    looked up or listed, so ``mlprof flamegraph`` does not import what it does not use.
    """

    def _load_lazy(self) -> None:
        from exporter.cli_analysis import COMMANDS as ANALYSIS
        from exporter.cli_capture import COMMANDS as CAPTURE

        for command in (*CAPTURE, *ANALYSIS):
            if command.name not in self.commands:
                self.add_command(command)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self._load_lazy()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_lazy()
        return super().list_commands(ctx)

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
    from exporter.config import load_settings

    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config {config_file}: no such file")
    return load_settings(config_file, **overrides)


def _configure_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from exporter.profiles.xspace import DECODER  # imported here: it loads numpy

    click.echo(f"mlprof {__version__} (XSpace decoder: {DECODER})")
    ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the XSpace decoder in use (compiled or python), and exit.",
)
def main() -> None:
    """mlprof-exporter: ML workload metrics, flame graphs and captures for Grafana."""


def _build_server(settings: Settings) -> Any:
    import uvicorn

    from exporter.api.app import create_app
    from exporter.api.header_timeout import HeaderTimeoutProtocol
    from exporter.sidecar import Sidecar

    app = create_app(Sidecar(settings))
    config = uvicorn.Config(
        app,
        host=settings.listen_host,
        port=settings.listen_port,
        log_level="warning" if settings.log_level == "info" else settings.log_level,
        access_log=settings.log_level == "debug",
        lifespan="on",
        http=HeaderTimeoutProtocol,  # h11 alone holds a half-sent request for ever
    )
    return uvicorn.Server(config)


def _shown_store(store: str) -> str:
    return store if "://" in store else str(Path(store).resolve())


def _check_startup(
    settings: Settings, config_file: Path | None = None, **overrides: str | None
) -> None:
    """Turn the usual start-up failures into one line each: port taken, directory unusable.

    Each line names the option where the user typed it (``--listen``, ``MLPROF_LISTEN``
    or ``listen in FILE``).
    """
    import socket

    from exporter.config import option_shown

    def where(field: str) -> str:
        return option_shown(field, getattr(settings, field), config_file, overrides)

    with socket.socket(socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET) as s:
        # As uvicorn does: a restart must not wait for the last run's TIME_WAIT sockets.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((settings.listen_host, settings.listen_port))
        except OSError as exc:
            raise ConfigError(f"{where('listen')}: cannot listen there ({exc.strerror})") from None
    directories = {"shared_dir": settings.shared_dir}
    if "://" not in settings.store or settings.store.startswith("file://"):
        directories["store"] = Path(settings.store.removeprefix("file://"))
    for field, directory in directories.items():
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{where(field)}: cannot create it ({exc.strerror})") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"{where(field)}: not writable by this user")


@main.command()
@settings_options
def serve(
    config_file: Path | None, listen: str | None, shared_dir: str | None, store: str | None
) -> None:
    """Run the sidecar: /metrics, health, API, and background collection."""
    import logging

    settings = _settings(config_file, listen=listen, shared_dir=shared_dir, store=store)
    _configure_logging(settings.log_level)
    _check_startup(settings, config_file, listen=listen, shared_dir=shared_dir, store=store)
    base = f"http://{settings.listen}"
    logging.getLogger("exporter").info(
        "serving %s/metrics (API docs %s/docs), tailing %s", base, base, settings.shared_dir
    )
    _run_until_interrupted(_build_server(settings))


@main.command()
@settings_options
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=0,
    help="Stop N seconds after the workload's first step (0 = until Ctrl-C).",
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
    import subprocess
    import threading

    from exporter import schema

    settings = _settings(config_file, listen=listen, shared_dir=shared_dir, store=store)
    _check_startup(settings, config_file, listen=listen, shared_dir=shared_dir, store=store)
    from exporter.demo.first_step import FirstStep

    shared = settings.shared_dir.resolve()
    shared.mkdir(parents=True, exist_ok=True)
    native_log = shared / "demo-sidecar-native.log"
    _divert_native_output(native_log)
    _configure_logging(settings.log_level)  # after the diversion: Python's logs stay here
    try:
        import jax  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the demo workload needs JAX: pip install 'mlprof-exporter[jax]'"
        ) from None
    log_path = shared / "demo-workload.log"
    env = {**os.environ, "MLPROF_SHARED_DIR": str(shared)}
    cmd = [
        sys.executable, "-m", "exporter.demo.workload",
        "--shared-dir", str(shared),
        "--profiler-port", str(profiler_port),
        "--steps", str(steps),
    ]  # fmt: skip
    with log_path.open("ab") as out:
        # Its own process group: a Ctrl-C in the terminal reaches the demo alone, which
        # forwards it once (two SIGINTs could land while the workload exits, killing it).
        workload = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0
        )
    # --duration counts from the workload's first step: JAX's start and the first
    # compile took more than 12 s on a busy 2-core machine (exporter/demo/first_step.py).
    first_step = FirstStep(shared, workload.pid)
    server = _build_server(settings)
    base = f"http://{settings.listen}"
    knob = shared / schema.DEMO_INPUT_DELAY_FILE
    mlprof = _mlprof_command()
    click.echo(
        "\n".join(
            [
                f"mlprof demo: workload pid {workload.pid} (log {log_path}), sidecar on {base}",
                f"  metrics      {base}/metrics",
                f"  API docs     {base}/docs",
                f"  readiness    {base}/readyz",
                f"  shared dir   {shared}   (run.json, steps/*.jsonl)",
                f"  store        {_shown_store(settings.store)}   (captures; xprof --logdir)",
                *(
                    [f"  profiler     127.0.0.1:{profiler_port} (XProf remote capture)"]
                    if profiler_port
                    else []
                ),
                f"  slow it down echo 0.2 > {knob}   (input wait; remove the file to recover)",
                *(
                    [f"  capture      {mlprof} capture --url {base} --duration-ms 2000"]
                    if profiler_port
                    else []
                ),
                f"  xprof log    {native_log}   (XProf's own messages)",
                "  stop         Ctrl-C"
                + (f" (or {duration:g}s after the first step)" if duration else ""),
            ]
        )
    )

    def watch() -> None:
        deadline: float | None = None
        while not server.should_exit:
            if duration and deadline is None and first_step.seen():
                deadline = time.monotonic() + duration
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
        _run_until_interrupted(server)
    finally:
        _stop_workload(workload)
        click.echo(
            f"mlprof demo: stopped (workload exit {workload.wait()}); data kept in {shared.parent}"
        )


def _mlprof_command() -> str:
    """How the user's shell runs this ``mlprof``: the bare name only if PATH finds it.

    ``make demo`` runs ``.venv/bin/mlprof`` without activating the venv: a printed
    ``mlprof capture`` would answer "command not found".
    """
    import shutil

    mine = Path(sys.executable).parent / "mlprof"
    if not mine.is_file():
        return f"{sys.executable} -m exporter.cli"
    found = shutil.which("mlprof")
    if found is not None and Path(found).resolve() == mine.resolve():
        return "mlprof"
    with contextlib.suppress(ValueError):
        return str(mine.relative_to(Path.cwd()))  # e.g. .venv/bin/mlprof from the repo
    return str(mine)


def _divert_native_output(log_path: Path) -> None:
    """Send what native code writes on fd 1 and 2 to ``log_path``; Python keeps the console.

    XProf's profiler client prints from C++ ("Starting to trace for 2000 ms", absl
    warnings) on every capture, every 30 s with snapshots: kept in a file, not lost.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    console_out, console_err = os.dup(1), os.dup(2)
    sink = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.close(sink)
    sys.stdout = os.fdopen(console_out, "w", buffering=1, encoding="utf-8")
    sys.stderr = os.fdopen(console_err, "w", buffering=1, encoding="utf-8")


def _run_until_interrupted(server: Any) -> None:
    """Run uvicorn; Ctrl-C is the normal way to stop, not an error."""
    # uvicorn re-raises the signal it caught once it has shut down cleanly.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()


def _stop_workload(workload: subprocess.Popen[bytes]) -> None:
    """Stop the demo's workload: SIGINT at once, SIGTERM after 10 s, SIGKILL after 30 more.

    The workload runs in its own process group, so neither a Ctrl-C in the terminal nor
    a SIGINT to the demo's PID reaches it (before, the latter left it running for the
    10 s grace): the demo forwards the signal at once, and the workload finishes its
    step and writes its end record.
    """
    import signal
    import subprocess

    for sig, grace_s in ((signal.SIGINT, 10.0), (signal.SIGTERM, 30.0)):
        if workload.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            workload.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            workload.wait(grace_s)
    if workload.poll() is None:
        workload.kill()


@main.command()
@click.argument("input_text", metavar="INPUT")
@click.option(
    "--kind",
    type=click.Choice(["device", "host", "memory"]),
    help="Which flame graph (default: device time when the capture has devices, else "
    "host; memory for a memory pprof).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["folded", "pprof", "html"]), default="folded",
    show_default=True,
)  # fmt: skip
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="File.")
@click.option("--max-nodes", type=click.IntRange(min=1), help="Fold the smallest frames.")
@click.option("--per-step", is_flag=True, help="Device time per step (the Steps line).")
@click.option("--store", help="Session store, to name a session by id (env MLPROF_STORE).")
def flamegraph(
    input_text: str,
    store: str | None,
    kind: str | None,
    fmt: str,
    output: Path | None,
    max_nodes: int | None,
    per_step: bool,
) -> None:
    """Flame graph (self/total) of an .xplane.pb, a torch.profiler trace (.json[.gz]), a
    memory pprof, a session (dir or id) or run:<run_id> (its sessions' captures, added up)."""
    from exporter.heap import keep_freed_memory

    check_output(fmt, output)
    keep_freed_memory()  # a short-lived process: numpy temporaries reuse faulted-in pages
    # A conversion does no BLAS, and OpenBLAS starts a thread per core when numpy is
    # imported (it reads this only then): ~40 ms of CPU on two cores, start-up's largest
    # cost after numpy's import itself (bench/convert.py --real).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from exporter.capture.inputs import existing_input
    from exporter.profiles.convert import flamegraph_from_path, render
    from exporter.profiles.flamegraph import format_value

    # Settings (and pydantic) only when needed: a session id to look up in the store, or
    # a memory profile whose inflation they bound.
    input_path = Path(input_text)
    run = input_text.startswith("run:") and not input_path.exists()
    if run:
        paths = _run_captures(input_text, _settings(None, store=store).store, per_step)
    elif not input_path.exists():
        input_path = existing_input(input_text, _settings(None, store=store).store)

    def limits() -> InflateLimits:
        from exporter.profiles.pprof import InflateLimits

        settings = _settings(None, store=store)
        return InflateLimits(settings.max_profile_bytes, settings.max_profile_ratio)

    if run:
        graph = flamegraph_from_path(paths[0], kind)  # type: ignore[arg-type]
        for path in paths[1:]:
            try:
                graph.merge(flamegraph_from_path(path, kind))  # type: ignore[arg-type]
            except ValueError as exc:  # one capture with devices, another without
                raise InputError(f"{input_text}: {path.name}: {exc}; give --kind") from None
    else:
        graph = flamegraph_from_path(input_path, kind, per_step, limits)  # type: ignore[arg-type]
    if max_nodes is not None:
        graph = graph.truncated(max_nodes)
    title = f"{input_text if run else input_path.name} ({graph.sample_type}, {graph.unit})"
    data = render(graph, fmt, title)
    total = format_value(graph.root.total, graph.unit)
    if graph.unit in ("nanoseconds", "bytes"):  # the exact figure too, for scripts
        total += f" = {graph.root.total} {graph.unit}"
    threads = len(graph.root.children)
    if graph.sample_type == "wall" and threads > 1:
        # Host time adds up every thread's busy time: more than the capture's wall time.
        total += f", summed over {threads} concurrent threads"
    write_output(data, output, f"{graph.node_count} frames, total {total}")


def _run_captures(spec: str, store: str, per_step: bool) -> list[Path]:
    """The captures of ``run:<run_id>``'s finished sessions (local copies of remote ones)."""
    from exporter.analysis.report.document import capture_paths
    from exporter.analysis.sides.load import SideContext

    if per_step:  # the run's sessions follow each other: their per-step graphs do not add
        raise ConfigError(f"{spec}: --per-step reads one session; give its id")
    paths, _ = capture_paths(spec, SideContext(store=store))
    return paths


@main.command("memory-profile")
@settings_options
@click.option(
    "--wait", "wait_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
    help="Seconds to wait for the workload's answer (0 = do not wait).",
)  # fmt: skip
def memory_profile(
    config_file: Path | None,
    listen: str | None,
    shared_dir: str | None,
    store: str | None,
    wait_s: float,
) -> None:
    """Ask the workload (SDK) for a device-memory profile in the shared dir."""
    from exporter.capture.targets import LIVE_HEARTBEAT_S
    from exporter.pipeline.memory_watcher import answers_to, request_memory_profile

    settings = _settings(config_file, listen=listen, shared_dir=shared_dir, store=store)
    live = _live_step_logs(settings.shared_dir)
    if not live and wait_s:
        # Said at once: the wait would only end in "no answer" (it took 30 s of silence).
        raise MlprofError(
            f"no live workload in {settings.shared_dir}: no step log written there in the "
            f"last {LIVE_HEARTBEAT_S:g}s (start a workload using the SDK with MLPROF_SHARED_DIR="
            f"{settings.shared_dir}, or give --wait 0 to leave a request for one)"
        )
    request_id = request_memory_profile(settings.shared_dir)
    click.echo(f"requested memory profile {request_id} in {settings.shared_dir}", err=True)
    if not wait_s:
        if not live:
            click.echo("no live workload yet: the request waits for one that starts", err=True)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    click.echo(f"waiting up to {wait_s:g}s for {', '.join(live)} to answer", err=True)
    with Progress(
        TextColumn("[bold]memory profile"), BarColumn(), TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(), transient=True, console=Console(stderr=True),
    ) as progress:  # fmt: skip
        task = progress.add_task("wait", total=wait_s, state="waiting for the workload")
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < wait_s:
            found = answers_to(settings.shared_dir, request_id)
            if found:
                break
            progress.update(task, completed=elapsed, state=f"{elapsed:.0f}/{wait_s:g}s")
            time.sleep(0.25)
        else:
            found = []
    for path in found:
        click.echo(str(path))
    if not found:
        raise MlprofError(
            f"no answer to memory-profile request {request_id} within {wait_s:g}s from "
            f"{', '.join(live)}: does the workload run JAX with the SDK's memory profiles on?"
        )


def _live_step_logs(shared_dir: Path) -> list[str]:
    """The step logs in ``shared_dir`` written in the last ``LIVE_HEARTBEAT_S`` seconds.

    The SDK's heartbeat is its step log's modification time, as local discovery reads it.
    """
    from exporter import schema
    from exporter.capture.targets import LIVE_HEARTBEAT_S

    now = time.time()
    try:
        logs = sorted((shared_dir / schema.STEPS_DIR).glob(f"*{schema.STEP_LOG_SUFFIX}"))
    except OSError:
        return []
    live = []
    for path in logs:
        with contextlib.suppress(OSError):
            if now - path.lstat().st_mtime <= LIVE_HEARTBEAT_S:  # lstat: a link beats not
                live.append(path.name)
    return live


@main.command("fake-tpu")
@click.option(
    "--chips", type=click.IntRange(1, 4096), default=None, help="Number of chips [default: 4]."
)
@click.option(
    "--listen", default="127.0.0.1:8431", show_default=True,
    envvar="MLPROF_FAKE_TPU_LISTEN", help="gRPC address of the fake runtime.",
)  # fmt: skip
@click.option(
    "--script", "script_file", type=click.Path(path_type=Path, dir_okay=False),
    help="YAML/JSON file of per-chip values over time (see exporter/faketpu.py).",
)  # fmt: skip
@click.option(
    "--basic", is_flag=True,
    help="Serve only duty cycle, HBM and tensor-core utilisation, like an older libtpu.",
)  # fmt: skip
def fake_tpu(chips: int | None, listen: str, script_file: Path | None, basic: bool) -> None:
    """Serve libtpu's runtime-metrics gRPC service with scripted values (no TPU needed)."""
    import signal
    import threading

    from exporter.faketpu import BASIC_METRICS, FakeTpuRuntime, default_script, load_script

    script = load_script(script_file, chips) if script_file else default_script(chips or 4)
    fake = FakeTpuRuntime(script, listen, offered=BASIC_METRICS if basic else None).start()
    click.echo(
        f"mlprof fake-tpu: {script.chips} chips on {fake.addr} "
        f"(point the sidecar at it: MLPROF_TPU_METRICS_ADDR={fake.addr}); Ctrl-C stops\n"
        + fake.table()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop(grace_s=1.0)


# Capture commands live beside the capture API client (capture, snapshot, sessions,
# targets), analysis commands beside the analysis (compare, analyze, baseline); _Group
# registers both when they are first looked up.

if __name__ == "__main__":
    main()
