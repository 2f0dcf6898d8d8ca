"""Rewards that arrive after the rollout finished.

An agent that cannot score itself (a human rating, a CI run, a slow verifier)
returns ``{"reward_pending": true}``; its rollout comes back ``reward_pending``
and the runner waits up to ``reward.timeout_s`` for someone to post the reward
for its rollout id (``_config.rollout_id`` in the agent's payload) through
``POST /admin/rollouts/{id}/reward`` on the gateway or ``LateRewards.post``.
A reward posted before the wait starts is kept until it does.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from core.errors import ConfigError

__all__ = ["LateRewards"]


@dataclass
class LateRewards:
    """Rewards posted for rollouts, keyed by rollout id (one per gateway)."""

    poll_s: float = 0.02
    """How often a waiting rollout checks (posts may come from another thread)."""
    _expected: set[str] = field(default_factory=set)
    _posted: dict[str, float] = field(default_factory=dict)
    _expired: dict[str, float] = field(default_factory=dict)

    def expect(self, rollout_id: str) -> None:
        """Accept posts for ``rollout_id`` (the runner calls this when it starts it)."""
        self._expected.add(rollout_id)

    def forget(self, rollout_id: str) -> None:
        """Stop accepting posts for ``rollout_id`` (it finished with a reward, or timed out)."""
        self._expected.discard(rollout_id)
        self._posted.pop(rollout_id, None)

    def post(self, rollout_id: str, reward: float) -> None:
        """Deliver the reward of ``rollout_id``.

        Raises:
            ConfigError: the reward is not a finite number, or no running or pending
                rollout has that id (a typo, or its wait already timed out).
        """
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ConfigError(f"the reward posted for rollout {rollout_id!r} must be a finite number, got {reward!r}")
        if rollout_id not in self._expected:
            if rollout_id in self._expired:
                raise ConfigError(
                    f"rollout {rollout_id!r} stopped waiting for its reward (reward.timeout_s passed); "
                    "it was counted as reward_timeout"
                )
            raise ConfigError(f"no running or pending rollout has id {rollout_id!r}")
        self._posted[rollout_id] = float(reward)

    async def wait(self, rollout_id: str, timeout_s: float) -> float | None:
        """The posted reward of ``rollout_id``, or None after ``timeout_s`` (then forgotten)."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if rollout_id in self._posted:
                    return self._posted[rollout_id]
                if time.monotonic() >= deadline:
                    self._expired[rollout_id] = time.time()
                    if len(self._expired) > 10_000:  # bounded: only for the error message
                        self._expired.pop(next(iter(self._expired)))
                    return None
                await asyncio.sleep(self.poll_s)
        finally:
            self.forget(rollout_id)
