"""Panel and query types the Grafana Foundation SDK has no builder for.

Written the way the SDK's ``examples/python/custom-panel`` and ``custom-query`` do it:
a builder for the panel or query, plus a variant registered with the SDK's runtime so
that ``Dashboard.from_json`` reads the committed JSON back into typed models.

- ``flamegraph``: Grafana's built-in flame graph panel (no options of its own).
- ``yesoreyeram-infinity-datasource``: the Infinity data source's JSON query, used for
  the sidecar's session list (``GET /api/v1/sessions``), which Prometheus cannot hold.
"""

from __future__ import annotations

from typing import Any, Self

from grafana_foundation_sdk.builders.dashboard import Panel as PanelBuilder
from grafana_foundation_sdk.cog import builder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard
from grafana_foundation_sdk.models.dashboard import DataSourceRef

__all__ = [
    "FLAMEGRAPH",
    "INFINITY",
    "FlameGraphPanel",
    "InfinityColumn",
    "InfinityQuery",
    "InfinityQueryBuilder",
    "register_plugins",
]

FLAMEGRAPH = "flamegraph"
INFINITY = "yesoreyeram-infinity-datasource"


class FlameGraphOptions:
    """The flame graph panel has no options; it renders the profile it is given."""

    def to_json(self) -> dict[str, object]:
        return {}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls()


class FlameGraphPanel(PanelBuilder, builder.Builder[dashboard.Panel]):
    """Grafana's ``flamegraph`` panel (targets: ``grafanapyroscope.Dataquery``)."""

    def __init__(self) -> None:
        super().__init__()
        self._internal.type_val = FLAMEGRAPH
        self._internal.options = FlameGraphOptions()


class InfinityColumn:
    """One column of an Infinity table: a JSON field ``selector`` shown as ``text``."""

    def __init__(self, selector: str, text: str, type_val: str = "string") -> None:
        self.selector = selector
        self.text = text
        self.type_val = type_val

    def to_json(self) -> dict[str, object]:
        return {"selector": self.selector, "text": self.text, "type": self.type_val}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(str(data["selector"]), str(data.get("text", "")), str(data.get("type", "")))


class InfinityQuery(cogvariants.Dataquery):
    """An Infinity JSON query of ``url`` (relative to the data source's base URL)."""

    def __init__(
        self,
        url: str = "",
        root_selector: str = "",
        columns: list[InfinityColumn] | None = None,
        ref_id: str | None = None,
        hide: bool | None = None,
        datasource: DataSourceRef | None = None,
    ) -> None:
        self.url = url
        self.root_selector = root_selector
        self.columns = columns or []
        self.ref_id = ref_id
        self.hide = hide
        self.datasource = datasource

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "type": "json",
            "source": "url",
            "format": "table",
            # The backend parser runs in Grafana's server: alerting, no CORS, and the
            # sidecar's token stays in the data source's secure settings.
            "parser": "backend",
            "url": self.url,
            "url_options": {"method": "GET", "data": ""},
            "root_selector": self.root_selector,
            "columns": [c.to_json() for c in self.columns],
        }
        if self.ref_id is not None:
            payload["refId"] = self.ref_id
        if self.hide is not None:
            payload["hide"] = self.hide
        if self.datasource is not None:
            payload["datasource"] = self.datasource.to_json()
        return payload

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        source = data.get("datasource")
        return cls(
            url=str(data.get("url", "")),
            root_selector=str(data.get("root_selector", "")),
            columns=[InfinityColumn.from_json(c) for c in data.get("columns", [])],
            ref_id=data.get("refId"),
            hide=data.get("hide"),
            datasource=DataSourceRef.from_json(source) if isinstance(source, dict) else None,
        )


class InfinityQueryBuilder(builder.Builder[InfinityQuery]):
    """Builds an :class:`InfinityQuery`."""

    def __init__(self, url: str) -> None:
        self._query = InfinityQuery(url=url)

    def build(self) -> InfinityQuery:
        return self._query

    def ref_id(self, ref_id: str) -> Self:
        self._query.ref_id = ref_id
        return self

    def datasource(self, ref: DataSourceRef) -> Self:
        self._query.datasource = ref
        return self

    def root_selector(self, selector: str) -> Self:
        self._query.root_selector = selector
        return self

    def column(self, selector: str, text: str, type_val: str = "string") -> Self:
        self._query.columns.append(InfinityColumn(selector, text, type_val))
        return self


def register_plugins() -> None:
    """Teach the SDK's runtime these types, so ``from_json`` reads our dashboards back."""
    register_default_plugins()
    runtime = cogruntime.Runtime()
    runtime.register_panelcfg_variant(
        cogruntime.PanelCfgConfig(
            identifier=FLAMEGRAPH, options_from_json_hook=FlameGraphOptions.from_json
        )
    )
    runtime.register_dataquery_variant(
        cogruntime.DataqueryConfig(identifier=INFINITY, from_json_hook=InfinityQuery.from_json)
    )
