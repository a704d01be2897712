"""JSON from outside the process, parsed with limits: never a RecursionError, never a 500.

A request body, a ``session.json`` or a baseline mark in a shared bucket, a report
another tenant replaced: Python's ``json`` module accepts what the rest of the sidecar
cannot use. Nesting deep enough to raise RecursionError (which no ``except
ValueError`` catches), integers past the 4,300-digit conversion limit, and lone UTF-16
surrogates (``"\\ud800"``) that parse into a ``str`` no UTF-8 encoder accepts, so a
later write or hash fails far from the input. :func:`load_json` refuses each with one
:class:`JSONInputError` (a ValueError) naming the input and what was wrong; the HTTP
API turns it into a 400 (:mod:`exporter.api.json_body`), the store into a record set
aside (:mod:`exporter.capture.store`).

>>> load_json_object(b'{"session_id": "s1"}', "mark")
{'session_id': 's1'}
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["MAX_JSON_DEPTH", "JSONInputError", "check_json", "load_json", "load_json_object"]

# Alertmanager's payload is 4 levels deep (alerts[].labels.x), a report about 8; 64
# leaves room for extra fields, far below Python's recursion limit.
MAX_JSON_DEPTH: Final = 64


class JSONInputError(ValueError):
    """Not usable JSON; ``wrong_type`` when it parsed but is not the JSON type asked for."""

    def __init__(self, message: str, *, wrong_type: bool = False) -> None:
        super().__init__(message)
        self.wrong_type = wrong_type


def load_json(data: bytes | str, what: str = "body") -> Any:
    """``data`` parsed; JSONInputError for bad, too deeply nested or non-Unicode JSON."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise JSONInputError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        where = f"{exc.reason} at byte {exc.start}"
        raise JSONInputError(f"{what} is not valid JSON: not UTF-8 ({where})") from None
    except json.JSONDecodeError as exc:
        raise JSONInputError(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer past the 4,300-digit conversion limit
        raise JSONInputError(f"{what} is not usable JSON: {str(exc)[:200]}") from None
    check_json(value, what)
    return value


def load_json_object(data: bytes | str, what: str = "body") -> dict[str, Any]:
    """:func:`load_json`, and a JSON object (``wrong_type`` set when it is another type)."""
    value = load_json(data, what)
    if not isinstance(value, dict):
        raise JSONInputError(
            f"{what}: expected a JSON object, got a JSON {type(value).__name__}",
            wrong_type=True,
        )
    return value


def check_json(data: Any, what: str = "body") -> None:
    """JSONInputError if ``data`` nests deeper than MAX_JSON_DEPTH or holds a lone surrogate."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, what)
        elif isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise JSONInputError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _check_text(key, what)
                stack.append((item, depth + 1))


def _check_text(text: str, what: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:80]
        raise JSONInputError(
            f"{what} has a string that is not valid Unicode (a lone surrogate): {shown!r}"
        ) from None
