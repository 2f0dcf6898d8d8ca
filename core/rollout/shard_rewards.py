"""Late rewards posted to gateway shards, delivered to the trainer's book.

With ``gateway.shards`` a ``reward_pending`` rollout's reward is posted to the shard its agent
called (``POST /admin/rollouts/{id}/reward``), while the rollout waits in the trainer's book
(``core.gateway.late_rewards.LateRewards``). ``RewardCollector`` brings the rewards over: every
``POLL_S`` while a rollout waits it takes what each live shard keeps, from all of them at once
(``POST /admin/late_rewards/take``), and acknowledges what it received on its next take, so a
take whose answer is lost loses nothing; a shard still answering an earlier take is skipped, so
one that hangs delays only its own rewards.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from core.errors import ConfigError
from core.gateway.late_rewards import LateRewards

__all__ = ["POLL_S", "TAKE_TIMEOUT_S", "RewardCollector"]

POLL_S = 0.5
"""How often, while a rollout waits for its late reward, the trainer takes the shards' rewards."""
TAKE_TIMEOUT_S = 10.0
"""How long one shard may take to answer a take (it then keeps its rewards for the next)."""


class Shard(Protocol):
    """What a take needs of a shard (``core.rollout.shards.Shard`` has it)."""

    index: int
    root_url: str

    @property
    def alive(self) -> bool: ...

    def name(self) -> str: ...


class RewardCollector:
    """Takes the late rewards posted to ``shards`` into ``book`` (``run``, a background task).

    Args:
        http: The trainer's admin client for the shards (its token set).
        shards: The shards; the list may grow (shards started later are taken from too).
        book: The trainer's book, where the rollouts wait.
    """

    def __init__(self, http: Any, shards: Sequence[Shard], book: LateRewards) -> None:
        self.book = book
        self._http = http
        self._shards = shards
        self._acked: dict[int, int] = {}
        """Shard index -> ``through`` of the last answer received from it (by index, never by
        URL: a later shard may listen where a dead one did, and must not get its acks)."""
        self._failing: set[int] = set()
        """Indexes of the shards whose last take failed (warned once until one succeeds)."""

    async def run(self) -> None:
        """Each ``POLL_S`` while a rollout waits, take from every live shard that is not still
        answering an earlier take (so a slow shard delays only its own rewards), until the
        client closes."""
        taking: dict[int, asyncio.Task[None]] = {}
        try:
            while not self._http.is_closed:
                await asyncio.sleep(POLL_S)
                taking = {i: t for i, t in taking.items() if not t.done()}
                if not self.book.waiting:
                    continue
                for shard in list(self._shards):
                    if shard.alive and shard.index not in taking:
                        taking[shard.index] = asyncio.create_task(self.take(shard))
        finally:
            for task in taking.values():
                task.cancel()

    async def take(self, shard: Shard) -> None:
        """Acknowledge what ``shard`` last handed over, and deliver what it hands over now."""
        index = shard.index
        try:
            async with asyncio.timeout(TAKE_TIMEOUT_S):  # in all (httpx's timeout is per phase)
                resp = await self._http.post(
                    shard.root_url + "/admin/late_rewards/take", json={"ack": self._acked.get(index, 0)}
                )
            resp.raise_for_status()
            answer = resp.json()
            rewards, through = dict(answer["rewards"]), int(answer["through"])
        except Exception as exc:  # its rewards stay on it; the other shards' are taken meanwhile
            if self._http.is_closed or index in self._failing:
                return
            self._failing.add(index)
            print(f"warning: collecting late rewards from {shard.name()} failed: {exc!r}; they stay on the "
                  "shard until a take succeeds (this warning is not repeated until then)", file=sys.stderr)
            return
        self._failing.discard(index)
        self._acked[index] = through
        for rollout_id, reward in rewards.items():
            try:
                self.book.post(rollout_id, reward)
            except ConfigError as exc:  # its rollout stopped waiting, or never ran under this trainer
                print(f"warning: a late reward posted to {shard.name()} was not delivered: {exc}", file=sys.stderr)
