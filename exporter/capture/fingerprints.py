"""The configuration fingerprint of a workload-written file (run.json, an identity).

With the run's name, ``schema.config_fingerprint`` says which earlier sessions are the
same workload's history (docs/analysis.md, "Which runs are the same workload"). The SDK
writes it; the sidecar takes it from files the workload wrote, so it is hostile input:
only a short lower-case hex string is taken, else it is computed from the file's
``configs`` (an SDK from before the field wrote those), else it is unknown (None).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from exporter import schema

__all__ = ["FINGERPRINT_KEY", "checked_fingerprint", "fingerprint_of"]

FINGERPRINT_KEY: Final = "config_fingerprint"
# schema.config_fingerprint writes 16; up to 64 (a whole SHA-256) is taken, so a later
# SDK may write a longer one. Anything else (a path, a huge string) is never stored.
_FINGERPRINT_RE: Final = re.compile(r"[0-9a-f]{1,64}")


def checked_fingerprint(value: object) -> str | None:
    """``value`` if it is a well-formed fingerprint (1-64 of [0-9a-f]), else None."""
    if isinstance(value, str) and _FINGERPRINT_RE.fullmatch(value):
        return value
    return None


def fingerprint_of(info: Mapping[str, Any]) -> str | None:
    """The fingerprint a run file or identity claims if well formed, else its
    ``configs`` object's, else None (no configs, or configs that are not an object)."""
    found = checked_fingerprint(info.get(FINGERPRINT_KEY))
    if found is not None:
        return found
    configs = info.get("configs")
    if not isinstance(configs, Mapping):
        return None
    try:
        return schema.config_fingerprint(configs)
    except (TypeError, ValueError, RecursionError):
        return None  # what json.loads made is always encodable: never expected here
