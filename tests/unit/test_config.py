"""Settings: defaults, environment, YAML, precedence, and one-line errors with exit 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.cli import main
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
    config.write_text("listen: 127.0.0.1:9000\ncollect_interval_s: 2\ntargets: a:1,b:2\n")
    monkeypatch.setenv("MLPROF_COLLECT_INTERVAL_S", "3")
    settings = load_settings(config, shared_dir="/x")
    assert settings.listen == "127.0.0.1:9000"  # from the file
    assert settings.collect_interval_s == 3.0  # environment beats the file
    assert settings.shared_dir == Path("/x")  # an override beats both
    assert settings.targets == ["a:1", "b:2"]


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


def test_invalid_yaml_is_one_line_with_its_position(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: 127.0.0.1:1\ntargets: [a:1\n")
    with pytest.raises(ConfigError) as err:
        load_settings(bad)
    text = str(err.value)
    assert len(text.splitlines()) == 1, text  # PyYAML's own message takes 5-8 lines
    assert text.startswith(f"config file {bad}: not valid YAML (line ")
    assert "column" in text


def test_a_bad_value_in_the_file_is_named_as_typed_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLPROF_COLLECT_INTERVAL_S", raising=False)
    config = tmp_path / "mlprof.yaml"
    config.write_text("collect_interval_s: -3\n")
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert str(err.value).startswith(f"collect_interval_s=-3 in {config}: ")
    assert "MLPROF_" not in str(err.value)
    # The same value from the environment is named as the variable.
    monkeypatch.setenv("MLPROF_COLLECT_INTERVAL_S", "-4")
    with pytest.raises(ConfigError, match=r"^MLPROF_COLLECT_INTERVAL_S='-4': "):
        load_settings(config)
    # And from the command line as the option.
    with pytest.raises(ConfigError, match=r"^--listen='nope': expected HOST:PORT"):
        load_settings(config, listen="nope", collect_interval_s=None)


def test_a_yaml_key_in_environment_form_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "mlprof.yaml"
    config.write_text("MLPROF_TARGETS: a:1\n")
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert str(err.value) == (
        f"config file {config}: 'MLPROF_TARGETS' is an environment variable's name; "
        "write the option as 'targets'"
    )


@pytest.mark.parametrize("value", ["not-an-address", "h:1,b", "bad_name!:80"])
def test_a_target_that_is_not_host_and_port_is_refused_at_start(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLPROF_TARGETS", value)
    with pytest.raises(ConfigError) as err:  # printed as one line by the CLI, exit 2
        load_settings()
    assert err.value.exit_code == 2
    assert str(err.value).startswith(f"MLPROF_TARGETS={value!r}: expected HOST:PORT")
    assert len(str(err.value).splitlines()) == 1


def test_listen_in_use_is_named_as_the_option_typed(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--listen", f"127.0.0.1:{port}", "--shared-dir", str(tmp_path / "s")]
        result = CliRunner().invoke(main, [*args, "--store", str(tmp_path / "st")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"mlprof: --listen=127.0.0.1:{port}: cannot listen there (Address already in use)"
    ]
