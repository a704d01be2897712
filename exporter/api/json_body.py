"""Request bodies as JSON objects: size-capped, depth-capped, valid Unicode, or a 4xx.

The limits are :mod:`exporter.json_limits`' (the store's JSON goes through the same
parser); here each refusal becomes 400 with what was wrong, never 500: Alertmanager
retries a 5xx for ever.

>>> body = await read_json_object(request, 65536, "body over 64 KiB")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, status
from pydantic import BaseModel

from exporter.api.body import read_limited
from exporter.json_limits import MAX_JSON_DEPTH, JSONInputError, load_json_object
from exporter.json_limits import check_json as _check_limits

__all__ = [
    "MAX_JSON_DEPTH",
    "check_json",
    "openapi_body",
    "parse_json_object",
    "read_json_object",
]


def check_json(data: Any) -> None:
    """Raise 400 if ``data`` nests deeper than MAX_JSON_DEPTH or holds a lone surrogate."""
    try:
        _check_limits(data)
    except JSONInputError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None


def parse_json_object(body: bytes, what: str = "body") -> dict[str, Any]:
    """``body`` parsed as a JSON object; 400 for bad JSON, 422 for another JSON type."""
    try:
        return load_json_object(body, what)
    except JSONInputError as exc:
        raise HTTPException(422 if exc.wrong_type else 400, str(exc)) from None


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
