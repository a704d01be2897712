"""Settings: defaults, environment, YAML, precedence, and one-line errors with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config import load_settings, parse_hostport
from exporter.errors import ConfigError


def test_defaults_work_on_one_machine() -> None:
    settings = load_settings()
    assert settings.listen == "127.0.0.1:9464"
    assert settings.shared_dir == Path("mlprof-data/shared")
    assert settings.store == "./mlprof-data/store"
    assert settings.token is None
    assert settings.pyroscope_url is None and settings.otlp_endpoint is None


def test_environment_and_yaml_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "mlprof.yaml"
    config.write_text("listen: 127.0.0.1:9000\ncollect_interval_s: 2\nMLPROF_TARGETS: a:1,b\n")
    monkeypatch.setenv("MLPROF_COLLECT_INTERVAL_S", "3")
    settings = load_settings(config, shared_dir="/x")
    assert settings.listen == "127.0.0.1:9000"  # from the file
    assert settings.collect_interval_s == 3.0  # environment beats the file
    assert settings.shared_dir == Path("/x")  # an override beats both
    assert settings.targets == ["a:1", "b"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"MLPROF_LISTEN": "nonsense"}, "MLPROF_LISTEN='nonsense': expected HOST:PORT"),
        ({"MLPROF_LISTEN": "127.0.0.1:99999"}, "expected a port 1-65535"),
        ({"MLPROF_COLLECT_INTERVAL_S": "soon"}, "MLPROF_COLLECT_INTERVAL_S='soon'"),
        ({"MLPROF_COLLECT_INTERVAL_S": "0"}, "greater than 0"),
        ({"MLPROF_PYROSCOPE_URL": "pyroscope:4040"}, "expected an http:// or https:// URL"),
        ({"MLPROF_TARGETS": "h:1,:2"}, "MLPROF_TARGETS"),
        ({"MLPROF_LISTEN": "0.0.0.0:9464"}, "set MLPROF_AUTH_TOKEN"),
    ],
)
def test_bad_values_name_the_option(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert expected in str(err.value)
    assert err.value.exit_code == 2


def test_non_loopback_with_token_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLPROF_LISTEN", "0.0.0.0:9464")
    monkeypatch.setenv("MLPROF_AUTH_TOKEN", "s3cret")
    settings = load_settings()
    assert settings.token == "s3cret"
    assert "s3cret" not in repr(settings)  # never logged by accident


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_settings(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("lisen: 127.0.0.1:1\n")
    with pytest.raises(ConfigError, match=r"unknown\.yaml: unknown option 'lisen'"):
        load_settings(unknown)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h:1", ("h", 1)),
        ("[::1]:9", ("::1", 9)),
        ("h", ("h", 9999)),
        ("10.0.0.1:80", ("10.0.0.1", 80)),
    ],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text, default_port=9999) == expected


def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "serve"],
        env={"MLPROF_LISTEN": "0.0.0.0:1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("mlprof: listening on 0.0.0.0")
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
