"""Pushing new weights to a fleet of vLLM or SGLang servers through the engines' own APIs.

Defines ``WeightPusher`` and ``PushReport``. After each optimizer step the
trainer writes the weights into a directory every server can read (Hugging
Face layout: ``config.json`` plus ``*.safetensors``) and calls
``WeightPusher.push(path, version)``. Per engine:

- **SGLang**: ``POST /update_weights_from_disk`` with
  ``{"model_path", "weight_version": "<N>", "abort_all_requests": false,
  "flush_cache": true}`` (its ``UpdateWeightFromDiskReqInput``; ``true`` with
  ``abort_on_push``: running requests answer their tokens so far with finish
  reason ``abort`` and the sampler sends them again, a partial rollout); the answer is
  ``{"success", "message", "num_paused_requests"}`` (400 when ``success`` is
  false). Then ``GET /get_weight_version`` must say ``"<N>"``: the version
  every ``/generate`` answer then carries in ``meta_info.weight_version``.
- **vLLM** (started with ``VLLM_SERVER_DEV_MODE=1``, which serves
  ``/collective_rpc``): ``POST /collective_rpc`` ``{"method": "update_config",
  "args": [{"model_config": {"model": "<dir>"}}]}`` points the workers at the
  directory, ``{"method": "reload_weights"}`` loads it in place, and
  ``POST /reset_prefix_cache`` drops KV blocks computed with the old weights.
  vLLM refuses that reset while running requests hold blocks (HTTP 409 since
  it checks; older builds answered 200 without resetting), so a refusal is
  retried with ``?reset_running_requests=true`` (the running requests are
  preempted and recomputed on the new weights), ``reset_attempts`` times in
  all with a backoff; a server still refusing is retired. Every vLLM request
  also carries ``cache_salt="tracerl-v<version>"`` (``VLLMSampler``), so even a
  reset that silently did nothing cannot hand KV of old weights to a turn
  labelled with the new version. vLLM reports no weight version, so the
  sampler's own ``weight_version`` is set once every server acknowledged.
  With ``abort_on_push`` (partial rollouts) the update is framed by
  ``POST /pause?mode=abort&clear_cache=true`` (running requests answer their
  tokens so far with finish reason ``abort``; new ones wait unscheduled;
  ``{"status": "paused"}``) and ``POST /resume`` (``{"status": "resumed"}``),
  vLLM's RL pause API (dev mode), and the sampler sends the aborted ones again
  once the push is over.

While a push with ``abort_on_push`` runs, the sampler holds new requests and
continuations (``HttpSampler.quiesce``) until the new version is set, so none is
sent mid-push under the old version's label. Other processes that sample from
the same servers (the gateway shards, ``gateway.shards``) follow the push as
``PushFollower``s: with ``abort_on_push`` each holds, acknowledged, before the
first server is paused, and every push ends with each told the new version and
the servers it updated and retired, before this sampler's own hold is released.

A server that fails any of this (HTTP error, ``success: false``, a version
other than the one pushed, a refused cache reset, not done within
``update_timeout_s``: all of that server's calls together) is taken out of
rotation for good (``ServerPool.retire``): it would serve stale weights, and
a health check must not bring it back. A server that is down when a push
starts (unhealthy, or refusing connections) is not retired: it is marked
``needs_weights`` and gets no traffic until it is back. The pusher is the
pool's ``readmit`` hook: a server coming back from unhealthy (it may have
restarted with its launch weights) gets the last pushed weights before any
traffic (SGLang: only when ``/get_weight_version`` says it lacks them). With
no server left the push raises ``RunAborted`` naming every server's reason.
The sampler's ``weight_version`` moves only after every server in rotation
reports the new version, so the caller rebinds the gateway only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from core.errors import RunAborted
from core.samplers.http_pool import ServerState
from core.samplers.http_sampler import HttpSampler

__all__ = ["PushFollower", "PushReport", "WeightPusher"]

log = logging.getLogger(__name__)

SGLANG_UPDATE_PATH = "/update_weights_from_disk"
SGLANG_VERSION_PATH = "/get_weight_version"
VLLM_RPC_PATH = "/collective_rpc"
VLLM_RESET_CACHE_PATH = "/reset_prefix_cache"
VLLM_PAUSE_PATH = "/pause"
VLLM_RESUME_PATH = "/resume"
RESET_REFUSED = (409, 500, 503)
"""Answers with which vLLM refuses a prefix-cache reset (409 since it checks; 500 on some builds)."""


def engine_answer(resp: httpx.Response, call: str, *, missing_hint: str, error: type[Exception]) -> Any:
    """An engine's JSON answer to ``call`` (``"POST /route"``; None when empty or not JSON),
    or ``error`` naming the call: for a 404 with ``missing_hint`` (the route exists only with
    some launch flag or version), for any other status of 300 and above with the engine's
    own message."""
    if resp.status_code == 404:
        raise error(f"{call} answered 404 ({missing_hint})")
    try:
        data = resp.json() if resp.content else None
    except ValueError:
        data = None
    if resp.status_code >= 300:
        detail = data.get("message") or data.get("error") if isinstance(data, dict) else resp.text[:300]
        raise error(f"{call} answered HTTP {resp.status_code}: {detail!r}")
    return data


class _PushFailed(Exception):
    """One server failed the update; the message says how."""


@dataclass
class PushReport:
    """What one push did."""

    version: int
    """The version pushed."""
    updated: list[str] = field(default_factory=list)
    """Servers now serving ``version``."""
    retired: dict[str, str] = field(default_factory=dict)
    """Servers taken out of rotation by this push, with the reason."""
    seconds: float = 0.0
    """Wall time of the push (all servers at once)."""
    waiting: list[str] = field(default_factory=list)
    """Servers down during the push: no traffic until they are back and re-pushed."""
    readmitted: int = 0
    """Servers re-pushed since the previous push, on coming back from unhealthy."""


class PushFollower(Protocol):
    """Another sampler of the same servers that must move with each push (a gateway shard's)."""

    async def hold(self, version: int) -> None:
        """Before a push that aborts (``abort_on_push``): return once the follower sends
        nothing more until ``release``. A follower that cannot must stop sampling for good
        (and say so) rather than raise: the push goes on."""

    async def release(self, report: PushReport | None) -> None:
        """After every push: the version pushed and the servers it updated and retired
        (``report``; None: the push failed and the version stays), then send again."""


class WeightPusher:
    """Loads a weights directory into every server of an ``HttpSampler`` and checks the version."""

    def __init__(
        self,
        sampler: HttpSampler,
        *,
        update_timeout_s: float = 600.0,
        reset_attempts: int = 3,
        reset_backoff_s: float = 0.5,
    ) -> None:
        """Push through ``sampler``'s servers (its protocol, URLs and API key); become its
        pool's ``readmit`` hook.

        Args:
            sampler: The HTTP sampler whose servers get the weights.
            update_timeout_s: Limit for one server's whole update.
            reset_attempts: vLLM prefix-cache resets tried before the server is retired.
            reset_backoff_s: Wait before the third and later reset attempts; doubles each time.
        """
        self.sampler = sampler
        self.update_timeout_s = update_timeout_s
        self.reset_attempts = max(1, reset_attempts)
        self.reset_backoff_s = reset_backoff_s
        self.retired: dict[str, str] = {}
        """Every server retired so far, with the reason (kept for the abort message)."""
        self.current: tuple[str, int] | None = None
        """``(path, version)`` of the last push: what a server coming back gets."""
        self.readmitted = 0
        """Servers re-pushed on coming back, since the last ``push`` report."""
        self._lock = asyncio.Lock()
        self.followers: list[PushFollower] = []
        """Held before each push that aborts and told its outcome after every push."""
        sampler.pool.readmit = self.readmit

    @property
    def protocol(self) -> str:
        return self.sampler.config.kind

    async def push(self, path: str, version: int) -> PushReport:
        """Load ``path`` as weight ``version`` on every server in rotation.

        Raises:
            RunAborted: no server is left after this push (each one's reason named).
        """
        async with self._lock:
            return await self._push_all(path, version)

    async def _push_all(self, path: str, version: int) -> PushReport:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        pool = self.sampler.pool
        report = PushReport(version=version, readmitted=self.readmitted)
        self.readmitted = 0
        servers = []
        for server in list(pool.servers):
            if server.healthy:
                servers.append(server)
            else:  # down: it gets these weights when it is back, before any traffic
                pool.mark_needs_weights(server, f"down during the push of version {version}: {server.last_error}")
                report.waiting.append(server.url)
        aborting = self.sampler.config.abort_on_push
        settled: PushReport | None = None
        try:
            if aborting:  # nothing reaches a server from here until the release
                await self.sampler.quiesce()
                await asyncio.gather(*(f.hold(version) for f in self.followers))
            results = await asyncio.gather(
                *(self._push_one(s, path, version, pause=aborting) for s in servers), return_exceptions=True
            )
            report.seconds = loop.time() - t0
            settled = self._settle(report, servers, results, path)
            return settled
        finally:
            try:
                await asyncio.gather(*(f.release(settled) for f in self.followers))
            finally:
                self.sampler.release()

    def _settle(
        self, report: PushReport, servers: list[ServerState], results: list[Any], path: str
    ) -> PushReport:
        """Record each server's outcome; move the sampler to the version when any took it."""
        pool = self.sampler.pool
        version = report.version
        for server, result in zip(servers, results, strict=True):
            if result is None:
                server.needs_weights = False
                report.updated.append(server.url)
                continue
            if isinstance(result, httpx.ConnectError):
                # Refused: the server is down (or restarting), not broken; re-pushed when back.
                pool.mark_down(server, f"ConnectError: {result}")
                pool.mark_needs_weights(server, f"unreachable during the push of version {version}: {result}")
                report.waiting.append(server.url)
                continue
            if not isinstance(result, _PushFailed | httpx.HTTPError):
                raise result
            reason = str(result) or type(result).__name__
            if isinstance(result, httpx.HTTPError):
                reason = f"{type(result).__name__}: {reason}"
            self.retire(server, reason, version)
            report.retired[server.url] = reason
        if not report.updated:
            waiting = "; ".join(f"{u}: down" for u in report.waiting)
            raise RunAborted(
                f"no inference server is left: every {self.sampler.protocol} server in sampler.urls "
                f"failed the weight update to version {version} or was down "
                f"({'; '.join([*(f'{u}: {r}' for u, r in self.retired.items()), *([waiting] if waiting else [])])}). "
                "Check the servers' logs, that each can read sampler.weights_dir and serves the trained "
                "model, or use sampler=backend"
            )
        self.current = (path, version)
        self.sampler.weight_version = version
        self.sampler.pushed = True
        return report

    async def readmit(self, server: ServerState) -> bool:
        """Make ``server``, back from unhealthy, serve the last pushed weights before any
        traffic (``ServerPool.readmit``). True when it does; a server that fails the
        update is retired, one that is unreachable again stays out for the next check."""
        async with self._lock:
            if server not in self.sampler.pool.servers:
                return False  # retired meanwhile
            if self.current is None:
                return True  # nothing pushed yet: its launch weights are the run's weights
            path, version = self.current
            try:
                if self.protocol == "sglang" and await self._sglang_version(server) == str(version):
                    return True  # it was unreachable, not restarted: it still has the weights
                await self._push_one(server, path, version)
            except httpx.TransportError as exc:
                self.sampler.pool.mark_down(server, f"{type(exc).__name__}: {exc}")
                return False
            except (_PushFailed, httpx.HTTPError) as exc:
                self.retire(server, f"re-push on coming back failed: {exc}", version)
                return False
            self.readmitted += 1
            print(
                f"note: {self.sampler.protocol} server {server.url} came back and got weight version "
                f"{version} before any traffic",
                file=sys.stderr,
            )
            return True

    def retire(self, server: ServerState, reason: str, version: int, *, what: str = "the weight update to") -> None:
        """Take ``server`` out of rotation for good, saying why on stderr (``what`` it failed)."""
        self.retired[server.url] = reason
        self.sampler.pool.retire(server, f"{what} version {version} failed: {reason}")
        left = len(self.sampler.pool.servers)
        print(
            f"warning: {self.sampler.protocol} server {server.url} failed {what} "
            f"version {version} and is out of rotation ({reason}); {left} server(s) left",
            file=sys.stderr,
        )

    async def _push_one(self, server: ServerState, path: str, version: int, *, pause: bool = False) -> None:
        """One server's whole update; ``update_timeout_s`` bounds all its calls together
        (vLLM takes three, five with ``pause``), not each one. ``pause``: vLLM aborts its
        running requests first (``abort_on_push``; SGLang reads the flag in its update)."""
        client = self.sampler.client()
        steps = (
            self._sglang(client, server, path, version)
            if self.protocol == "sglang"
            else self._vllm(client, server, path, pause=pause)
        )
        try:
            await asyncio.wait_for(steps, self.update_timeout_s)
        except TimeoutError:
            raise _PushFailed(f"the update did not finish within sampler.update_timeout_s={self.update_timeout_s:g}s") from None

    async def _post(self, client: Any, server: ServerState, route: str, body: dict[str, Any]) -> Any:
        resp = await client.post(
            server.url + route,
            json=body,
            headers=self.sampler.base_headers,
            timeout=self.update_timeout_s,
        )
        return self._answer(resp, "POST", route)

    def _answer(self, resp: httpx.Response, method: str, route: str) -> Any:
        hint = (
            "start vLLM with VLLM_SERVER_DEV_MODE=1 (it serves /collective_rpc and /reset_prefix_cache only then)"
            if self.protocol == "vllm"
            else "this SGLang has no disk weight update; upgrade it"
        )
        return engine_answer(resp, f"{method} {route}", missing_hint=hint, error=_PushFailed)

    async def _sglang(self, client: Any, server: ServerState, path: str, version: int) -> None:
        body = {
            "model_path": path,
            "weight_version": str(version),
            "abort_all_requests": bool(self.sampler.config.abort_on_push),
            "flush_cache": True,
        }
        data = await self._post(client, server, SGLANG_UPDATE_PATH, body)
        if not isinstance(data, dict) or data.get("success") is not True:
            raise _PushFailed(f"POST {SGLANG_UPDATE_PATH} did not succeed: {str(data)[:300]!r}")
        reported = await self._sglang_version(server)
        if reported != str(version):
            raise _PushFailed(
                f"GET {SGLANG_VERSION_PATH} reports weight_version={reported!r} after the update, not {str(version)!r}"
            )

    async def _sglang_version(self, server: ServerState) -> str:
        """What ``GET /get_weight_version`` says (``"default"``: its launch weights)."""
        resp = await self.sampler.client().get(
            server.url + SGLANG_VERSION_PATH, headers=self.sampler.base_headers, timeout=self.update_timeout_s
        )
        info = self._answer(resp, "GET", SGLANG_VERSION_PATH)
        return str(info.get("weight_version") if isinstance(info, dict) else None)

    async def _vllm(self, client: Any, server: ServerState, path: str, *, pause: bool = False) -> None:
        resumed = False
        try:
            if pause:
                await self._vllm_pause(client, server)
            await self._post(
                client,
                server,
                VLLM_RPC_PATH,
                {"method": "update_config", "args": [{"model_config": {"model": path}}]},
            )
            await self._post(client, server, VLLM_RPC_PATH, {"method": "reload_weights"})
            await self._reset_prefix_cache(client, server)
            if pause:
                resumed = True
                data = self._answer(await self._control(client, server, VLLM_RESUME_PATH), "POST", VLLM_RESUME_PATH)
                if not isinstance(data, dict) or data.get("status") != "resumed":
                    raise _PushFailed(f"POST {VLLM_RESUME_PATH} answered {str(data)[:200]!r}, not status 'resumed'")
        finally:
            if pause and not resumed:
                # The update failed (the server is retired): requests it queued while paused
                # would otherwise hang until request_timeout_s.
                with contextlib.suppress(httpx.HTTPError):
                    await self._control(client, server, VLLM_RESUME_PATH)

    async def _control(self, client: Any, server: ServerState, route: str) -> httpx.Response:
        """POST one of vLLM's pause/resume routes (query parameters, no body)."""
        return await client.post(server.url + route, headers=self.sampler.base_headers, timeout=self.update_timeout_s)  # type: ignore[no-any-return]

    async def _vllm_pause(self, client: Any, server: ServerState) -> None:
        """``POST /pause?mode=abort``: the running requests answer their tokens so far
        (finish reason ``abort``), new ones wait; the KV and prefix caches are cleared."""
        route = VLLM_PAUSE_PATH + "?mode=abort&clear_cache=true"
        resp = await self._control(client, server, route)
        if resp.status_code == 404:
            raise _PushFailed(
                f"POST {VLLM_PAUSE_PATH} answered 404: this vLLM has no pause API for sampler.abort_on_push "
                "(it is served with VLLM_SERVER_DEV_MODE=1 on versions that have it); upgrade vLLM or set "
                "sampler.abort_on_push=false"
            )
        data = self._answer(resp, "POST", VLLM_PAUSE_PATH)
        if not isinstance(data, dict) or data.get("status") != "paused":
            raise _PushFailed(f"POST {VLLM_PAUSE_PATH} answered {str(data)[:200]!r}, not status 'paused'")

    async def _reset_prefix_cache(self, client: Any, server: ServerState) -> None:
        """Drop the KV blocks computed with the old weights, or fail the server.

        vLLM resets only when no running request holds blocks; it says so with HTTP
        409 (500 on some builds). The first try leaves running requests alone; the
        next ones preempt them (``reset_running_requests=true``: recomputed on the new
        weights), with a backoff from the third try on.
        """
        refusals: list[str] = []
        for attempt in range(self.reset_attempts):
            if attempt >= 2 and self.reset_backoff_s:
                await asyncio.sleep(self.reset_backoff_s * 2 ** (attempt - 2))
            query = "" if attempt == 0 else "?reset_running_requests=true"
            resp = await client.post(
                server.url + VLLM_RESET_CACHE_PATH + query,
                headers=self.sampler.base_headers,
                timeout=self.update_timeout_s,
            )
            if resp.status_code < 300:
                return
            if resp.status_code not in RESET_REFUSED:
                self._answer(resp, "POST", VLLM_RESET_CACHE_PATH)  # raises, naming the answer
            refusals.append(f"HTTP {resp.status_code}{' (' + query[1:] + ')' if query else ''}")
        raise _PushFailed(
            f"POST {VLLM_RESET_CACHE_PATH} was refused {len(refusals)} times ({', '.join(refusals)}): "
            "KV computed with the old weights would be reused under the new version"
        )
