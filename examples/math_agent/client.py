"""One OpenAI client per process, a cheap per-session view of it: ``gateway_client``.

Building an ``openai.AsyncOpenAI`` builds an httpx client and its TLS context
(milliseconds of CPU: docs/performance.md, ``openai_client``);
doing that on every model call costs a step of 256 rollouts seconds of CPU. ``with_options(api_key=...)`` returns a
client that shares the connection pool and costs microseconds, and the api key
must differ per session (it is the gateway session id), so: one pool per event
loop and base URL, one view per session. Never close a view: that would close
the shared pool.
"""

from __future__ import annotations

import asyncio
import weakref

import openai

from core.agent import ModelConfig

_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, openai.AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


def gateway_client(cfg: ModelConfig) -> openai.AsyncOpenAI:
    """A client for ``cfg``'s endpoint and session, sharing this loop's connection pool.

    Keyed by the running loop because an httpx pool must not cross event loops
    (``python -m core.agent`` runs one loop; tests may run several). Retries are
    off so a refused session fails the rollout at once.
    """
    pools = _POOLS.setdefault(asyncio.get_running_loop(), {})
    pool = pools.get(cfg.base_url)
    if pool is None:
        pool = pools[cfg.base_url] = openai.AsyncOpenAI(
            base_url=cfg.base_url, api_key="per-session", max_retries=0
        )
    return pool.with_options(api_key=cfg.api_key)
