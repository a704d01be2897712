"""Request bodies as JSON objects: size-capped, depth-capped, valid Unicode, or a 4xx.

Python's ``json`` module accepts what the rest of the sidecar cannot use: nesting deep
enough to raise RecursionError, integers past the 4,300-digit conversion limit
(ValueError), and lone UTF-16 surrogates (``"\\ud800"``) that parse into a ``str`` no
UTF-8 encoder accepts, so a store write or a hash fails much later. Each is answered
400 here with what was wrong, never 500: Alertmanager retries a 5xx for ever.

>>> body = await read_json_object(request, 65536, "body over 64 KiB")  # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any, Final

from fastapi import HTTPException, Request, status
from pydantic import BaseModel

from exporter.api.body import read_limited

__all__ = [
    "MAX_JSON_DEPTH",
    "check_json",
    "openapi_body",
    "parse_json_object",
    "read_json_object",
]

# Alertmanager's payload is 4 levels deep (alerts[].labels.x); the capture body 2.
# 64 leaves room for extra fields, far below Python's recursion limit.
MAX_JSON_DEPTH: Final = 64


def _bad(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_400_BAD_REQUEST, detail)


def check_json(data: Any) -> None:
    """Raise 400 if ``data`` nests deeper than MAX_JSON_DEPTH or holds a lone surrogate."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise _bad(f"body nests deeper than {MAX_JSON_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _check_text(key)
                stack.append((item, depth + 1))


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:80]
        raise _bad(
            f"body has a string that is not valid Unicode (a lone surrogate): {shown!r}"
        ) from None


def parse_json_object(body: bytes, what: str = "body") -> dict[str, Any]:
    """``body`` parsed as a JSON object; 400 for bad JSON, 422 for another JSON type."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise _bad(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        where = f"{exc.reason} at byte {exc.start}"
        raise _bad(f"{what} is not valid JSON: not UTF-8 ({where})") from None
    except json.JSONDecodeError as exc:
        raise _bad(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer past the 4,300-digit conversion limit
        raise _bad(f"{what} is not usable JSON: {str(exc)[:200]}") from None
    check_json(data)
    if not isinstance(data, dict):
        raise HTTPException(
            422,
            f"{what}: expected a JSON object, got a JSON {type(data).__name__}",
        )
    return data


async def read_json_object(
    request: Request, limit: int, too_large_detail: str, what: str = "body"
) -> dict[str, Any]:
    """The request body as a JSON object (see :func:`parse_json_object`); 413 past ``limit``."""
    return parse_json_object(await read_limited(request, limit, too_large_detail), what)


def openapi_body(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a body a route reads itself (see read_json_object).

    The routes parse their bodies here rather than through FastAPI, so the schema is
    declared by hand: ``/docs`` shows it and schema-driven clients (and fuzzers) use it.
    Nested models are inlined, the schema being one self-contained document.
    """
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": required, "content": content}}
