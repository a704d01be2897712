"""No module of the product reaches into another's private names.

A name with a leading underscore may change without notice; a module that needs one
from elsewhere gets it a public name (as ``xplane.FrameTree`` for torch traces) or a
home of its own. Private *modules* (the compiled cores ``_xwire``, ``_highwayhash``) are
imported by their own package's wrapper and are not names of another module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import exporter

ROOT = Path(exporter.__file__).parent
# Reaches allowed by name: none are left; a new one gets a public name instead.
KNOWN: frozenset[str] = frozenset()


def _is_module(package: str, name: str) -> bool:
    folder = ROOT.parent.joinpath(*package.split("."))
    return (folder / f"{name}.py").exists() or any(folder.glob(f"{name}.*.so"))


def test_no_private_name_is_imported_from_another_module() -> None:
    reaches = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if not node.module.startswith("exporter"):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                qualified = f"{node.module}.{alias.name}"
                if private and qualified not in KNOWN and not _is_module(node.module, alias.name):
                    shown = path.relative_to(ROOT.parent)
                    reaches.append(f"{shown}:{node.lineno} {qualified}")
    assert reaches == []
