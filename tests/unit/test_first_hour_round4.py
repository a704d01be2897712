"""Issue 31, a new user's first hour (items 10-13): what the first pages and errors say."""

from __future__ import annotations

import socket
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from exporter.analysis.report.document import analyze
from exporter.analysis.report.render import _esc, report_html
from exporter.api.app import create_app
from exporter.cli import main
from exporter.config import load_settings, option_shown
from exporter.errors import ConfigError
from exporter.sidecar import Sidecar
from exporter.testing.synthetic import write_tpu_capture
from tests.harness import ROOT
from tests.sidecar_app import settings_in


def test_the_report_page_puts_the_findings_right_after_the_summary(tmp_path: Path) -> None:
    capture = tmp_path / "s" / "tpu-vm-0.xplane.pb"
    write_tpu_capture(capture, devices=1, steps=4, ops_per_step=40)
    report = analyze(str(capture.parent), xprof=False)
    assert report.findings, "precondition: the synthetic capture has a finding"
    page = report_html(report)
    summary, findings = page.index('id="summary"'), page.index('id="findings"')
    numbers = page.index("<h2>Key numbers</h2>")  # five detail tables, 2,300 px tall
    assert summary < findings < numbers
    assert findings < page.index(_esc(report.findings[0].impact)) < numbers


class _InterruptedSidecar:
    """Starts a session, then the user presses Ctrl-C while the command polls it."""

    base_url = "http://127.0.0.1:9464"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"session_id": "s-123", "status_url": "/api/v1/captures/s-123",
                "targets": [{"address": "vm:9999"}], "options": {"duration_ms": 2000}}  # fmt: skip

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        raise KeyboardInterrupt


def test_ctrl_c_during_capture_says_the_session_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("exporter.cli_capture._client", lambda *a: _InterruptedSidecar())
    done = CliRunner().invoke(main, ["capture"])
    assert done.exit_code == 130
    assert "Aborted!" not in done.output  # all click said before
    assert done.output.strip().endswith(
        "mlprof: stopped waiting; session s-123 continues in the sidecar and is stored when it "
        "ends: http://127.0.0.1:9464/api/v1/captures/s-123"
    )


def test_a_port_in_use_by_default_is_not_blamed_on_a_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.cli import _check_startup

    monkeypatch.delenv("MLPROF_LISTEN", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # As serve meets it when the default address is taken: nobody typed the value.
        settings = load_settings(shared_dir=str(tmp_path / "s"), store=str(tmp_path / "st"))
        settings = settings.model_copy(update={"listen": f"127.0.0.1:{port}"})
        with pytest.raises(ConfigError) as caught:
            _check_startup(settings)
    assert str(caught.value) == (
        f"127.0.0.1:{port} (the default listen; set --listen or MLPROF_LISTEN): cannot listen "
        "there (Address already in use)"
    )  # was "MLPROF_LISTEN=127.0.0.1:...", a variable the user never set
    assert option_shown("listen", "h:1", overrides={"listen": "h:1"}) == "--listen=h:1"
    monkeypatch.setenv("MLPROF_LISTEN", "h:1")
    assert option_shown("listen", "h:1") == "MLPROF_LISTEN=h:1"


def test_a_json_trace_is_said_to_look_like_json(tmp_path: Path) -> None:
    # Chrome's array form: JSON, but no torch.profiler trace (those are read as such).
    trace = tmp_path / "trace.json"
    trace.write_text('[{"name": "step", "ph": "X", "ts": 0, "dur": 5}]')
    done = CliRunner().invoke(main, ["analyze", str(trace), "--no-xprof"])
    assert done.exit_code == 1
    assert done.output.strip() == (
        f"mlprof: {trace}: looks like JSON (a Chrome/Kineto trace?), not an XProf capture "
        "(*.xplane.pb or *.xplane.riegeli)"
    )  # was "not an XProf capture (field 15 at byte 0 has wire type 3)"


def test_an_unknown_config_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    config = tmp_path / "mlprof.yaml"
    config.write_text("colect_interval_s: 5\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert str(caught.value) == (
        f"config file {config}: unknown option 'colect_interval_s' "
        "(did you mean 'collect_interval_s'?)"
    )
    config.write_text("zzzz: 5\n")
    with pytest.raises(ConfigError, match=r"unknown option 'zzzz'$"):
        load_settings(config)


def test_a_payload_that_is_not_alertmanagers_warns_of_nothing_deprecated(tmp_path: Path) -> None:
    app = create_app(Sidecar(settings_in(tmp_path)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post("/api/v1/alertmanager", json={"alerts": "no"})
    assert answer.status_code == 422
    assert not [w for w in caught if "HTTP_422" in str(w.message)]


def test_the_readme_says_what_make_test_needs_and_what_the_demo_does_not_do() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "needs root" in readme and "npm registry" in readme
    # `make demo` runs no Prometheus: no alert can fire there.
    assert "Kept up for 15 minutes, the `MLWorkloadInputBound` alert fires." not in readme
    assert "`make demo` runs no Prometheus" in readme
    # A step's cost as the ratio the bench prints, not an absolute a busy machine breaks.
    assert "costs under 2 µs" not in readme and "times an empty\n`with` block" in readme


@pytest.mark.parametrize(
    "command",
    [
        ["analyze", "no-such.xplane.pb", "--format", "html"],
        ["compare", "no-such-a.xplane.pb", "no-such-b.xplane.pb", "--format", "html"],
        ["flamegraph", "no-such.xplane.pb", "--format", "html"],
    ],
)
def test_a_page_is_never_dumped_on_a_terminal(command: list[str]) -> None:
    """`analyze --format html` without -o wrote the whole page over the terminal. Now a
    usage error says to give -o, before any input is read (the missing file is not what
    it answers)."""
    import os
    import subprocess
    import sys

    primary, secondary = os.openpty()  # stdout is a terminal, as a person's is
    try:
        done = subprocess.run(
            [sys.executable, "-m", "exporter.cli", *command],
            stdout=secondary, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            cwd=ROOT, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(secondary)
        os.close(primary)
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert (
        stderr.strip()
        == "mlprof: --format html writes a page: give -o FILE.html or redirect stdout"
    )
