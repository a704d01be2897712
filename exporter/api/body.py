"""Request bodies read with a size bound, refused (413) as soon as they are known too large."""

from __future__ import annotations

from fastapi import HTTPException, Request, status

__all__ = ["read_limited"]


async def read_limited(request: Request, limit: int, detail: str) -> bytes:
    """The request body, or 413 with ``detail`` once it is known to exceed ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before reading; a streamed
    body is refused at the first chunk that crosses it, so it is never held whole.
    """
    too_large = HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
