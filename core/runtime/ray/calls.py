"""Awaiting Ray actor calls from asyncio, shared by the runtime's agent actors and the
gateway's per-node shards (``core.rollout.node_shards``). Does not import ray."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["awaitable", "call_all"]


async def awaitable(ref: Any) -> Any:
    """Await a Ray ``ObjectRef`` (a coroutine, so that it can be gathered or wrapped in a task)."""
    return await ref


async def call_all(refs: Iterable[Any], timeout_s: float) -> None:
    """Wait for every call at most ``timeout_s`` in all, before the caller kills the actors:
    a call still running is cancelled, a failed one's error retrieved (a dead or lost actor
    cannot answer; the kill that follows is what ends it)."""
    calls = [asyncio.ensure_future(awaitable(ref)) for ref in refs]
    if not calls:
        return
    await asyncio.wait(calls, timeout=timeout_s)
    for call in calls:
        if not call.done():
            call.cancel()
        elif not call.cancelled():
            call.exception()
