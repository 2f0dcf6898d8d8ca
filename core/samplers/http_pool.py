"""Several inference servers behind one sampler: sticky routing and health checks.

Defines ``ServerState`` (one server's health bookkeeping) and ``ServerPool``.

Routing is rendezvous (highest-random-weight) hashing of the session key over
the healthy servers: every turn of a session lands on the same server, so its
prefix cache (the whole conversation so far) is reused, and when a server
goes down only the sessions it held move, each to its own next choice, and
they move back once it recovers. No per-session table is kept, so memory does
not grow with the number of sessions the gateway has ever seen.

Health: a background task GETs each server's health path every
``health_interval_s`` with ``health_timeout_s``; ``unhealthy_after``
consecutive failures take a server out of rotation and ``healthy_after``
consecutive successes bring it back. A request that cannot even connect takes
its server out at once (it is certainly unreachable); the checks bring it back.
When every server is out the pool still routes (by the same hash over all of
them): stale health must not turn a brief blip into a total outage.

Weights: a server whose weights are not the current ones (``needs_weights``:
it answered with its launch version, or it was out of rotation and may have
restarted with its launch weights) gets no traffic at all, not even when
every other server is out. When a weight pusher is attached (``readmit``), a
server coming back from unhealthy goes through it before its first request:
the pusher loads the current weights into it (or checks it still has them),
and only then is it back in rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from core.errors import SamplerError

if TYPE_CHECKING:
    from core.http import HTTPClient

__all__ = ["ServerPool", "ServerState"]

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    """One inference server as the pool sees it."""

    url: str
    """Base URL without a trailing slash, e.g. ``http://10.0.0.5:30000``."""
    healthy: bool = True
    """In rotation. Servers start healthy so the first request needs no probe."""
    failures: int = 0
    """Consecutive failed health checks (or 1 after a refused connection)."""
    successes: int = 0
    """Consecutive passed health checks while out of rotation."""
    last_error: str = ""
    """Why the server was last marked down (for error messages and stats)."""
    requests: int = 0
    """Requests sent to this server (for stats and tests)."""
    needs_weights: bool = False
    """Serves weights other than the current ones (restarted with its launch weights,
    or down during a push): routed nothing until the current weights are pushed to it."""


def _weight(url: str, key: str) -> int:
    digest = hashlib.blake2b(f"{url}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ServerPool:
    """Picks a server per session and tracks which servers are up."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        health_path: str = "/health",
        health_interval_s: float = 5.0,
        health_timeout_s: float = 2.0,
        unhealthy_after: int = 2,
        healthy_after: int = 1,
    ) -> None:
        """Create the pool (no task starts until ``ensure_health_checks``).

        Args:
            urls: Server base URLs (scheme, host, port, optional path prefix).
            health_path: Path probed on each server; any 2xx counts as healthy.
            health_interval_s: Seconds between rounds of checks; 0 disables them.
            health_timeout_s: Limit for one check.
            unhealthy_after: Consecutive failed checks that take a server out.
            healthy_after: Consecutive passed checks that bring it back.
        """
        self.servers = [ServerState(u.rstrip("/")) for u in urls]
        self.retired: list[ServerState] = []
        """Servers removed for good (``retire``): they failed a weight update."""
        self.health_path = health_path
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.unhealthy_after = max(1, unhealthy_after)
        self.healthy_after = max(1, healthy_after)
        self._task: asyncio.Task[None] | None = None
        self.readmit: Callable[[ServerState], Awaitable[bool]] | None = None
        """Set by a weight pusher: makes a server coming back from unhealthy (or one that
        ``needs_weights``) serve the current weights; True when it now does."""

    # -- routing --------------------------------------------------------------------

    def ranked(self, key: str) -> list[ServerState]:
        """Servers in preference order for ``key``: healthy ones by hash, then the rest by
        hash; never one that ``needs_weights`` (it would serve other weights)."""
        order = sorted(
            (s for s in self.servers if not s.needs_weights), key=lambda s: _weight(s.url, key), reverse=True
        )
        return [s for s in order if s.healthy] + [s for s in order if not s.healthy]

    def pick(self, key: str, *, avoid: Collection[str] = ()) -> ServerState:
        """The server for session ``key``, skipping URLs in ``avoid`` while others remain.

        Raises:
            SamplerError: no server serves the current weights (each one's reason named).
        """
        ranked = self.ranked(key)
        if not ranked:
            retired = "; ".join(f"{s.url}: {s.last_error}" for s in self.retired)
            waiting = "; ".join(f"{s.url}: {s.last_error}" for s in self.servers if s.needs_weights)
            if waiting:
                raise SamplerError(
                    f"no inference server serves the current weights: {waiting} (each gets the current "
                    f"weights pushed once it passes a health check; retired: {retired or 'none'})"
                )
            raise SamplerError(f"no inference server left in rotation (retired: {retired or 'none'})")
        for server in ranked:
            if server.url not in avoid:
                return server
        return ranked[0]

    # -- health ---------------------------------------------------------------------

    def mark_down(self, server: ServerState, reason: str) -> None:
        """Take ``server`` out of rotation now (it refused a connection)."""
        if server.healthy and len(self.servers) > 1:
            log.warning("inference server %s marked unhealthy: %s", server.url, reason)
        server.healthy = False
        server.failures = max(server.failures, self.unhealthy_after)
        server.successes = 0
        server.last_error = reason

    def mark_needs_weights(self, server: ServerState, reason: str) -> None:
        """Route nothing to ``server`` until the current weights are pushed to it."""
        if not server.needs_weights:
            log.warning("inference server %s gets no traffic until it is re-pushed: %s", server.url, reason)
        server.needs_weights = True
        server.last_error = reason

    def retire(self, server: ServerState, reason: str) -> None:
        """Remove ``server`` for good: no routing, no health checks bring it back.

        For a server that failed a weight update and would serve stale weights.
        """
        log.warning("inference server %s out of rotation: %s", server.url, reason)
        server.healthy = False
        server.last_error = reason
        if server in self.servers:
            self.servers.remove(server)
            self.retired.append(server)

    def record_check(self, server: ServerState, ok: bool, reason: str = "") -> None:
        """Apply one health-check outcome with the configured thresholds.

        With ``readmit`` set, a server coming back is flagged ``needs_weights`` (it may
        have restarted with its launch weights): ``check`` readmits it.
        """
        if ok:
            server.failures = 0
            if not server.healthy:
                server.successes += 1
                if server.successes >= self.healthy_after:
                    server.healthy = True
                    server.successes = 0
                    if self.readmit is not None:
                        server.needs_weights = True
                        server.last_error = "back from unhealthy: it may have restarted with its launch weights"
                    log.info("inference server %s is healthy again", server.url)
            return
        server.successes = 0
        server.failures += 1
        server.last_error = reason
        if server.healthy and server.failures >= self.unhealthy_after:
            server.healthy = False
            log.warning(
                "inference server %s marked unhealthy after %d failed checks: %s",
                server.url,
                server.failures,
                reason,
            )

    async def check(self, client: HTTPClient, server: ServerState) -> bool:
        """Probe one server once and record the outcome; returns whether it passed."""
        try:
            resp = await client.get(server.url + self.health_path, timeout=self.health_timeout_s)
        except httpx.HTTPError as exc:
            self.record_check(server, False, f"{type(exc).__name__}: {exc}".rstrip(": "))
            return False
        ok = 200 <= resp.status_code < 300
        self.record_check(
            server, ok, "" if ok else f"health check answered HTTP {resp.status_code}"
        )
        if ok and server.healthy and server.needs_weights and self.readmit is not None:
            # Before any traffic: the pusher loads the current weights (or retires it).
            if await self.readmit(server):
                server.needs_weights = False
                log.info("inference server %s serves the current weights again", server.url)
        return ok

    async def check_all(self, client: HTTPClient) -> None:
        """One round of checks, all servers at once."""
        await asyncio.gather(*(self.check(client, s) for s in self.servers))

    def ensure_health_checks(self, client: HTTPClient) -> None:
        """Start the background checks in the running loop, once (no-op when disabled)."""
        if self.health_interval_s <= 0:
            return
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        self._task = loop.create_task(self._run(client), name="tracerl-sampler-health")

    async def _run(self, client: HTTPClient) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_all(client)
            except Exception:  # a bug here must not stop the checks for good
                log.exception("health check round failed")

    async def stop(self) -> None:
        """Stop the background checks; idempotent."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        else:  # started in another event loop, which may be closed already
            with contextlib.suppress(RuntimeError):
                task.get_loop().call_soon_threadsafe(task.cancel)

    def snapshot(self) -> list[dict[str, object]]:
        """Health and request counts per server (for stats endpoints and tests)."""
        return [
            {
                "url": s.url,
                "healthy": s.healthy,
                "failures": s.failures,
                "requests": s.requests,
                "needs_weights": s.needs_weights,
                "last_error": s.last_error,
            }
            for s in self.servers
        ]
