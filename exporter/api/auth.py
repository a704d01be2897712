"""Bearer-token check, in constant time."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request, status

__all__ = ["check_bearer"]


def check_bearer(request: Request, token: str | None) -> None:
    """Raise 401 without a bearer token and 403 with a wrong one; pass if none is set."""
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <MLPROF_AUTH_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong bearer token")
