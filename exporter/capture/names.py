"""What a session may be named (the store's directories, and XProf's runs).

Light on purpose (no settings, no pydantic): :mod:`exporter.capture.inputs` resolves a
command's input with it, and ``mlprof flamegraph FILE`` loads nothing else.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["SESSION_ID_RE", "check_session_id"]

# Session ids become directory names in the store (and in XProf's UI): one path
# component, no leading dot (so never "." or ".."), bounded length.
SESSION_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_session_id(value: str) -> str:
    """Return ``value`` if it is a safe session id; raise ValueError saying what is expected."""
    if not SESSION_ID_RE.fullmatch(value) or ".." in value:
        raise ValueError(
            f"session name {value!r}: expected 1-128 characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit, without '..' or path separators"
        )
    return value
