"""Every query of a Grafana dashboard JSON, and Grafana's variable substitution, for tests.

``queries(dashboard)`` lists each panel target and annotation (Prometheus, Pyroscope,
Infinity) and ``variable_queries(dashboard)`` each ``label_values(...)`` variable.
:class:`Templating` substitutes variables and macros the way Grafana's Prometheus data
source does (``public/app/features/templating/template_srv.ts`` and the Prometheus
data source's ``interpolateQueryExpr``):

- ``$__interval`` is the time range over the panel's data points, rounded to a "nice"
  interval and at least the scrape interval; ``$__rate_interval`` is
  ``max($__interval + scrape interval, 4 * scrape interval)``; ``$__range`` is the time
  range in seconds.
- A variable that is neither multi-value nor "include All" is inserted as is. One that
  is: each value regex-escaped, several joined as ``(a|b)``; All becomes the variable's
  custom all value (``.*``), or every value joined when it has none.
- ``${var:format}`` formats: ``regex``, ``pipe``, ``csv``, ``raw``, ``percentencode``,
  ``queryparam``.

>>> t = Templating({"host": Variable(["h0", "h1"], multi=True)})
>>> t.promql('up{host=~"$host"}')
'up{host=~"(h0|h1)"}'
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

__all__ = [
    "LabelValuesQuery",
    "Query",
    "Templating",
    "Variable",
    "queries",
    "variable_queries",
]

PROMETHEUS = "prometheus"
PYROSCOPE = "grafana-pyroscope-datasource"
INFINITY = "yesoreyeram-infinity-datasource"
ALL = "$__all"
# Grafana's rangeutil "nice" intervals (seconds) a computed $__interval rounds to.
_NICE = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300,
         600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400)  # fmt: skip
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::([\w:]+))?\}|\[\[(\w+)(?::(\w+))?\]\]")
# Prometheus' regex metacharacters, escaped in multi-value substitution.
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]])")


@dataclass(frozen=True)
class Query:
    """One query of a dashboard: where it is and what it asks."""

    panel: str  # panel title, or "annotation: <name>"
    ref: str
    datasource: str  # plugin type
    target: dict[str, Any]
    no_value: str | None = None  # what the panel shows when its queries return nothing

    @property
    def where(self) -> str:
        return f"{self.panel} [{self.ref}]"


@dataclass(frozen=True)
class LabelValuesQuery:
    """A query variable ``label_values(selector, label)``."""

    name: str
    selector: str
    label: str


@dataclass
class Variable:
    """A variable's current values (``[ALL]`` for All) and how Grafana formats it."""

    values: list[str]
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None
    options: list[str] = field(default_factory=list)  # every value, for All without allValue


def _panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def _source_type(target: Mapping[str, Any], panel: Mapping[str, Any]) -> str:
    source = target.get("datasource") or panel.get("datasource") or {}
    return str(source.get("type", ""))


def queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every panel target and annotation query, in dashboard order."""
    found = []
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            no_value = panel.get("fieldConfig", {}).get("defaults", {}).get("noValue")
            found.append(
                Query(
                    panel["title"],
                    target.get("refId", ""),
                    _source_type(target, panel),
                    target,
                    no_value,
                )
            )
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            source = str(annotation.get("datasource", {}).get("type", PROMETHEUS))
            found.append(Query(f"annotation: {annotation['name']}", "Anno", source, annotation))
    return found


_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")


def variable_queries(dashboard: Mapping[str, Any]) -> list[LabelValuesQuery]:
    """The query variables, each a ``label_values(...)`` (anything else is an error)."""
    found = []
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text.strip())
        if match is None:
            raise ValueError(f"variable {variable['name']}: not a label_values() query: {text}")
        found.append(LabelValuesQuery(variable["name"], match["selector"] or "", match["label"]))
    return found


def _duration(seconds: float) -> str:
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


class Templating:
    """Substitutes variables and macros into query text as Grafana does."""

    def __init__(
        self,
        variables: Mapping[str, Variable],
        *,
        range_s: float = 3600.0,
        scrape_interval_s: float = 15.0,
        max_data_points: int = 1000,
    ) -> None:
        self.variables = dict(variables)
        self.range_s = range_s
        self.scrape_interval_s = scrape_interval_s
        raw = range_s / max_data_points
        nice = next((n for n in _NICE if n >= raw), _NICE[-1])
        self.interval_s = max(nice, scrape_interval_s)
        self.rate_interval_s = max(self.interval_s + scrape_interval_s, 4 * scrape_interval_s)

    @property
    def macros(self) -> dict[str, str]:
        return {
            "__rate_interval": _duration(self.rate_interval_s),
            "__interval": _duration(self.interval_s),
            "__range": _duration(self.range_s),
        }

    def _values(self, variable: Variable) -> list[str]:
        if variable.values == [ALL]:
            return variable.options
        return variable.values

    def _format(self, name: str, fmt: str | None, *, regex_context: bool) -> str:
        if name in self.macros:
            return self.macros[name]
        if name not in self.variables:
            raise KeyError(f"unknown variable ${name}")
        variable = self.variables[name]
        if variable.values == [ALL] and variable.all_value is not None and fmt in (None, "regex"):
            return variable.all_value
        values = self._values(variable)
        if fmt == "csv":
            return ",".join(values)
        if fmt == "pipe":
            return "|".join(values)
        if fmt == "raw":
            return ",".join(values)
        if fmt == "percentencode":
            text = values[0] if len(values) == 1 else "{" + ",".join(values) + "}"
            return quote(text, safe="")
        if fmt == "queryparam":
            return "&".join(f"var-{name}={quote(v, safe='')}" for v in values)
        if fmt == "regex" or (regex_context and (variable.multi or variable.include_all)):
            escaped = [_REGEX_SPECIAL.sub(r"\\\1", v) for v in values]
            if fmt is None:  # the Prometheus data source escapes backslashes once more
                escaped = [v.replace("\\", "\\\\") for v in escaped]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        if fmt is not None and fmt not in ("text", "date", "date:seconds"):
            raise ValueError(f"format {fmt!r} of ${name} is not supported here")
        if regex_context:  # a plain value: the data source escapes backslashes and quotes
            values = [v.replace("\\", "\\\\").replace("'", "\\'") for v in values]
        return ",".join(values)

    def replace(self, text: str, *, regex_context: bool = False) -> str:
        """``text`` with every ``$var``, ``${var}``, ``${var:fmt}`` and ``[[var]]`` replaced."""

        def sub(match: re.Match[str]) -> str:
            name = match[1] or match[2] or match[4]
            fmt = match[3] or match[5]
            return self._format(name, fmt, regex_context=regex_context)

        return _VARIABLE.sub(sub, text)

    def promql(self, expr: str) -> str:
        """A PromQL expression as Grafana's Prometheus data source sends it."""
        return self.replace(expr, regex_context=True)
