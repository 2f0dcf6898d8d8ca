"""Pushing new weights to a fleet of vLLM or SGLang servers through the engines' own APIs.

Defines ``WeightPusher`` and ``PushReport``. After each optimizer step the
trainer writes the weights into a directory every server can read (Hugging
Face layout: ``config.json`` plus ``*.safetensors``) and calls
``WeightPusher.push(path, version)``. Per engine:

- **SGLang**: ``POST /update_weights_from_disk`` with
  ``{"model_path", "weight_version": "<N>", "abort_all_requests": false,
  "flush_cache": true}`` (its ``UpdateWeightFromDiskReqInput``); the answer is
  ``{"success", "message", "num_paused_requests"}`` (400 when ``success`` is
  false). Then ``GET /get_weight_version`` must say ``"<N>"``: the version
  every ``/generate`` answer then carries in ``meta_info.weight_version``.
- **vLLM** (started with ``VLLM_SERVER_DEV_MODE=1``, which serves
  ``/collective_rpc``): ``POST /collective_rpc`` ``{"method": "update_config",
  "args": [{"model_config": {"model": "<dir>"}}]}`` points the workers at the
  directory, ``{"method": "reload_weights"}`` loads it in place, and
  ``POST /reset_prefix_cache`` drops KV blocks computed with the old weights.
  vLLM reports no weight version, so the sampler's own ``weight_version`` is
  set once every server acknowledged the reload.

A server that fails any of this (HTTP error, ``success: false``, a version
other than the one pushed, not done within ``update_timeout_s``: all of that
server's calls together) is taken out
of rotation for good (``ServerPool.retire``): it would serve stale weights,
and a health check must not bring it back. With none left the push raises
``RunAborted`` naming every server's reason. The sampler's
``weight_version`` moves only after every remaining server reports the new
version, so the caller rebinds the gateway only then.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx

from core.errors import RunAborted
from core.samplers.http_pool import ServerState
from core.samplers.http_sampler import HttpSampler

__all__ = ["PushReport", "WeightPusher"]

log = logging.getLogger(__name__)

SGLANG_UPDATE_PATH = "/update_weights_from_disk"
SGLANG_VERSION_PATH = "/get_weight_version"
VLLM_RPC_PATH = "/collective_rpc"
VLLM_RESET_CACHE_PATH = "/reset_prefix_cache"


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


class WeightPusher:
    """Loads a weights directory into every server of an ``HttpSampler`` and checks the version."""

    def __init__(self, sampler: HttpSampler, *, update_timeout_s: float = 600.0) -> None:
        """Push through ``sampler``'s servers (its protocol, URLs and API key)."""
        self.sampler = sampler
        self.update_timeout_s = update_timeout_s
        self.retired: dict[str, str] = {}
        """Every server retired so far, with the reason (kept for the abort message)."""

    @property
    def protocol(self) -> str:
        return self.sampler.config.kind

    async def push(self, path: str, version: int) -> PushReport:
        """Load ``path`` as weight ``version`` on every server in rotation.

        Raises:
            RunAborted: no server is left after this push (each one's reason named).
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        servers = list(self.sampler.pool.servers)
        results = await asyncio.gather(
            *(self._push_one(s, path, version) for s in servers), return_exceptions=True
        )
        report = PushReport(version=version)
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, _PushFailed | httpx.HTTPError):
                    raise result
                reason = str(result) or type(result).__name__
                if isinstance(result, httpx.HTTPError):
                    reason = f"{type(result).__name__}: {reason}"
                self._retire(server, reason, version)
                report.retired[server.url] = reason
            else:
                report.updated.append(server.url)
        report.seconds = loop.time() - t0
        if not report.updated:
            raise RunAborted(
                f"no inference server is left: every {self.sampler.protocol} server in sampler.urls "
                f"failed the weight update to version {version} "
                f"({'; '.join(f'{u}: {r}' for u, r in self.retired.items())}). Check the servers' logs, "
                "that each can read sampler.weights_dir and serves the trained model, or use sampler=backend"
            )
        self.sampler.weight_version = version
        return report

    def _retire(self, server: ServerState, reason: str, version: int) -> None:
        self.retired[server.url] = reason
        self.sampler.pool.retire(server, f"weight update to version {version} failed: {reason}")
        left = len(self.sampler.pool.servers)
        print(
            f"warning: {self.sampler.protocol} server {server.url} failed the weight update to "
            f"version {version} and is out of rotation ({reason}); {left} server(s) left",
            file=sys.stderr,
        )

    async def _push_one(self, server: ServerState, path: str, version: int) -> None:
        """One server's whole update; ``update_timeout_s`` bounds all its calls together
        (vLLM takes three), not each one."""
        client = self.sampler.client()
        steps = self._sglang(client, server, path, version) if self.protocol == "sglang" else self._vllm(client, server, path)
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
        if resp.status_code == 404:
            hint = (
                "start vLLM with VLLM_SERVER_DEV_MODE=1 (it serves /collective_rpc and /reset_prefix_cache only then)"
                if self.protocol == "vllm"
                else "this SGLang has no disk weight update; upgrade it"
            )
            raise _PushFailed(f"{method} {route} answered 404 ({hint})")
        try:
            data = resp.json() if resp.content else None
        except ValueError:
            data = None
        if resp.status_code >= 300:
            detail = data.get("message") or data.get("error") if isinstance(data, dict) else resp.text[:300]
            raise _PushFailed(f"{method} {route} answered HTTP {resp.status_code}: {detail!r}")
        return data

    async def _sglang(self, client: Any, server: ServerState, path: str, version: int) -> None:
        body = {
            "model_path": path,
            "weight_version": str(version),
            "abort_all_requests": False,
            "flush_cache": True,
        }
        data = await self._post(client, server, SGLANG_UPDATE_PATH, body)
        if not isinstance(data, dict) or data.get("success") is not True:
            raise _PushFailed(f"POST {SGLANG_UPDATE_PATH} did not succeed: {str(data)[:300]!r}")
        resp = await client.get(
            server.url + SGLANG_VERSION_PATH, headers=self.sampler.base_headers, timeout=self.update_timeout_s
        )
        info = self._answer(resp, "GET", SGLANG_VERSION_PATH)
        reported = info.get("weight_version") if isinstance(info, dict) else None
        if str(reported) != str(version):
            raise _PushFailed(
                f"GET {SGLANG_VERSION_PATH} reports weight_version={reported!r} after the update, not {str(version)!r}"
            )

    async def _vllm(self, client: Any, server: ServerState, path: str) -> None:
        await self._post(
            client,
            server,
            VLLM_RPC_PATH,
            {"method": "update_config", "args": [{"model_config": {"model": path}}]},
        )
        await self._post(client, server, VLLM_RPC_PATH, {"method": "reload_weights"})
        await self._post(client, server, VLLM_RESET_CACHE_PATH, {})
