"""Render the shipped Prometheus rules from one thresholds table.

``alerts/thresholds.yaml`` holds every threshold, window, ``for:`` and selector;
this module turns it into ``alerts/mlprof-rules.yaml`` (committed; a test re-renders
it and fails on any diff). Tests and sites change values without editing either file:

>>> text = render_rules({"alerts": {"MLWorkloadDutyCycleLow": {"for": "5s"}}})
>>> "for: 5s" in text
True

Command line (from the repository root)::

    python -m alerts.render                    # rewrite alerts/mlprof-rules.yaml
    python -m alerts.render --check            # exit 1 when the committed file is stale
    python -m alerts.render --overrides alerts/overrides/e2e.yaml -o /tmp/rules.yaml
    python -m alerts.render --prometheus-rule mlprof -o deploy/k8s/prometheusrule.yaml

:func:`render_alertmanager_config` gives the example Alertmanager config with a real
webhook URL and token, for tests and local stacks.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "ALERTMANAGER_EXAMPLE",
    "ALERT_NAMES",
    "RULES_FILE",
    "THRESHOLDS_FILE",
    "RuleConfigError",
    "build_rules",
    "load_overrides",
    "load_thresholds",
    "main",
    "merge_overrides",
    "render_alertmanager_config",
    "render_prometheus_rule",
    "render_rules",
    "write_or_check",
]

ALERTS_DIR = Path(__file__).resolve().parent
THRESHOLDS_FILE = ALERTS_DIR / "thresholds.yaml"
RULES_FILE = ALERTS_DIR / "mlprof-rules.yaml"
ALERTMANAGER_EXAMPLE = ALERTS_DIR / "alertmanager.example.yml"
WEBHOOK_RECEIVER = "mlprof-sidecar"

# Order of the alerts in the rendered file (and of the runbook's sections).
ALERT_NAMES: tuple[str, ...] = (
    "MLWorkloadDutyCycleLow",
    "MLWorkloadDutyCycleDrop",
    "MLWorkloadStepTimeRegression",
    "MLWorkloadStalled",
    "MLAcceleratorMemoryNearCapacity",
    "MLProfExporterDown",
    "MLProfProfilePushesFailing",
    "MLProfCapturesFailing",
    "MLAcceleratorThrottled",
    "MLAcceleratorXidErrors",
    "MLAcceleratorEccUncorrectable",
    "MLAcceleratorMemoryHeadroomLow",
    "MLAcceleratorInterconnectLatencyRegression",
    "MLWorkloadInputBound",
)
ACTIONS = ("capture", "snapshot")
SEVERITIES = ("critical", "warning", "info")
# Prometheus duration syntax (model.ParseDuration): units largest first, each once.
_DURATION_RE = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class RuleConfigError(ValueError):
    """A thresholds table or override that cannot be rendered; the message names the key."""


# -- the table -----------------------------------------------------------------------


def load_thresholds() -> dict[str, Any]:
    """The shipped thresholds table."""
    table = yaml.safe_load(THRESHOLDS_FILE.read_text(encoding="utf-8"))
    if not isinstance(table, dict):
        raise RuleConfigError(f"{THRESHOLDS_FILE}: expected a mapping at the top level")
    return table


def load_overrides(path: str | Path) -> dict[str, Any]:
    """An override table from a YAML file (same shape as ``thresholds.yaml``)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RuleConfigError(f"{path}: cannot read overrides: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RuleConfigError(f"{path}: expected a mapping of overrides, got {type(data).__name__}")
    return data


def merge_overrides(
    base: Mapping[str, Any], overrides: Mapping[str, Any] | None, path: str = ""
) -> dict[str, Any]:
    """``base`` with ``overrides`` deep-merged; unknown keys and wrong types are errors."""
    merged = copy.deepcopy(dict(base))
    for key, value in (overrides or {}).items():
        where = f"{path}.{key}" if path else str(key)
        if key not in merged:
            known = ", ".join(sorted(map(str, merged)))
            raise RuleConfigError(f"override {where!r}: unknown key (expected one of: {known})")
        current = merged[key]
        if isinstance(current, dict):
            if not isinstance(value, Mapping):
                raise RuleConfigError(f"override {where!r}: expected a mapping, got {value!r}")
            merged[key] = merge_overrides(current, value, where)
        elif current is not None and value is not None and not _same_kind(current, value):
            raise RuleConfigError(
                f"override {where!r}: expected {type(current).__name__} like {current!r}, "
                f"got {value!r}"
            )
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _same_kind(current: Any, value: Any) -> bool:
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(current, bool) and isinstance(value, bool)
    if isinstance(current, int | float):
        return isinstance(value, int | float)
    return isinstance(value, type(current))


# -- PromQL building blocks ----------------------------------------------------------


class _Exprs:
    """PromQL fragments over the exporter's metrics, with the table's selectors."""

    def __init__(self, selectors: Mapping[str, Any]) -> None:
        labels = selectors["run_labels"]
        if not labels or not all(isinstance(x, str) and _LABEL_RE.match(x) for x in labels):
            raise RuleConfigError(
                f"selectors.run_labels: expected a list of label names, got {labels!r}"
            )
        self.by = ", ".join(labels)
        self.extra = str(selectors["workload"] or "").strip().strip(",")
        self.job = str(selectors["exporter_job"]).strip()
        if not self.job:
            raise RuleConfigError(
                "selectors.exporter_job: expected a matcher like 'job=\"mlprof\"'"
            )

    def sel(self, metric: str, *matchers: str) -> str:
        parts = [m for m in (*matchers, self.extra) if m]
        return f"{metric}{{{', '.join(parts)}}}" if parts else metric

    def duty_cycle(self, window: str, offset: str | None = None) -> str:
        """Duty cycle per run/host: the hardware source where there is one, else the SDK's."""
        at = f"[{window}]" + (f" offset {offset}" if offset else "")
        hardware = self.sel("accelerator_duty_cycle", 'source!="sdk"')
        estimate = self.sel("accelerator_duty_cycle", 'source="sdk"')
        return (
            "(\n"
            f"  avg by ({self.by}) (avg_over_time({hardware}{at}))\n"
            "  or\n"
            f"  avg by ({self.by}) (avg_over_time({estimate}{at}))\n"
            ")"
        )

    def progressing(self, window: str) -> str:
        return f"(sum by ({self.by}) (rate({self.sel('train_steps_total')}[{window}])) > 0)"

    def alive(self) -> str:
        return f"(max by ({self.by}) ({self.sel('mlprof_workload_up')}) == 1)"

    def step_quantile(self, quantile: float, window: str, offset: str | None = None) -> str:
        at = f"[{window}]" + (f" offset {offset}" if offset else "")
        buckets = self.sel("train_step_duration_seconds_bucket")
        return f"histogram_quantile({quantile}, sum by ({self.by}, le) (rate({buckets}{at})))"


# -- rules ---------------------------------------------------------------------------


def _check(name: str, spec: Mapping[str, Any]) -> None:
    for key, value in spec.items():
        where = f"alerts.{name}.{key}"
        if key in ("for", "window", "baseline", "horizon") and not (
            isinstance(value, str) and value and _DURATION_RE.match(value)
        ):
            raise RuleConfigError(f"{where}: expected a Prometheus duration like 5m, got {value!r}")
        if key in ("threshold", "drop_ratio", "min_baseline", "quantile", "min_usage") and not (
            isinstance(value, int | float) and 0 <= value <= 1
        ):
            raise RuleConfigError(f"{where}: expected a fraction between 0 and 1, got {value!r}")
        if key == "factor" and not (isinstance(value, int | float) and value > 1):
            raise RuleConfigError(f"{where}: expected a factor above 1, got {value!r}")
        if key == "severity" and value not in SEVERITIES:
            raise RuleConfigError(f"{where}: expected one of {SEVERITIES}, got {value!r}")
        if key == "action" and value is not None and value not in ACTIONS:
            raise RuleConfigError(f"{where}: expected one of {ACTIONS} or null, got {value!r}")
        if (
            key == "duration_ms"
            and value is not None
            and not (isinstance(value, int) and not isinstance(value, bool) and value > 0)
        ):
            raise RuleConfigError(f"{where}: expected milliseconds > 0 or null, got {value!r}")
        if key in ("failed_statuses", "reasons") and not (isinstance(value, str) and value):
            raise RuleConfigError(f"{where}: expected a regex of label values, got {value!r}")
        if key == "min_rate" and not (isinstance(value, int | float) and value > 0):
            raise RuleConfigError(f"{where}: expected a rate above 0 per second, got {value!r}")


def _links(links: Mapping[str, Any], name: str, per_run: bool) -> dict[str, str]:
    dashboard = (
        f"{str(links['grafana_url']).rstrip('/')}/d/{links['dashboard_uid']}/"
        f"{links['dashboard_slug']}"
    )
    if per_run:
        dashboard += "?var-run_id={{ $labels.run_id }}&var-host={{ $labels.host }}"
    return {
        "runbook_url": f"{links['runbook_base']}#{name.lower()}",
        "dashboard_url": dashboard,
    }


def _alert(
    name: str,
    spec: Mapping[str, Any],
    links: Mapping[str, Any],
    expr: str,
    summary: str,
    description: str,
    *,
    per_run: bool = True,
) -> dict[str, Any]:
    labels: dict[str, str] = {"severity": spec["severity"]}
    if spec.get("action"):
        labels["mlprof_action"] = spec["action"]
        if spec.get("duration_ms"):
            labels["mlprof_duration_ms"] = str(spec["duration_ms"])
    return {
        "alert": name,
        "expr": expr,
        "for": spec["for"],
        "labels": labels,
        "annotations": {
            "summary": summary,
            "description": description,
            **_links(links, name, per_run),
        },
    }


def build_rules(table: Mapping[str, Any]) -> dict[str, Any]:
    """The rule-file structure (``{"groups": [...]}``) for a full thresholds table."""
    alerts = table["alerts"]
    missing = [n for n in ALERT_NAMES if n not in alerts]
    if missing:
        raise RuleConfigError(f"alerts: missing entries for {', '.join(missing)}")
    for name in ALERT_NAMES:
        _check(name, alerts[name])
    q = _Exprs(table["selectors"])
    links = table["links"]
    run = "{{ $labels.run_id }} ({{ $labels.workload }}) on {{ $labels.host }}"

    a = alerts["MLWorkloadDutyCycleLow"]
    duty_low = _alert(
        "MLWorkloadDutyCycleLow",
        a,
        links,
        f"{q.duty_cycle(a['window'])} < {a['threshold']}\n"
        f"and on ({q.by}) {q.progressing(a['window'])}\n"
        f"and on ({q.by}) {q.alive()}\n",
        "Accelerators are idle most of the time while training steps still progress.",
        f"Run {run}: the accelerators were busy only {{{{ $value | humanizePercentage }}}} "
        f"of the time over the last {a['window']} (threshold {a['threshold']:.0%}) while "
        "steps kept completing. The input pipeline or host-side work is likely the "
        "bottleneck.",
    )

    a = alerts["MLWorkloadDutyCycleDrop"]
    recent = q.duty_cycle(a["window"])
    baseline = q.duty_cycle(a["baseline"], offset=a["window"])
    duty_drop = _alert(
        "MLWorkloadDutyCycleDrop",
        a,
        links,
        f"(\n  1 - {_indent(recent)}\n  / ({_indent(baseline)} > {a['min_baseline']})\n)"
        f" >= {a['drop_ratio']}\n"
        f"and on ({q.by}) {q.progressing(a['window'])}\n"
        f"and on ({q.by}) {q.alive()}\n",
        "Accelerator duty cycle dropped against its own recent baseline.",
        f"Run {run}: the duty cycle over the last {a['window']} is "
        "{{ $value | humanizePercentage }} lower than over the "
        f"{a['baseline']} before it (threshold {a['drop_ratio']:.0%}).",
    )

    a = alerts["MLWorkloadStepTimeRegression"]
    step_regression = _alert(
        "MLWorkloadStepTimeRegression",
        a,
        links,
        f"(\n  {q.step_quantile(a['quantile'], a['window'])}\n"
        f"  /\n  {q.step_quantile(a['quantile'], a['baseline'], offset=a['window'])}\n"
        f") > {a['factor']}\n"
        f"and on ({q.by}) {q.alive()}\n",
        "Training step time regressed against its trailing baseline.",
        f"Run {run}: the p{a['quantile'] * 100:g} step time over the last {a['window']} is "
        '{{ $value | printf "%.2f" }}x the one over the '
        f"{a['baseline']} before it (threshold {a['factor']}x).",
    )

    a = alerts["MLWorkloadStalled"]
    steps = q.sel("train_steps_total")
    stalled = _alert(
        "MLWorkloadStalled",
        a,
        links,
        f"sum by ({q.by}) (increase({steps}[{a['window']}])) == 0\n"
        # Before the first step completes (compilation) there is nothing to stall.
        f"and on ({q.by}) (sum by ({q.by}) ({steps}) > 0)\n"
        f"and on ({q.by}) {q.alive()}\n",
        "Training made no step progress while the workload is alive.",
        f"Run {run}: no training step completed in the last {a['window']} (last step "
        f"{_last_step(q)}) although the workload's heartbeat is fresh. It may be hung in "
        "a collective, a data loader or a checkpoint.",
    )

    a = alerts["MLAcceleratorMemoryNearCapacity"]
    used, limit = q.sel("accelerator_memory_usage_bytes"), q.sel("accelerator_memory_limit_bytes")
    jax_used = q.sel("accelerator_memory_usage_bytes", 'source="jax"')
    jax_limit = q.sel("accelerator_memory_limit_bytes", 'source="jax"')
    by_chip = f"{q.by}, accelerator, chip"
    memory = _alert(
        "MLAcceleratorMemoryNearCapacity",
        a,
        links,
        # JAX's allocator counts bytes in use; NVML/libtpu may count a preallocated pool,
        # so the JAX figure wins where the workload reports one.
        "(\n"
        f"  max by ({by_chip}) ({jax_used} / ({jax_limit} > 0))\n"
        "  or\n"
        f"  max by ({by_chip}) ({used} / ({limit} > 0))\n"
        f") > {a['threshold']}\n",
        "Accelerator memory is close to its capacity.",
        f"Run {run}: {{{{ $labels.accelerator }}}} chip {{{{ $labels.chip }}}} uses "
        "{{ $value | humanizePercentage }} of its device memory "
        f"(threshold {a['threshold']:.0%}). The next larger batch or activation may fail "
        "with out-of-memory.",
    )

    a = alerts["MLProfExporterDown"]
    exporter_down = _alert(
        "MLProfExporterDown",
        a,
        links,
        f"up{{{q.job}}} == 0\n",
        "The mlprof sidecar cannot be scraped.",
        "Prometheus could not scrape the mlprof sidecar {{ $labels.instance }} (job "
        f"{{{{ $labels.job }}}}) for {a['for']}: accelerator and training metrics, and "
        "captures on alert, are missing for its workload.",
        per_run=False,
    )

    a = alerts["MLProfProfilePushesFailing"]
    pushes = "mlprof_profile_pushes_total"
    failed = f'{pushes}{{status=~"{a["failed_statuses"]}"}}'
    pushes_failing = _alert(
        "MLProfProfilePushesFailing",
        a,
        links,
        f"sum by (job, instance, sink) (rate({failed}[{a['window']}]))\n"
        f"/\nsum by (job, instance, sink) (rate({pushes}[{a['window']}]))\n"
        f"> {a['threshold']}\n",
        "Flame-graph pushes from the mlprof sidecar are failing.",
        "{{ $value | humanizePercentage }} of the profile pushes from {{ $labels.instance }} "
        f"to {{{{ $labels.sink }}}} failed over the last {a['window']} (rejected, dropped or "
        "spooled for retry).",
        per_run=False,
    )

    a = alerts["MLProfCapturesFailing"]
    captures = "mlprof_captures_total"
    failed = f'{captures}{{status=~"{a["failed_statuses"]}"}}'
    captures_failing = _alert(
        "MLProfCapturesFailing",
        a,
        links,
        f"sum by (job, instance, trigger) (increase({failed}[{a['window']}]))\n"
        f"/\nsum by (job, instance, trigger) (increase({captures}[{a['window']}]))\n"
        f"> {a['threshold']}\n",
        "Profiler captures started by the mlprof sidecar are failing.",
        "{{ $value | humanizePercentage }} of the {{ $labels.trigger }}-triggered captures "
        f"of {{{{ $labels.instance }}}} failed over the last {a['window']}.",
        per_run=False,
    )

    a = alerts["MLWorkloadInputBound"]
    share = q.sel("train_input_wait_share")
    input_bound = _alert(
        "MLWorkloadInputBound",
        a,
        links,
        f"avg by ({q.by}) (avg_over_time({share}[{a['window']}])) > {a['threshold']}\n"
        f"and on ({q.by}) {q.progressing(a['window'])}\n"
        f"and on ({q.by}) {q.alive()}\n",
        "Training steps wait for their input a large share of the time.",
        f"Run {run}: steps waited for their next batch {{{{ $value | humanizePercentage }}}} "
        f"of the time over the last {a['window']} (threshold {a['threshold']:.0%}): the input "
        "pipeline does not keep up with the accelerators.",
    )

    return {
        "groups": [
            {
                "name": "mlprof-workload",
                "rules": [duty_low, duty_drop, step_regression, stalled, memory],
            },
            {
                "name": "mlprof-exporter",
                "rules": [exporter_down, pushes_failing, captures_failing],
            },
            {"name": "mlprof-accelerator", "rules": _accelerator_rules(alerts, q, links, run)},
            # Appended as a group of its own: the order of ALERT_NAMES is the file's order.
            {"name": "mlprof-workload-input", "rules": [input_bound]},
        ]
    }


def _accelerator_rules(
    alerts: Mapping[str, Any], q: _Exprs, links: Mapping[str, Any], run: str
) -> list[dict[str, Any]]:
    """Hardware rules over the NVML and libtpu series (``docs/metrics.md``)."""
    by_chip = f"{q.by}, chip"
    chip = "{{ $labels.accelerator }} chip {{ $labels.chip }}"

    a = alerts["MLAcceleratorThrottled"]
    throttle = q.sel("accelerator_clock_throttle", f'reason=~"{a["reasons"]}"')
    throttled = _alert(
        "MLAcceleratorThrottled",
        a,
        links,
        f"max by ({by_chip}, accelerator, reason) (avg_over_time({throttle}[{a['window']}]))"
        f" > {a['threshold']}\n",
        "An accelerator's clocks are held down for a thermal or power reason.",
        f"Run {run}: {chip} had its clocks held down for {{{{ $labels.reason }}}} "
        f"{{{{ $value | humanizePercentage }}}} of the last {a['window']} (threshold "
        f"{a['threshold']:.0%}). It runs slower than its peer chips and slows the whole job.",
    )

    a = alerts["MLAcceleratorXidErrors"]
    xid = q.sel("accelerator_xid_errors_total")
    last = f"max({q.sel('accelerator_xid_last', 'host=%q', 'chip=%q')})"
    xid_errors = _alert(
        "MLAcceleratorXidErrors",
        a,
        links,
        f"sum by ({by_chip}, accelerator) (increase({xid}[{a['window']}])) > 0\n",
        "The GPU driver reported XID errors.",
        f"Run {run}: {chip} reported {{{{ $value | humanize }}}} XID error(s) in the last "
        f"{a['window']}, the last one XID {_lookup(last, 'host', 'chip')}. See the runbook "
        "for which XIDs mean the GPU must be drained.",
    )

    a = alerts["MLAcceleratorEccUncorrectable"]
    ecc = q.sel("accelerator_memory_ecc_errors_total", 'type="uncorrected"')
    ecc_errors = _alert(
        "MLAcceleratorEccUncorrectable",
        a,
        links,
        f"sum by ({by_chip}, accelerator) (increase({ecc}[{a['window']}])) > 0\n",
        "An accelerator's memory had uncorrectable ECC errors.",
        f"Run {run}: {chip} had {{{{ $value | humanize }}}} uncorrectable (double-bit) ECC "
        f"error(s) in the last {a['window']}. Data in device memory was corrupted; the "
        "process that used it has likely crashed or computed garbage.",
    )

    a = alerts["MLAcceleratorMemoryHeadroomLow"]
    used, limit = q.sel("accelerator_memory_usage_bytes"), q.sel("accelerator_memory_limit_bytes")
    horizon = _seconds(a["horizon"])
    by_device = f"{by_chip}, accelerator"
    headroom = _alert(
        "MLAcceleratorMemoryHeadroomLow",
        a,
        links,
        f"max by ({by_device}) (\n"
        f"  predict_linear({used}[{a['window']}], {horizon}) / ({limit} > 0)\n"
        ") >= 1\n"
        f"and on ({by_device})\n"
        f"max by ({by_device}) ({used} / ({limit} > 0)) > {a['min_usage']}\n",
        "Accelerator memory grows towards its capacity.",
        f"Run {run}: {chip} is above {a['min_usage']:.0%} of its device memory and, at the "
        f"growth of the last {a['window']}, would need {{{{ $value | humanizePercentage }}}} "
        f"of it within {a['horizon']}: a leak or a growing cache will end in out-of-memory.",
    )

    a = alerts["MLAcceleratorInterconnectLatencyRegression"]
    paths = []
    for path, base, labels in (
        ("collective", "accelerator_collective", "buffer_size"),
        ("dcn", "tpu_dcn_transfer", "direction, buffer_size"),
    ):
        by = f"{q.by}, {labels}"

        def mean(window: str, offset: str | None = None, base: str = base, by: str = by) -> str:
            at = f"[{window}]" + (f" offset {offset}" if offset else "")
            time_s = q.sel(f"{base}_time_seconds_total")
            count = q.sel(f"{base}_count_total")
            return (
                f"sum by ({by}) (rate({time_s}{at}))\n"
                f"    / (sum by ({by}) (rate({count}{at})) > {a['min_rate']})"
            )

        ratio = f"(\n    {mean(a['window'])}\n  ) / (\n    {mean(a['baseline'], a['window'])}\n  )"
        paths.append(f'label_replace(\n  {ratio} > {a["factor"]},\n  "path", "{path}", "", ""\n)')
    latency = _alert(
        "MLAcceleratorInterconnectLatencyRegression",
        a,
        links,
        "\nor\n".join(paths) + "\n",
        "Collective or DCN transfer latency regressed against its trailing baseline.",
        f"Run {run}: the mean {{{{ $labels.path }}}} latency of {{{{ $labels.buffer_size }}}} "
        f'buffers over the last {a["window"]} is {{{{ $value | printf "%.2f" }}}}x the one '
        f"over the {a['baseline']} before it (threshold {a['factor']}x). The ICI or "
        "data-centre network, or a straggling host, slows every step.",
    )
    return [throttled, xid_errors, ecc_errors, headroom, latency]


def _lookup(query: str, *labels: str) -> str:
    """Template text: ``query`` (with ``%q`` for each label) evaluated when the alert fires."""
    escaped = query.replace('"', '\\"')  # a Go template string literal
    args = " ".join(f"$labels.{label}" for label in labels)
    return (
        f'{{{{ with printf "{escaped}" {args} | query }}}}'
        '{{ . | first | value | printf "%.0f" }}{{ end }}'
    )


def _seconds(duration: str) -> int:
    """Seconds in a Prometheus duration (already checked by :func:`_check`)."""
    units = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|[ywdhms])", duration):
        total += int(number) / 1000 if unit == "ms" else int(number) * units[unit]
    return int(total)


def _last_step(q: _Exprs) -> str:
    """Template text: the run's last step number, looked up when the alert fires."""
    # The alert's value is 0 by construction; the step it stopped at is what helps.
    return _lookup(f"max({q.sel('train_step', 'run_id=%q', 'host=%q')})", "run_id", "host")


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


# -- rendering -----------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line expressions, so the rendered file reads like PromQL."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)

# Long annotations stay on one line: folding would split ``{{ $labels.x }}`` templates.
_NO_WRAP = 1_000_000
_HEADER = (
    "# Generated by `python -m alerts.render` from alerts/thresholds.yaml. Do not edit:\n"
    "# change the thresholds table and re-render (tests fail when this file is stale).\n"
)


def render_rules(overrides: Mapping[str, Any] | None = None) -> str:
    """The rules file text: the shipped table deep-merged with ``overrides``.

    ``overrides`` has the shape of ``thresholds.yaml``; any subset of keys, e.g.
    ``{"alerts": {"MLWorkloadDutyCycleLow": {"for": "5s", "window": "10s"}}}``.
    Unknown keys or values of the wrong kind raise :class:`RuleConfigError`.
    """
    table = merge_overrides(load_thresholds(), overrides)
    body = yaml.dump(
        build_rules(table), Dumper=_Dumper, sort_keys=False, width=_NO_WRAP, allow_unicode=True
    )
    return _HEADER + body


def render_prometheus_rule(
    overrides: Mapping[str, Any] | None = None, *, name: str = "mlprof", namespace: str = ""
) -> str:
    """The same rules as a Prometheus Operator ``PrometheusRule`` resource (Kubernetes)."""
    table = merge_overrides(load_thresholds(), overrides)
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/name": "mlprof-exporter", "role": "alert-rules"},
    }
    if namespace:
        metadata["namespace"] = namespace
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": build_rules(table),
    }
    return _HEADER + yaml.dump(
        resource, Dumper=_Dumper, sort_keys=False, width=_NO_WRAP, allow_unicode=True
    )


def render_alertmanager_config(
    webhook_url: str | None = None, token: str | None = None, *, short_timers: bool = True
) -> dict[str, Any]:
    """The example Alertmanager config, with the sidecar's URL and token filled in.

    The token replaces ``credentials_file`` by inline ``credentials``; ``short_timers``
    shortens group_wait/group_interval so a test sees a notification within seconds.
    """
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text(encoding="utf-8"))
    receivers = [r for r in config["receivers"] if r["name"] == WEBHOOK_RECEIVER]
    if len(receivers) != 1 or len(receivers[0].get("webhook_configs", [])) != 1:
        raise RuleConfigError(
            f"{ALERTMANAGER_EXAMPLE}: expected one receiver {WEBHOOK_RECEIVER!r} "
            "with one webhook_configs entry"
        )
    hook = receivers[0]["webhook_configs"][0]
    if webhook_url is not None:
        hook["url"] = webhook_url
    if token is not None:
        auth = hook.setdefault("http_config", {}).setdefault("authorization", {})
        auth.pop("credentials_file", None)
        auth["credentials"] = token
    if short_timers:
        for route in [config["route"], *config["route"].get("routes", [])]:
            route["group_wait"] = "1s"
            route["group_interval"] = "1s"
    return config


# -- command line --------------------------------------------------------------------


def write_or_check(output: Path, text: str, check: bool, command: str) -> int:
    """Write ``text`` to ``output``, or with ``check`` exit 1 when ``output`` differs."""
    if check:
        current = output.read_text(encoding="utf-8") if output.is_file() else ""
        if current != text:
            print(f"{output} is stale: run `{command}`", file=sys.stderr)
            return 1
        return 0
    output.write_text(text, encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Render (or check) the rules file; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m alerts.render", description=__doc__)
    parser.add_argument("--overrides", type=Path, help="YAML override table")
    parser.add_argument("-o", "--output", type=Path, default=RULES_FILE, help="rules file")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the output file differs from a render"
    )
    parser.add_argument(
        "--prometheus-rule",
        metavar="NAME",
        help="render a Prometheus Operator PrometheusRule of this name instead",
    )
    args = parser.parse_args(argv)
    try:
        overrides = load_overrides(args.overrides) if args.overrides else None
        if args.prometheus_rule:
            text = render_prometheus_rule(overrides, name=args.prometheus_rule)
        else:
            text = render_rules(overrides)
    except RuleConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return write_or_check(args.output, text, args.check, "python -m alerts.render")


if __name__ == "__main__":
    sys.exit(main())
