"""The dashboards against Grafana's published dashboard schema.

The schema is ``@grafana/schema`` from npm (the dashboard types Grafana generates from
its dashboard kind; pinned in tests/schema/package.json to the Grafana version
docker-compose.yml runs), turned into JSON Schema by ``ts-json-schema-generator`` with
unknown properties forbidden. ``make test`` installs both (``npm ci``).

Grafana's types leave out a few properties its JSON model does carry; they are added
here, each with the reason (``EXTRA``). Anything else unknown, mistyped or missing fails.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dashboards.generate import DASHBOARDS_DIR, FILES
from tests.harness import ROOT

SCHEMA_DIR = ROOT / "tests" / "schema"
TYPES = "node_modules/@grafana/schema/dist/types/raw/dashboard/x/dashboard_types.gen.d.ts"
EXTRA: dict[str, dict[str, Any]] = {
    # The SDK writes the interval-variable settings on every variable (Grafana's own JSON
    # export does so for interval variables; other variables ignore them).
    "VariableModel": {
        "auto": {"type": "boolean"},
        "auto_count": {"type": "number"},
        "auto_min": {"type": "string"},
    },
    # A Prometheus annotation's query and formats, read by the Prometheus data source
    # (the schema types only the built-in Grafana annotation's target).
    "AnnotationQuery": {
        "expr": {"type": "string"},
        "step": {"type": "string"},
        "titleFormat": {"type": "string"},
        "textFormat": {"type": "string"},
    },
}


def _generate(out: Path) -> None:
    generator = SCHEMA_DIR / "node_modules" / ".bin" / "ts-json-schema-generator"
    if not generator.exists() or shutil.which("node") is None:
        pytest.fail(
            "Grafana's schema is not installed: run `make test` (or `npm ci --prefix "
            "tests/schema`; Debian package npm)"
        )
    result = subprocess.run(
        [str(generator), "--path", TYPES, "--type", "Dashboard", "--no-type-check",
         "-o", str(out)],
        cwd=SCHEMA_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """The JSON Schema of a dashboard, generated once per lock file (cached)."""
    lock = (SCHEMA_DIR / "package-lock.json").read_bytes()
    cached = SCHEMA_DIR / "node_modules" / ".mlprof" / f"{hashlib.sha256(lock).hexdigest()}.json"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        _generate(cached)
    generated: dict[str, Any] = json.loads(cached.read_text(encoding="utf-8"))
    patched = copy.deepcopy(generated)
    for name, properties in EXTRA.items():
        definition = patched["definitions"][name]
        assert definition.get("additionalProperties") is False, name
        assert not set(properties) & set(definition["properties"]), (
            f"Grafana's schema now types {name}: drop it from EXTRA"
        )
        definition["properties"].update(properties)
    return patched


def errors(schema: dict[str, Any], dashboard: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    found = []
    for error in validator.iter_errors(dashboard):
        path = "/".join(str(p) for p in error.absolute_path)
        detail = "; ".join(sorted({c.message[:120] for c in error.context})) or error.message
        found.append(f"{path}: {detail[:400]}")
    return found


@pytest.mark.parametrize("name", list(FILES))
def test_dashboard_follows_grafanas_published_schema(schema: dict[str, Any], name: str) -> None:
    dashboard = json.loads((DASHBOARDS_DIR / name).read_text(encoding="utf-8"))
    assert errors(schema, dashboard) == []


def test_schema_rejects_what_grafana_would_not_read(schema: dict[str, Any]) -> None:
    dashboard = json.loads((DASHBOARDS_DIR / "mlprof-run.json").read_text(encoding="utf-8"))
    panel = next(p for p in dashboard["panels"] if p["type"] == "timeseries")
    panel["gridPos"]["w"] = "12"  # a string where Grafana needs a number
    dashboard["templating"]["list"][0]["refersh"] = 2  # a misspelt property
    del dashboard["annotations"]["list"][0]["iconColor"]  # a required one missing
    found = errors(schema, dashboard)
    assert len(found) == 3, found
