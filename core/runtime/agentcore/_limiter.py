"""``TpsLimiter``: one spacing limiter for every call to an AgentCore Runtime ARN.

AgentCore applies a single transactions-per-second limit per runtime ARN to
InvokeAgentRuntime and StopRuntimeSession together, so both go through the
same limiter. Calls are spaced ``1/rate`` apart (no bursts: a burst is what
gets throttled). The rate adapts: throttling halves it (down to a floor, and
at most once per ``cooldown_s``, since one overload throttles every call in
flight at once), each accepted call wins a little back (up to the configured
limit): the additive-increase / multiplicative-decrease rule TCP uses.
"""

from __future__ import annotations

import asyncio
import time


class TpsLimiter:
    """Spaces calls at most ``limit`` per second, shared by every caller on one event loop.

    Example:
        >>> limiter = TpsLimiter(25)
        >>> await limiter.acquire()   # returns when this caller's slot comes
        >>> limiter.on_success()      # or limiter.on_throttle() after a 429

    Args:
        limit: Highest rate, calls per second.
        min_rate: Lowest rate the limiter backs off to.
        recovery: Fraction of ``limit`` regained per accepted call.
        cooldown_s: Least time between two halvings.
    """

    def __init__(
        self, limit: float, *, min_rate: float = 1.0, recovery: float = 0.02, cooldown_s: float = 1.0
    ) -> None:
        if not limit > 0:
            raise ValueError(f"tps limit must be > 0, got {limit!r}")
        self.limit = float(limit)
        self.min_rate = min(float(min_rate), self.limit)
        self.recovery = recovery
        self.rate = self.limit
        self.cooldown_s = cooldown_s
        self._next = 0.0
        self._last_cut = -float("inf")
        self.acquired = 0
        """Slots handed out so far."""
        self.throttles = 0
        """Throttling responses reported so far."""

    async def acquire(self) -> None:
        """Wait for the next free slot.

        A slot is reserved before sleeping, so waiters never contend for a lock
        and are served in arrival order; a waiter cancelled while sleeping
        wastes its slot, which only makes the rate lower, never higher.
        """
        now = time.monotonic()
        slot = max(now, self._next)
        self._next = slot + 1.0 / self.rate
        self.acquired += 1
        if slot > now:
            await asyncio.sleep(slot - now)

    def on_success(self) -> None:
        """An accepted call: creep back towards ``limit``."""
        if self.rate < self.limit:
            self.rate = min(self.limit, self.rate + self.recovery * self.limit)

    def on_throttle(self) -> None:
        """A throttled call: halve the rate (once per cooldown) and push the next slot out."""
        self.throttles += 1
        now = time.monotonic()
        if now - self._last_cut >= self.cooldown_s:
            self._last_cut = now
            self.rate = max(self.min_rate, self.rate / 2.0)
        self._next = max(self._next, now + 1.0 / self.rate)
