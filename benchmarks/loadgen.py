"""The gateway benchmarks' HTTP load generator: aiohttp, a keep-alive connection per request in flight.

Why not httpx, which the agents' SDKs use by default: the gateway sees the same HTTP/1.1
requests either way, but httpx's connection pool (httpcore 1.0) rescans every queued request
each time it hands out a connection. With a hundred sessions in flight the load generator, not
the gateway, set the pace: ``benchmarks/gateway.py``'s ramp got 38 turns/s at 100 sessions with
the gateway process mostly idle and py-spy finding the benchmark in
``AsyncConnectionPool._assign_requests_to_connections``. aiohttp is already a dependency of
tracerl (``openai[aiohttp]``, the agent processes' transport).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp


class ResponseError(RuntimeError):
    """A non-2xx answer: the status and the start of the body, so a failed run says why."""

    def __init__(self, method: str, url: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {url}: HTTP {status}: {body[:500].decode(errors='replace')}")
        self.status = status


class LoadClient:
    """``async with LoadClient(n) as client``: JSON posts over up to ``n`` pooled connections."""

    def __init__(self, connections: int, timeout_s: float = 600.0) -> None:
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LoadClient:
        connector = aiohttp.TCPConnector(limit=self._connections, limit_per_host=self._connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(
        self, url: str, *, body: bytes | None = None, json_body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """POST ``body`` (bytes of JSON) or ``json_body`` (an object) and return the parsed JSON answer."""
        data = body if body is not None else json.dumps({} if json_body is None else json_body).encode()
        return await self._request("POST", url, data, headers)

    async def get(self, url: str, *, headers: dict[str, str] | None = None) -> Any:
        """GET ``url`` and return the parsed JSON answer."""
        return await self._request("GET", url, None, headers)

    async def delete(self, url: str, *, headers: dict[str, str] | None = None) -> Any:
        """DELETE ``url`` and return the parsed JSON answer."""
        return await self._request("DELETE", url, None, headers)

    async def _request(self, method: str, url: str, data: bytes | None, headers: dict[str, str] | None) -> Any:
        assert self._session is not None, "use LoadClient as `async with LoadClient(n) as client`"
        sent = {"content-type": "application/json", **(headers or {})}
        async with self._session.request(method, url, data=data, headers=sent) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise ResponseError(method, url, resp.status, raw)
            return json.loads(raw) if raw else None
