"""``HandlerPool``: the threads that run sync handlers, with the accounting a health check needs.

A Python thread cannot be stopped. When an invocation running a sync handler
is cancelled (the rollout timed out, the trainer gave up), the asyncio side
ends at once but the handler keeps its thread until it returns, which a stuck
handler never does. Enough of those and the pool is exhausted: every new sync
invocation waits in the queue until its own timeout. The pool therefore counts
threads in use, threads *abandoned* (still running for an invocation that was
cancelled) and calls waiting for a thread, so ``/ping`` can say the process
cannot serve and a runtime can replace it. A call cancelled while still queued
never runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass
class _Call:
    started: bool = False
    finished: bool = False
    dropped: bool = False
    """The invocation awaiting it was cancelled."""


@dataclass(frozen=True)
class PoolState:
    """A snapshot of the pool (served under ``threads`` by ``/ping``)."""

    max: int
    """Threads the pool may start."""
    busy: int
    """Threads running a call now."""
    abandoned: int
    """Busy threads whose invocation was already cancelled (stuck handlers)."""
    queued: int
    """Calls waiting for a thread."""

    @property
    def exhausted(self) -> bool:
        """Every thread is busy: a new sync handler would wait for one."""
        return self.busy >= self.max

    @property
    def stuck(self) -> bool:
        """Exhausted with at least one thread held by a cancelled invocation: the process
        cannot serve until a handler that nobody waits for returns, which may be never.
        A pool that is merely full of live work is busy, not stuck."""
        return self.exhausted and self.abandoned > 0

    def as_dict(self) -> dict[str, int]:
        """The JSON form."""
        return {
            "max": self.max,
            "busy": self.busy,
            "abandoned": self.abandoned,
            "queued": self.queued,
        }


class HandlerPool:
    """A dedicated thread pool (asyncio's default has only ``min(32, cores + 4)`` threads).

    Args:
        max_threads: Most threads; calls beyond wait in a queue.
    """

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._busy = 0
        self._abandoned = 0
        self._queued = 0

    def state(self) -> PoolState:
        """Current counts."""
        with self._lock:
            return PoolState(self.max_threads, self._busy, self._abandoned, self._queued)

    async def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on a pool thread and return its result.

        Cancelling the caller drops a queued call (it never runs) and marks a
        running one abandoned until it returns.
        """
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_threads, thread_name_prefix="agent")
        call = _Call()

        def work() -> Any:
            with self._lock:
                if call.dropped:
                    return None
                self._queued -= 1
                call.started = True
                self._busy += 1
            try:
                return fn()
            finally:
                with self._lock:
                    call.finished = True
                    self._busy -= 1
                    if call.dropped:
                        self._abandoned -= 1

        with self._lock:
            self._queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        except asyncio.CancelledError:
            with self._lock:
                if not call.finished and not call.dropped:
                    call.dropped = True
                    if call.started:
                        self._abandoned += 1
                    else:
                        self._queued -= 1
            raise

    def shutdown(self) -> None:
        """Drop queued calls; running threads end when their handlers return."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
