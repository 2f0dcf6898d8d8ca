"""Rewards that arrive after the rollout finished.

An agent that cannot score itself (a human rating, a CI run, a slow verifier)
returns ``{"reward_pending": true}``; its rollout comes back ``reward_pending``
and the runner waits up to ``reward.timeout_s`` for someone to post the reward
for its rollout id (``_config.rollout_id`` in the agent's payload) through
``POST /admin/rollouts/{id}/reward`` on the gateway or ``LateRewards.post``.
A reward posted before the wait starts is kept until it does.

With ``gateway.shards`` the rollouts wait in the trainer's book and each shard keeps a
``ShardLateRewards``: it takes posts for the rollouts whose sessions it opened and holds them
until the trainer has collected them (``POST /admin/late_rewards/take``, about twice a second
while a rollout waits; ``core.rollout.shard_rewards``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from core.errors import ConfigError

__all__ = ["LateRewards", "ShardLateRewards", "Taken", "check_reward"]

log = logging.getLogger("core.gateway.late_rewards")

SHARD_MEMORY = 100_000
"""Rollout ids a shard remembers having opened a session for (the oldest are forgotten first)."""


def check_reward(rollout_id: str, reward: object) -> float:
    """``reward`` as a float; ``ConfigError`` when it is not a finite number."""
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ConfigError(f"the reward posted for rollout {rollout_id!r} must be a finite number, got {reward!r}")
    return float(reward)


@dataclass
class LateRewards:
    """Rewards posted for rollouts, keyed by rollout id (one per gateway)."""

    poll_s: float = 0.02
    """How often a waiting rollout checks (posts may come from another thread)."""
    _expected: set[str] = field(default_factory=set)
    _posted: dict[str, float] = field(default_factory=dict)
    _expired: dict[str, float] = field(default_factory=dict)
    waiting: int = 0
    """Rollouts waiting in ``wait`` now (a sharded trainer collects posts only then)."""

    def opened(self, rollout_id: str) -> None:
        """A session of ``rollout_id`` was opened on this gateway; only a shard's book keeps it."""

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
        value = check_reward(rollout_id, reward)
        if rollout_id not in self._expected:
            if rollout_id in self._expired:
                raise ConfigError(
                    f"rollout {rollout_id!r} stopped waiting for its reward (reward.timeout_s passed); "
                    "it was counted as reward_timeout"
                )
            raise ConfigError(f"no running or pending rollout has id {rollout_id!r}")
        self._posted[rollout_id] = value

    async def wait(self, rollout_id: str, timeout_s: float) -> float | None:
        """The posted reward of ``rollout_id``, or None after ``timeout_s`` (then forgotten)."""
        deadline = time.monotonic() + timeout_s
        self.waiting += 1
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
            self.waiting -= 1
            self.forget(rollout_id)


@dataclass
class Taken:
    """What a shard hands the trainer: the rewards not yet acknowledged, and the number of the
    last post among them (the trainer sends it back as ``ack`` once it has them)."""

    rewards: dict[str, float]
    through: int


@dataclass
class ShardLateRewards(LateRewards):
    """A gateway shard's book: it keeps each reward posted for a rollout whose session it opened
    until the trainer acknowledges having it (``take``); the rollouts wait in the trainer's book.

    A post for a rollout this shard never opened a session for is refused (404), naming where
    it must go: a reward posted to the wrong shard would otherwise never be delivered. A take
    whose answer is lost (a reset connection, a timeout) loses nothing: the rewards stay until
    a later take acknowledges them.
    """

    _opened: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _outbox: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Rollout id -> (number of the post, reward), in the order posted."""
    _posts: int = 0

    def opened(self, rollout_id: str) -> None:
        self._opened[rollout_id] = None
        if len(self._opened) > SHARD_MEMORY:
            self._opened.popitem(last=False)

    def post(self, rollout_id: str, reward: float) -> None:
        """Keep the reward of ``rollout_id`` for the trainer (a second post replaces the first).

        Raises:
            ConfigError: the reward is not a finite number, or no session of that rollout
                was opened on this shard.
        """
        value = check_reward(rollout_id, reward)
        if rollout_id not in self._opened:
            raise ConfigError(
                f"no session of rollout {rollout_id!r} was opened on this gateway shard (gateway.shards); "
                "post its reward to the shard its agent called (the base URL the agent was given), or in "
                "the trainer's process (LateRewards.post on the trainer's gateway.late_rewards)"
            )
        self._posts += 1
        self._outbox.pop(rollout_id, None)
        self._outbox[rollout_id] = (self._posts, value)
        if len(self._outbox) > SHARD_MEMORY:  # no trainer took them for a long time
            oldest = next(iter(self._outbox))
            del self._outbox[oldest]
            log.warning("gateway shard: dropped the late reward of rollout %r: more than %d rewards were "
                        "waiting for the trainer to take them", oldest, SHARD_MEMORY)

    def take(self, ack: int = 0) -> Taken:
        """Forget the rewards of posts up to number ``ack`` (the trainer has them), and hand
        over the rest."""
        if ack:
            self._outbox = {rid: entry for rid, entry in self._outbox.items() if entry[0] > ack}
        return Taken({rid: value for rid, (_, value) in self._outbox.items()}, self._posts)
