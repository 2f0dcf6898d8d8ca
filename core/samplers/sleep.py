"""Putting a fleet's engines to sleep while the trainer steps, and waking them for the push.

Defines ``FleetSleeper``. With ``sampler.sleep_during_train`` (``trainer.mode=sync``
only: in async mode the servers sample while the trainer trains) the loop asks
every server in rotation to free its GPU memory before an optimizer step, so a
trainer sharing the GPU gets it, and wakes them before the new weights are
pushed. Per engine, as their sources serve it:

- **vLLM** (started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``,
  which serves the routes; ``vllm/entrypoints/serve/dev/sleep/api_router.py``):
  ``POST /sleep?level=<1|2>`` (level 1 offloads the weights to CPU memory and
  discards the KV cache; level 2 discards the weights too), ``POST /wake_up``,
  and ``GET /is_sleeping`` (``{"is_sleeping": bool}``), read after each to check
  that the engine did what was asked (the routes answer 200 with no body).
- **SGLang** (started with ``--enable-memory-saver``; ``http_server.py``):
  ``POST /release_memory_occupation`` and ``POST /resume_memory_occupation``
  with ``{}`` (no ``tags``: weights and KV cache both); 2xx is success.

Level 1 is the default: it keeps a CPU copy of the weights, so a server woken
without a push (the run stopping mid-step: ``aclose`` wakes it) still serves
its last weights. Level 2 frees that CPU memory too; it is safe here only
because every wake is followed by a push of the full weights from disk
(``sampler.sleep_level=2``; a fleet never takes LoRA adapters).

While the fleet sleeps the sampler holds new requests (``HttpSampler.hold``)
and the health checks stop (a sleeping engine may fail them), so nothing is
sent to a sleeping server. A server that fails to sleep is warned about once
and left awake (its memory stays reserved: a trainer sized for the freed
memory may then run out of it). A server that fails to wake is retired like
one that failed a push (``WeightPusher.retire``): with none left the push that
follows raises ``RunAborted`` naming each server's reason.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import httpx

from core.samplers.http_pool import ServerState
from core.samplers.weights import WeightPusher, engine_answer

__all__ = ["SLEEP_LEVELS", "FleetSleeper"]

SLEEP_LEVELS = (1, 2)
"""vLLM's sleep levels (``sampler.sleep_level``); SGLang has one."""
VLLM_SLEEP_PATH = "/sleep"
VLLM_WAKE_PATH = "/wake_up"
VLLM_IS_SLEEPING_PATH = "/is_sleeping"
SGLANG_RELEASE_PATH = "/release_memory_occupation"
SGLANG_RESUME_PATH = "/resume_memory_occupation"


class _SleepFailed(Exception):
    """One server did not sleep or wake; the message says how."""


class FleetSleeper:
    """Sleeps and wakes every server of a pusher's sampler (see the module docstring)."""

    def __init__(self, pusher: WeightPusher, *, level: int = 1, timeout_s: float = 600.0) -> None:
        """Args:
        pusher: The fleet's weight pusher: its sampler's servers sleep; it retires those
            that fail to wake.
        level: vLLM's sleep level (1 or 2; SGLang ignores it).
        timeout_s: Limit for one server's sleep or wake (its calls together).
        """
        self.pusher = pusher
        self.sampler = pusher.sampler
        self.level = level
        self.timeout_s = timeout_s
        self.asleep: list[ServerState] = []
        """Servers put to sleep and not yet woken."""
        self.sleep_s = 0.0
        """Seconds spent putting servers to sleep since ``take_times``."""
        self.wake_s = 0.0
        """Seconds spent waking them since ``take_times``."""
        self._warned: set[str] = set()

    @property
    def protocol(self) -> str:
        return self.sampler.config.kind

    async def sleep(self) -> None:
        """Put every server in rotation to sleep (no-op when already asleep); a server that
        fails is warned about once and stays awake."""
        if self.asleep:
            return
        t0 = time.perf_counter()
        self.sampler.hold()  # nothing reaches a sleeping engine; ``wake`` releases
        try:
            await self.sampler.pool.stop()  # a sleeping engine may fail a health check; restarted by the next request
            servers = [s for s in self.sampler.pool.servers if s.healthy and not s.needs_weights]
            results = await asyncio.gather(*(self._call(s, wake=False) for s in servers), return_exceptions=True)
            for server, result in zip(servers, results, strict=True):
                if result is None:
                    self.asleep.append(server)
                else:
                    self._warn(server, _reason(result))
        except BaseException:
            self.sampler.release()
            raise
        finally:
            self.sleep_s += time.perf_counter() - t0

    async def wake(self, version: int) -> None:
        """Wake the servers ``sleep`` put to sleep, before weight ``version`` is pushed; a
        server that fails is retired (the push then goes to the others)."""
        servers, self.asleep = self.asleep, []
        t0 = time.perf_counter()
        try:
            results = await asyncio.gather(*(self._call(s, wake=True) for s in servers), return_exceptions=True)
            for server, result in zip(servers, results, strict=True):
                if result is not None:
                    self.pusher.retire(server, _reason(result), version, what="to wake up for the weight update to")
        finally:
            self.sampler.release()
            self.wake_s += time.perf_counter() - t0

    def take_times(self) -> tuple[float, float]:
        """``(sleep_s, wake_s)`` since the last call; both 0 on a step that did neither."""
        out = (self.sleep_s, self.wake_s)
        self.sleep_s = self.wake_s = 0.0
        return out

    def _warn(self, server: ServerState, reason: str) -> None:
        if server.url in self._warned:
            return
        self._warned.add(server.url)
        fix = (
            "start vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"
            if self.protocol == "vllm"
            else "start SGLang with --enable-memory-saver"
        )
        print(
            f"warning: {self.sampler.protocol} server {server.url} did not go to sleep before training "
            f"(sampler.sleep_during_train: {reason}); it stays awake and keeps its GPU memory, so a trainer "
            f"that counts on that memory may run out of it ({fix}). Not repeated for this server",
            file=sys.stderr,
        )

    async def _call(self, server: ServerState, *, wake: bool) -> None:
        steps = self._vllm(server, wake=wake) if self.protocol == "vllm" else self._sglang(server, wake=wake)
        try:
            await asyncio.wait_for(steps, self.timeout_s)
        except TimeoutError:
            raise _SleepFailed(f"not done within sampler.update_timeout_s={self.timeout_s:g}s") from None

    async def _post(self, server: ServerState, route: str, body: dict[str, Any] | None = None) -> None:
        resp = await self.sampler.client().post(
            server.url + route, json=body, headers=self.sampler.base_headers, timeout=self.timeout_s
        )
        self._check(resp, "POST", route)

    def _check(self, resp: httpx.Response, method: str, route: str) -> Any:
        hint = (
            "it is served with VLLM_SERVER_DEV_MODE=1"
            if self.protocol == "vllm"
            else "this SGLang has no memory release; upgrade it"
        )
        return engine_answer(resp, f"{method} {route}", missing_hint=hint, error=_SleepFailed)

    async def _vllm(self, server: ServerState, *, wake: bool) -> None:
        route = VLLM_WAKE_PATH if wake else f"{VLLM_SLEEP_PATH}?level={self.level}"
        await self._post(server, route)
        resp = await self.sampler.client().get(
            server.url + VLLM_IS_SLEEPING_PATH, headers=self.sampler.base_headers, timeout=self.timeout_s
        )
        data = self._check(resp, "GET", VLLM_IS_SLEEPING_PATH)
        sleeping = data.get("is_sleeping") if isinstance(data, dict) else None
        if sleeping is not (not wake):  # True after a sleep, False after a wake
            raise _SleepFailed(
                f"GET {VLLM_IS_SLEEPING_PATH} answered {resp.text[:200]!r} after POST {route.split('?')[0]}"
                + ("" if wake else " (start vLLM with --enable-sleep-mode)")
            )

    async def _sglang(self, server: ServerState, *, wake: bool) -> None:
        await self._post(server, SGLANG_RESUME_PATH if wake else SGLANG_RELEASE_PATH, {})


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _SleepFailed):
        return str(exc)
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    raise exc
