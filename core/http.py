"""An HTTP client that stays cheap with hundreds of requests in flight (trainer and agents).

httpcore's pool scans its connections for every request it assigns, so one
pool holding hundreds of concurrent long-polls costs O(connections) per
request: at 256 rollouts in flight that scan was half of the trainer's CPU.
``ShardedClient`` spreads requests round-robin over several small pools.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, TypeAlias

import httpx


class ShardedClient:
    """A few ``httpx.AsyncClient``s behind the subset of its API the runtimes use."""

    def __init__(self, *, max_connections: int, per_shard: int = 4, **kwargs: Any) -> None:
        shards = max(1, math.ceil(max_connections / per_shard))
        # Round-robin can put a few more requests on one shard than the mean: leave room.
        limit = per_shard * 2
        self._clients = [
            httpx.AsyncClient(
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
                **kwargs,
            )
            for _ in range(shards)
        ]
        self._next = itertools.cycle(range(shards))

    def _client(self) -> httpx.AsyncClient:
        return self._clients[next(self._next)]

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self._client().post(url, **kwargs)

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self._client().get(url, **kwargs)

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return await self._client().request(method, url, **kwargs)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


HTTPClient: TypeAlias = httpx.AsyncClient | ShardedClient
"""Either client: the runtimes only call ``get``, ``post`` and ``aclose``."""
