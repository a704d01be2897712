"""Request bodies read with a size bound, refused (413) as soon as they are known too large.

A client that leaves mid-body (or is cut off by the protocol's body deadline) ends the
read with ``400``, which nobody receives: not a traceback per connection in the log.
"""

from __future__ import annotations

from fastapi import HTTPException, Request, status
from starlette.requests import ClientDisconnect

from exporter.api.admission import ByteBudget

__all__ = ["read_limited"]

CLIENT_LEFT = "the client closed the connection before its body was complete"


async def read_limited(
    request: Request, limit: int, detail: str, budget: ByteBudget | None = None
) -> bytes:
    """The request body, or 413 with ``detail`` once it is known to exceed ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before reading; a streamed
    body is refused at the first chunk that crosses it, so it is never held whole. With
    ``budget``, each chunk is taken from it as it arrives (429 when it is spent): the
    caller gives ``len(body)`` back once done with the body, this function the rest.
    """
    too_large = HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail)
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = taken = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            if budget is not None:
                if not budget.take(len(chunk)):
                    raise budget.refusal()
                taken += len(chunk)
            chunks.append(chunk)
    except BaseException as exc:  # cancelled too: what was taken goes back
        if budget is not None:
            budget.give(taken)
        if isinstance(exc, ClientDisconnect):
            raise HTTPException(status.HTTP_400_BAD_REQUEST, CLIENT_LEFT) from None
        raise
    return b"".join(chunks)
