"""A new user's first hour (issue 11 C): what `make demo` shows, help texts, one-line
errors, commands printed so that they run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from exporter.cli import main
from tests.harness import ROOT


def test_first_make_demo_install_shows_progress(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "-n", "-B", f"{venv}/.installed-demo", f"VENV={venv}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    install = next(i for i, line in enumerate(lines) if "pip install" in line and "-e" in line)
    assert " -q" not in lines[install], "pip -q kept the first install silent for a minute"
    assert "echo" in lines[install - 1] and "about a minute" in lines[install - 1]


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


@pytest.mark.parametrize("path", [["capture"], ["snapshot", "take"], ["sessions"], ["targets"]])
def test_every_capture_option_is_described(path: list[str]) -> None:
    command: click.Command | None = main
    ctx = click.Context(main)
    for name in path:
        assert isinstance(command, click.Group)
        command = command.get_command(ctx, name)  # capture commands register lazily
    assert command is not None
    undescribed = [o.opts[-1] for o in _options(command) if not o.help]
    assert undescribed == [], f"mlprof {' '.join(path)}: no help for {undescribed}"


def test_since_that_is_not_a_time_is_one_line_and_exit_2() -> None:
    # No sidecar needed: the value is checked before any request.
    result = CliRunner().invoke(
        main, ["sessions", "--since", "yesterday", "--url", "http://127.0.0.1:9"]
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("Error: Invalid value for '--since': 'yesterday' is not an ISO")
    assert "pydantic" not in result.output and "{" not in result.output


def test_the_printed_mlprof_command_runs_from_the_users_shell(tmp_path: Path) -> None:
    """`make demo` does not activate the venv: the banner names a path that runs."""
    clean_path = "/usr/bin:/bin"  # no venv on PATH, as in a fresh terminal
    env = {**os.environ, "PATH": clean_path, "PYTHONPATH": str(ROOT)}
    command = subprocess.run(
        [sys.executable, "-c", "from exporter.cli import _mlprof_command as c; print(c())"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    assert command != "mlprof"
    ran = subprocess.run(
        f"{command} --version", shell=True, cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("mlprof ") and "decoder" in ran.stdout
    from exporter.cli import _mlprof_command

    assert _mlprof_command()  # in-process too


def test_flamegraph_says_its_total_in_readable_units_and_that_threads_add_up(
    tmp_path: Path,
) -> None:
    from exporter.proto import xplane_pb2
    from tests.xspace_builder import PlaneBuilder

    space = xplane_pb2.XSpace()
    host = PlaneBuilder(space, "/host:CPU")
    for thread in ("python", "tf_XLAPjRtCpuClient/7"):
        host.event(host.line(thread), "work", 0, 1_500_000)  # 1.5 ms on each, at once
    capture = tmp_path / "vm.xplane.pb"
    capture.write_bytes(space.SerializeToString())
    done = CliRunner().invoke(main, ["flamegraph", str(capture), "-o", str(tmp_path / "f.txt")])
    assert done.exit_code == 0, done.output
    # Was "total 3000000 nanoseconds": raw, and twice the 1.5 ms the capture lasted.
    assert "total 3.000 ms = 3000000 nanoseconds, summed over 2 concurrent threads" in done.output


def test_every_suggested_xprof_command_says_it_listens_on_every_interface() -> None:
    # XProf (server.py: run_server(plugin, _get_wildcard_address(port)), gRPC on 0.0.0.0)
    # has no bind option: where we suggest it, the reader is told.
    for doc in (ROOT / "README.md", ROOT / "docs" / "capture.md"):
        lines = doc.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            if "xprof --logdir" in line:
                near = " ".join(lines[index : index + 3])
                assert "every interface" in near, f"{doc.name}:{index + 1}: {line}"


def test_memory_profile_without_a_live_workload_says_so_at_once(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "steps").mkdir(parents=True)
    stale = shared / "steps" / "vm-1.jsonl"
    stale.write_text("")
    os.utime(stale, (1.0, 1.0))  # a run that stopped long ago
    # Before: 5 s of silence here (30 s by default), then "no answer".
    done = CliRunner().invoke(main, ["memory-profile", "--shared-dir", str(shared), "--wait", "5"])
    assert done.exit_code == 1
    assert done.output.startswith(f"mlprof: no live workload in {shared}: no step log written")
    requests = shared / "requests"
    assert not requests.exists() or not any(requests.iterdir())  # no request left behind


def test_memory_profile_waits_for_a_live_workload_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    (shared / "steps").mkdir(parents=True)
    (shared / "steps" / "vm-42.jsonl").write_text("")  # written just now: live
    answer = shared / "memory" / "vm-42.pprof.gz"
    calls = []

    def answers_to(directory: Path, request_id: str) -> list[Path]:
        calls.append(request_id)
        return [answer] if len(calls) >= 3 else []

    monkeypatch.setattr("exporter.pipeline.memory_watcher.answers_to", answers_to)
    done = CliRunner().invoke(main, ["memory-profile", "--shared-dir", str(shared)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("requested memory profile ")
    assert lines[1] == "waiting up to 30s for vm-42.jsonl to answer"
    assert lines[-1] == str(answer)


def test_stopping_the_demo_forwards_sigint_to_its_workload_at_once() -> None:
    from exporter.cli import _stop_workload

    # A workload that says which signal stopped it, as the demo's does on SIGINT/SIGTERM.
    child = (
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    print(signal.Signals(signum).name, flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGINT, stop); signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    workload = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
    assert workload.stdout is not None
    assert workload.stdout.readline() == b"ready\n"
    _stop_workload(workload)  # `kill -INT <demo pid>`: the workload got no signal itself
    # Before: nothing for a 10 s grace, then SIGTERM.
    assert workload.stdout.read() == b"SIGINT\n"
    assert workload.wait() == 0
