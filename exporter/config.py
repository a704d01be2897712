"""Settings: one model, env prefix ``MLPROF_``, optional YAML file.

Precedence, highest first: command-line overrides, environment, YAML file, defaults.
Every default works on one machine with no cloud account.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from exporter.ascii_digits import parse_ascii_int
from exporter.errors import ConfigError
from exporter.heap import malloc_choice

__all__ = [
    "ALERT_CAPTURES",
    "ENV_PREFIX",
    "EVENT_SINKS",
    "MAX_ALERT_CAPTURES",
    "WILDCARD_LISTEN",
    "Settings",
    "load_settings",
    "option_shown",
    "option_source",
    "parse_hostport",
    "redact_url",
]

ENV_PREFIX = "MLPROF_"
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})
# Host headers answered by default (DNS rebinding: a page on attacker.example whose name
# later resolves to 127.0.0.1 sends ``Host: attacker.example``). IPv6 as in a Host header.
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]", "ip6-localhost")
WILDCARD_LISTEN = frozenset({"0.0.0.0", "::", "[::]", ""})
SOURCE_NAMES = frozenset({"auto", "tpu", "nvml", "jax"})
EVENT_SINKS = ("off", "log", "cloud-logging-structured", "cloud-logging-api")
# Captures an alert-triggered session takes (MLPROF_ALERT_CAPTURES), its time split among
# them. Measured (docs/analysis.md, "Replicates from the sidecar"): bench/alert_replicates.py,
# real JAX CPU processes at load 10-11 on 2 cores, 3 s a side and both sides split alike:
# three 1 s captures named an added op of 10 % of the step in 10-11 of 18 pairs per
# orientation, one 3 s capture in 3 of 18 (it held 4 steps, under the rank test's 5), no
# verdict in 30 unchanged orientations either way. But the automatic baseline is one
# session, and against one base capture the report compares one side each (a t test of
# 1 + N captures cannot name work that grew): the split then only costs step cycles, each
# capture's last losing the data phase after it. tests/e2e/test_alert_to_capture.py (input
# wait grown to 99 % of a 0.5 s step, a 4 s alert) named it with one capture, and missed
# it in 2 of 2 runs with three. So one by default; 3 where baselines have several.
ALERT_CAPTURES = 1
# Each capture is a replicate a report reads (and a profiling session on the workload).
MAX_ALERT_CAPTURES = 16


def parse_hostport(value: str, default_port: int | None = None) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[::1]:port``); raise ValueError naming what is wrong."""
    text = value.strip()
    if not text:
        raise ValueError("expected HOST:PORT, got an empty value")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"expected [IPv6]:PORT, got {value!r}")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
        elif ":" in host:
            raise ValueError(f"expected HOST:PORT (IPv6 in brackets), got {value!r}")
    if not host:
        raise ValueError(f"expected HOST:PORT with a host, got {value!r}")
    if not port_text:
        if default_port is None:
            raise ValueError(f"expected HOST:PORT with a port, got {value!r}")
        return host, default_port
    port = parse_ascii_int(port_text)
    if port is None or not 0 < port < 65536:
        raise ValueError(f"expected a port 1-65535, got {port_text!r} in {value!r}")
    return host, port


def redact_url(text: str) -> str:
    """``text`` with any ``user:password@`` of a URL in it replaced by ``***@``."""
    return _USERINFO_RE.sub(r"\1***@", text)


# user[:password]@ at the start of a word or after a slash: also a mistyped scheme
# (htp:/alice:pw@host) or none at all (alice:pw@host) is caught.
_USERINFO_RE = re.compile(r"(^|[\s'\"/(])[^/@\s'\"]+@")


# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_HOSTNAME_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split_list(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Sidecar settings; each field is also ``MLPROF_<FIELD>`` in the environment.

    >>> Settings(listen="127.0.0.1:9500").listen_port
    9500
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, frozen=True
    )

    listen: str = Field("127.0.0.1:9464", description="HTTP address of /metrics and the API.")
    shared_dir: Path = Field(
        Path("./mlprof-data/shared"), description="Directory shared with the workload."
    )
    store: str = Field("./mlprof-data/store", description="Session store: a path or fsspec URL.")
    auth_token: SecretStr | None = Field(
        None, description="Bearer token for the API; required to listen off loopback."
    )
    metrics_auth: bool = Field(
        True, description="Require the token on /metrics too when one is set."
    )
    pyroscope_url: str | None = Field(None, description="Grafana Pyroscope base URL.")
    pyroscope_tenant: str | None = Field(
        None, description="Pyroscope tenant (X-Scope-OrgID) in multi-tenant mode."
    )
    pyroscope_user: str | None = Field(None, description="Pyroscope basic-auth user.")
    pyroscope_password: SecretStr | None = Field(
        None, description="Pyroscope basic-auth password (or Grafana Cloud token)."
    )
    spool_dir: Path = Field(
        Path("./mlprof-data/spool"),
        description="Profiles waiting for Pyroscope, kept across restarts.",
    )
    spool_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        le=1 << 40,
        description="Spool size limit; the oldest profiles are dropped (and counted) beyond.",
    )
    memory_profile_interval_s: float = Field(
        0.0,
        ge=0,
        le=86400,
        description="Seconds between device-memory profiles taken by the SDK (0 = off); "
        "read by the workload's SDK from the same MLPROF_ variable.",
    )
    max_profile_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1 << 20,
        le=1 << 34,
        description="Largest memory profile (pprof) read, uncompressed; a larger one, or a "
        "gzip inflating past it, is refused with one line (decompression bombs).",
    )
    max_profile_ratio: float = Field(
        200.0,
        ge=10,
        le=100_000,
        description="A gzip profile inflating more than this many times its size (past "
        "1 MiB) is refused.",
    )
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP endpoint for metrics push.")
    otlp_headers: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Extra OTLP request headers, key=value,... (over OTEL_EXPORTER_OTLP_HEADERS).",
    )
    otlp_interval_s: float = Field(
        15.0, gt=0, le=3600, description="How often metrics are pushed to the OTLP endpoint."
    )
    sources: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["auto"],
        description="Accelerator metric sources: auto, or a list of tpu, nvml, jax.",
    )
    tpu_metrics_addr: str = Field(
        "localhost:8431", description="libtpu runtime-metrics gRPC address (host:port)."
    )
    targets: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Static profiler targets, host:port,..."
    )
    local_targets_host: str = Field(
        "127.0.0.1",
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="Host at which the shared directory's runs serve their profiler "
        "ports (the workload's service name when it runs in another container).",
    )
    collect_interval_s: float = Field(
        5.0, gt=0, le=3600, description="How often sources are read and step logs tailed."
    )
    duty_cycle_window_s: float = Field(
        60.0, gt=0, le=3600, description="Window of the step-log duty-cycle estimate."
    )
    series_ttl_s: float = Field(
        900.0, gt=0, description="Drop a run's series after this long without a step."
    )
    max_runs: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Runs (run, workload, host) with series at once; lines of further runs "
        "are dropped and counted (mlprof_runs_dropped_total) until one expires. About 1 KB "
        "of /metrics per run: 20,000 runs made 18.9 MB and 3.5 s per scrape.",
    )
    alert_cooldown_s: float = Field(
        600.0, ge=0, le=86400, description="Alert-triggered captures of one run at most this often."
    )
    alert_dedup_window_s: float = Field(
        3600.0,
        ge=0,
        le=7 * 86400,
        description="An alert fingerprint starts at most one capture within this window.",
    )
    alert_max_concurrent: int = Field(
        2, ge=1, le=1000, description="Alert-triggered capture sessions running at once, at most."
    )
    alert_captures: int = Field(
        ALERT_CAPTURES,
        ge=1,
        le=MAX_ALERT_CAPTURES,
        description="Captures an alert-triggered session takes one after another, its "
        "duration split among them, so that its report compares replicates with the "
        "baseline's (1: one capture, no measured between-capture noise).",
    )
    alert_max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest Alertmanager webhook body accepted (413 beyond).",
    )
    capture_logdir: Path | None = Field(
        None,
        description="Directory the profiler server writes captures into, as the workload "
        "sees it (mount it at the same path in the sidecar); captures are then moved into "
        "the store. Default: <shared_dir>/captures.",
    )
    capture_max_duration_ms: int = Field(
        60_000, ge=1, le=3_600_000, description="Longer capture requests are clamped to this."
    )
    capture_max_delay_ms: int = Field(
        60_000, ge=0, le=3_600_000, description="Longer capture delays are clamped to this."
    )
    capture_max_host_tracer_level: int = Field(
        3, ge=0, le=3, description="Highest host tracer level a capture may use (0-3)."
    )
    capture_max_device_tracer_level: int = Field(
        1, ge=0, le=1, description="Highest device tracer level a capture may use (0-1)."
    )
    capture_max_python_tracer_level: int = Field(
        1, ge=0, le=1, description="Highest Python tracer level a capture may use (0-1)."
    )
    capture_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Per-target time allowed beyond delay + duration."
    )
    capture_concurrency: int = Field(
        16, ge=1, le=1024, description="Targets captured at once in a fan-out."
    )
    capture_retention_count: int = Field(
        200, ge=0, description="Sessions kept in the store, oldest deleted first (0 = all)."
    )
    capture_retention_bytes: int = Field(
        0, ge=0, description="Bytes of sessions kept in the store (0 = no limit)."
    )
    profiler_port: int = Field(
        9999, ge=1, le=65535, description="Profiler port of targets found by DNS or k8s."
    )
    discovery_dns: str | None = Field(
        None, description="DNS name whose A/AAAA records are targets (a headless Service)."
    )
    discovery_k8s_selector: str | None = Field(
        None, description="Label selector of workload pods to capture (in-cluster only)."
    )
    discovery_k8s_namespace: str | None = Field(
        None, description="Namespace of those pods (default: the sidecar's own)."
    )
    discovery_interval_s: float = Field(
        15.0, gt=0, le=3600, description="How often targets are discovered and probed."
    )
    snapshot_mode: str = Field(
        "auto",
        description="Snapshots: continuous (XProf continuous profiling, TPU), ring (short "
        "periodic captures) or auto (continuous on TPU targets, else ring).",
    )
    snapshot_interval_s: float = Field(
        30.0, gt=0, le=86400, description="Ring mode: seconds between short captures."
    )
    snapshot_duration_ms: int = Field(
        2000, ge=100, le=600_000, description="Ring mode: length of each short capture."
    )
    snapshot_max_count: int = Field(
        4, ge=1, le=1000, description="Ring mode: captures kept per target."
    )
    snapshot_max_bytes: int = Field(
        1 << 30, ge=1 << 20, description="Ring mode: bytes kept over all targets."
    )
    reports: bool = Field(
        True, description="Write analysis.json and summary.html into every finished session."
    )
    report_timeout_s: float = Field(
        300.0, gt=0, le=3600, description="Longest one session's analysis may run."
    )
    report_max_memory_mb: int = Field(
        4096, ge=256, le=1 << 20, description="Address-space limit of one analysis (MiB)."
    )
    memory_limit_mb: int | None = Field(
        None,
        ge=256,
        le=1 << 22,
        description="Memory the sidecar's bounded children reserve together (MiB); a child "
        "waits for its share. Unset: the cgroup's memory limit less 512 MiB for the sidecar, "
        "else 8192 (exporter/sandbox.py).",
    )
    report_xprof: bool = Field(
        True, description="Cross-check reports with XProf's converters when installed."
    )
    # XProf's converters take about 20x a capture's size in memory: the default keeps
    # them near 3 GB, inside report_max_memory_mb's 4 GiB (xprof_tools.XPROF_MAX_CAPTURE_MB).
    report_xprof_max_capture_mb: float = Field(
        150,
        gt=0,
        le=1 << 21,
        description="No XProf converter runs on a capture larger than this (MB, a session's "
        "files together): its XProf facts say so.",
    )
    grafana_url: str | None = Field(
        None, description="Grafana base URL that reports link to (dashboard, Pyroscope)."
    )
    log_level: str = Field("info", description="debug, info, warning or error.")
    ingest_max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=1 << 30,
        description="Largest profile upload the Pyroscope ingest endpoints accept (413 beyond).",
    )
    events: str = Field(
        "off",
        description="Where run events go: off, log (JSON lines on stderr), "
        "cloud-logging-structured (GKE's structured stdout) or cloud-logging-api.",
    )
    events_project: str | None = Field(
        None, description="Google Cloud project of the events (default: the credentials')."
    )
    events_log_name: str = Field(
        "mlprof-events", description="Cloud Logging log name of the events (API form)."
    )
    events_queue_size: int = Field(
        1000, ge=1, le=1_000_000, description="Events waiting for the Logging API, at most."
    )
    events_api_endpoint: str | None = Field(
        None, description="Logging API endpoint (default Google's), e.g. a private one."
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the HTTP server answers to (the Host header), host,...; "
        "*.example.com and * allowed. Default without a token: the loopback names and "
        "the listen address; with a token: any (the token guards).",
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_hostport(value)
        return value

    @field_validator("targets", mode="before")
    @classmethod
    def _split_targets(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, value: list[str]) -> list[str]:
        # A port is required: a bare word (``not-an-address``) is more often a typo than a
        # host whose profiler listens on the default port, and accepting it only showed up
        # later as an unreachable ``not-an-address:9999``.
        for item in value:
            host, _ = parse_hostport(item)
            if not _HOSTNAME_RE.fullmatch(host) and not _is_ip(host):
                raise ValueError(f"expected HOST:PORT with a DNS name or IP, got {item!r}")
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            if host != "*" and ("*" in host[1:] or (host[0] == "*" and not host[:2] == "*.")):
                raise ValueError(f"expected host names or *.domain patterns, got {host!r}")
            if "/" in host or " " in host:
                raise ValueError(f"expected host names without scheme or path, got {host!r}")
        return [host.lower() for host in value]

    @field_validator("sources", mode="before")
    @classmethod
    def _split_sources(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("sources")
    @classmethod
    def _check_sources(cls, value: list[str]) -> list[str]:
        names = [item.lower() for item in value] or ["auto"]
        unknown = [n for n in names if n not in SOURCE_NAMES]
        if unknown:
            raise ValueError(f"expected auto or a list of tpu, nvml, jax, got {unknown[0]!r}")
        if "auto" in names and len(names) > 1:
            raise ValueError("'auto' cannot be combined with named sources")
        return list(dict.fromkeys(names))

    @field_validator("tpu_metrics_addr")
    @classmethod
    def _check_tpu_addr(cls, value: str) -> str:
        parse_hostport(value)
        return value

    @field_validator("otlp_headers", mode="before")
    @classmethod
    def _split_headers(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        headers = {}
        for part in _split_list(value):
            key, sep, val = part.partition("=")
            if not sep or not key.strip():
                raise ValueError("expected key=value,... (a part has no key or no '=')")
            headers[key.strip().lower()] = val.strip()
        return headers

    @field_validator("pyroscope_url", "otlp_endpoint", "events_api_endpoint")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {redact_url(value)!r}")
        return value.rstrip("/")

    @field_validator("snapshot_mode")
    @classmethod
    def _check_snapshot_mode(cls, value: str) -> str:
        mode = value.lower()
        if mode not in {"auto", "continuous", "ring"}:
            raise ValueError(f"expected auto, continuous or ring, got {value!r}")
        return mode

    @field_validator("discovery_dns", "discovery_k8s_selector", "discovery_k8s_namespace")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("events")
    @classmethod
    def _check_events(cls, value: str) -> str:
        kind = value.strip().lower()
        if kind not in EVENT_SINKS:
            raise ValueError(f"expected one of {', '.join(EVENT_SINKS)}, got {value!r}")
        return kind

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"debug", "info", "warning", "error"}:
            raise ValueError(f"expected debug, info, warning or error, got {value!r}")
        return level

    @model_validator(mode="after")
    def _loopback_unless_token(self) -> Settings:
        host, _ = parse_hostport(self.listen)
        if not is_loopback(host) and not self.token:
            raise ValueError(
                f"listening on {host} (not loopback) needs an auth token: "
                f"set {ENV_PREFIX}AUTH_TOKEN or listen on 127.0.0.1"
            )
        return self

    @property
    def listen_host(self) -> str:
        return parse_hostport(self.listen)[0]

    @property
    def trusted_hosts(self) -> list[str]:
        """``allowed_hosts``, or the default: loopback names and the listen address."""
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        host = self.listen_host.lower()
        if self.token or host in WILDCARD_LISTEN:
            # With a token (required off loopback) the token guards: no page can send it,
            # and a scraper may use any name of the pod (IP, Service DNS name).
            return ["*"]
        own = f"[{host}]" if ":" in host else host
        return list(dict.fromkeys([*DEFAULT_ALLOWED_HOSTS, own]))

    @property
    def listen_port(self) -> int:
        return parse_hostport(self.listen)[1]

    @property
    def token(self) -> str | None:
        """The auth token in clear, or None when unset or blank.

        Surrounding whitespace is dropped: a Kubernetes Secret made from a file often
        ends in a newline, and no client would send it.
        """
        if self.auth_token is None:
            return None
        return self.auth_token.get_secret_value().strip() or None


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({_yaml_problem(exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of option: value")
    for key in data:
        name = str(key)
        if name.upper().startswith(ENV_PREFIX):
            raise ConfigError(
                f"config file {path}: {name!r} is an environment variable's name; "
                f"write the option as {name[len(ENV_PREFIX) :].lower()!r}"
            )
    return {str(key): val for key, val in data.items()}


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what is wrong and where (its str() takes 5-8 lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}{problem}" if problem else " ".join(str(exc).split())
    return " ".join(text.split())


# Settings the CLI takes as flags (``mlprof serve --listen ...``); any other override is
# programmatic (tests, library use) and is named by its environment variable.
CLI_FLAGS = frozenset({"listen", "shared_dir", "store"})
# What option_source answers for a setting nobody typed (flag, variable or file).
DEFAULT_SOURCE = "the default"


def option_source(
    field: str, config_file: Path | None = None, overrides: dict[str, Any] | None = None
) -> str:
    """Where the value of ``field`` was typed: ``--listen``, ``MLPROF_LISTEN`` or
    ``listen in FILE`` (the same precedence as :func:`load_settings`), or
    :data:`DEFAULT_SOURCE` when nobody typed it."""
    if overrides and overrides.get(field) is not None and field in CLI_FLAGS:
        return f"--{field.replace('_', '-')}"
    env_name = f"{ENV_PREFIX}{field.upper()}"
    if any(key.upper() == env_name for key in os.environ):
        return env_name
    if config_file is not None and field in _yaml_keys(config_file):
        return f"{field} in {config_file}"
    if overrides and overrides.get(field) is not None:  # given by code: its variable's name
        return env_name
    return DEFAULT_SOURCE


def option_shown(
    field: str, value: object, config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> str:  # fmt: skip
    """``--listen=VALUE``, ``MLPROF_LISTEN=VALUE``, ``listen=VALUE in FILE``, or for a
    default ``VALUE (the default listen; set --listen or MLPROF_LISTEN)``: an error names
    what the user typed, never a variable nobody set."""
    source = option_source(field, config_file, overrides)
    if source == DEFAULT_SOURCE:
        flag = f"--{field.replace('_', '-')} or " if field in CLI_FLAGS else ""
        return f"{value} (the default {field}; set {flag}{ENV_PREFIX}{field.upper()})"
    name, _, in_file = source.partition(" in ")
    return f"{name}={value}" + (f" in {in_file}" if in_file else "")


def _yaml_keys(config_file: Path) -> set[str]:
    try:
        return set(_read_yaml(config_file))
    except ConfigError:
        return set()


def _describe(error: Any, config_file: Path | None, overrides: dict[str, Any]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    field = loc[0] if loc else ""
    msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        where = f"config file {config_file}" if config_file else "settings"
        close = difflib.get_close_matches(field, Settings.model_fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{where}: unknown option {field!r}{hint}"
    if not field:
        return msg
    value = error.get("input")
    shown = "" if isinstance(value, dict) or value is None else f"={value!r}"
    if field in ("auth_token", "otlp_headers", "pyroscope_password"):  # may hold credentials
        shown = ""
    elif isinstance(value, str):  # a URL may carry user:password@
        shown = f"={redact_url(value)!r}"
    source = option_source(field, config_file, overrides)
    if source == DEFAULT_SOURCE:  # a default is valid: only code passing a value lands here
        source = f"{ENV_PREFIX}{field.upper()}"
    name, _, in_file = source.partition(" in ")
    return f"{name}{shown}{' in ' + in_file if in_file else ''}: {msg}"


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from overrides, environment, an optional YAML file and defaults.

    Raises ConfigError with one line per bad option.
    """
    yaml_data = _read_yaml(config_file) if config_file else {}
    cleaned = {key: val for key, val in overrides.items() if val is not None}

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, _YamlSource(settings_cls, yaml_data)

    try:
        loaded = _Loaded(**cleaned)
    except ValidationError as exc:
        lines = [_describe(err, config_file, cleaned) for err in exc.errors()]
        raise ConfigError("; ".join(lines)) from None
    malloc_choice()  # not a setting, but the children `serve` starts read it: refuse it now
    return Settings.model_construct(**dict(loaded))
