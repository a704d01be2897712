"""A small client of the sidecar's REST API (what ``mlprof capture`` and friends use)."""

from __future__ import annotations

from typing import Any

import httpx

from exporter.errors import ConfigError, InputError, MlprofError

__all__ = ["ApiClient"]


class ApiClient:
    """Calls ``/api/v1`` on a running sidecar; errors become one-line MlprofErrors.

    >>> ApiClient("http://127.0.0.1:9464").get("/api/v1/targets")  # doctest: +SKIP
    """

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            base_url = f"http://{base_url}"
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise MlprofError(
                f"cannot reach the sidecar at {self.base_url} ({exc}): is `mlprof serve` "
                "running there (--url / MLPROF_LISTEN)?"
            ) from None
        if response.status_code in (401, 403):
            raise ConfigError(f"{self.base_url}: {_detail(response)} (set MLPROF_AUTH_TOKEN)")
        if response.status_code >= 400:
            raise InputError(f"{method} {path}: {response.status_code} {_detail(response)}")
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise MlprofError(
                f"{method} {path}: {response.status_code} answer is not JSON ({kind}: "
                f"{response.text[:100]!r}): is {self.base_url} an mlprof sidecar (--url)?"
            ) from None

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, json={k: v for k, v in body.items() if v is not None})

    def close(self) -> None:
        self._http.close()


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    detail = data.get("detail", data) if isinstance(data, dict) else data
    if isinstance(detail, list):  # FastAPI's validation errors: say each field and why
        return "; ".join(_validation_line(item) for item in detail[:5])
    return detail if isinstance(detail, str) else str(detail)[:300]


def _validation_line(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)[:100]
    loc = [str(p) for p in item.get("loc", ())]
    # FastAPI's loc starts with where the value came from: the field name says enough.
    where = ".".join(loc[1:] if len(loc) > 1 and loc[0] in ("query", "body", "path") else loc)
    return f"{where or 'request'}: {item.get('msg', 'invalid')}"
