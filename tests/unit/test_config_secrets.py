"""Credentials in a mistyped URL are never echoed (issue 11 A.9)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config import load_settings
from exporter.errors import ConfigError
from tests.harness import ROOT


@pytest.mark.parametrize(
    "url",
    ["htp://alice:s3cret@pyroscope:4040", "alice:s3cret@pyroscope:4040",
     "ftp://alice:s3cret@pyroscope", "http:/alice:s3cret@pyroscope"],
)  # fmt: skip
def test_a_bad_pyroscope_url_is_reported_without_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(pyroscope_url=url)
    message = str(caught.value)
    assert "s3cret" not in message and "alice" not in message
    assert message.startswith("MLPROF_PYROSCOPE_URL=")
    assert "***@pyroscope" in message


def test_the_cli_line_has_no_password(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "serve"],
        env={"MLPROF_PYROSCOPE_URL": "htp://alice:s3cret@pyro:4040", "PATH": "/usr/bin:/bin",
             "PYTHONPATH": str(ROOT)},  # this checkout's code, whatever is installed
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "s3cret" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def test_redaction_keeps_the_rest_of_the_url() -> None:
    from exporter.config import redact_url

    assert redact_url("https://u:p@host:4040/path") == "https://***@host:4040/path"
    assert redact_url("http://host:4040") == "http://host:4040"
