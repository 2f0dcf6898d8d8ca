"""Running rollouts: one gateway session per rollout, the agent through the runtime.

``RolloutRunner.run_one`` owns a session from creation to drop, so no turn is
ever recorded outside a session the trainer knows about, and a rollout's
rows are stamped with its status and reward (``core.rollout.outcome.classify``)
before they leave. ``run_groups`` runs groups of rollouts through any ``run_one``
(the runner's, or the eval's ``EndpointRunner``'s).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.errors import ConfigError
from core.gateway.harvest import Harvest
from core.rollout.outcome import (
    DEFAULT_EXCLUDE_ON,
    DEFAULT_MAX_ABS_REWARD,
    DEFAULT_REWARD_TIMEOUT_S,
    FAULT_KEYS,
    RolloutOutcome,
    check_exclude_on,
    classify,
    lost,
    shard_lost,
)
from core.rollout.sessions import InProcessSessions, SessionHost, ShardLost
from core.types import RolloutRequest, RolloutResult, RolloutStatus, SamplingParams


@dataclass(frozen=True)
class RolloutLimits:
    """How many rollouts run at once, how long each may take, and what makes one unfit."""

    max_concurrency: int
    """Most rollouts the runtime runs at once (``trainer.max_concurrent_rollouts``)."""
    timeout_s: float
    """Deadline of one rollout (``trainer.rollout_timeout_s``)."""
    exclude_on: Iterable[str] = DEFAULT_EXCLUDE_ON
    """Session faults that turn an ``ok`` rollout into ``sampler_error``
    (``EXCLUDE_ON_CHOICES``; see ``classify``)."""
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
    """Rewards larger in magnitude become ``invalid_reward``."""
    reward_timeout_s: float = DEFAULT_REWARD_TIMEOUT_S
    """How long a ``reward_pending`` rollout waits for its reward to be posted
    (``gateway.late_rewards``) before it becomes ``reward_timeout``."""

    def __post_init__(self) -> None:
        if not (self.reward_timeout_s >= 0 and math.isfinite(self.reward_timeout_s)):
            raise ConfigError(f"reward.timeout_s must be a finite number >= 0, got {self.reward_timeout_s!r}")
        check_exclude_on(self.exclude_on)
        if not (self.max_abs_reward > 0 and math.isfinite(self.max_abs_reward)):
            raise ConfigError(
                f"trainer.max_abs_reward must be a finite number > 0, got {self.max_abs_reward!r}"
            )


class RolloutRunner:
    """Runs rollouts through a runtime against the gateway, at most
    ``limits.max_concurrency`` at once."""

    def __init__(
        self,
        *,
        gateway: Any,
        base_url: str,
        runtime: Any,
        model_id: str,
        limits: RolloutLimits,
        sessions: SessionHost | None = None,
    ) -> None:
        """``sessions``: where rollouts' sessions live; None: ``gateway`` in this process,
        which agents reach at ``base_url`` (``gateway.shards`` > 1 passes its shards)."""
        self.gateway = gateway
        self.base_url = base_url
        self.sessions: SessionHost = sessions or InProcessSessions(gateway, base_url)
        self.runtime = runtime
        self.model_id = model_id
        self.limits = limits
        self.timeout_s = limits.timeout_s
        self.exclude_on = check_exclude_on(limits.exclude_on)
        self.max_abs_reward = limits.max_abs_reward
        self.reward_timeout_s = limits.reward_timeout_s
        self._sem = asyncio.Semaphore(limits.max_concurrency)
        self._active: dict[str, str] = {}
        """Rollout id -> group id of the rollouts the runtime is running."""

    async def run_one(
        self, payload: dict[str, Any], *, group_id: str, sampling: SamplingParams
    ) -> RolloutOutcome:
        """Run one rollout in its own session; ``sampling.seed``, when set, seeds it.

        Never raises for the agent's or the session's faults: they come back as
        the outcome's status (see ``classify``).
        """
        rollout_id = uuid.uuid4().hex
        async with self._sem:
            try:
                sid, base_url = await self.sessions.open(
                    sampling, {"rollout_id": rollout_id, "group_id": group_id}
                )
            except ShardLost as exc:
                return self._unhosted(payload, rollout_id, group_id, str(exc))
            request = RolloutRequest(
                rollout_id=rollout_id,
                group_id=group_id,
                payload=payload,
                base_url=base_url,
                session_id=sid,
                model_id=self.model_id,
                timeout_s=self.timeout_s,
            )
            self._active[rollout_id] = group_id
            late = self.sessions.late_rewards
            if late is not None:
                late.expect(rollout_id)
            try:
                result = await self.runtime.run_rollout(request)
            except BaseException:
                # Cancelled (the async pool closing) or a runtime breaking its contract:
                # the rollout will never wait for a reward, so stop accepting one.
                if late is not None:
                    late.forget(rollout_id)
                raise
            finally:
                self._active.pop(rollout_id, None)
                found, faults, shard_error = await self._close_session(sid)
        if result.status is RolloutStatus.REWARD_PENDING and late is not None and not shard_error:
            result = await self._await_reward(late, result)  # (a lost shard's rollout waits for nothing)
        elif late is not None:
            late.forget(rollout_id)
        if shard_error:
            result = shard_lost(result, shard_error)
        elif faults.get("session_lost"):
            result = lost(result)
        else:
            result = classify(
                result, faults, exclude_on=self.exclude_on, max_abs_reward=self.max_abs_reward
            )
        reward = result.reward if result.status is RolloutStatus.OK else None
        rows = [
            replace(r, rollout_id=rollout_id, group_id=group_id, reward=reward, status=result.status)
            for r in found.rows
        ]
        return RolloutOutcome(
            request=request, result=result, rows=rows, faults=faults, conversation=found.conversation
        )

    async def _await_reward(self, late: Any, result: RolloutResult) -> RolloutResult:
        """The pending ``result`` with its posted reward, or ``reward_timeout``."""
        reward = await late.wait(result.rollout_id, self.reward_timeout_s)
        if reward is None:
            return RolloutResult(
                result.rollout_id,
                RolloutStatus.REWARD_TIMEOUT,
                metrics=result.metrics,
                error=(
                    f"the agent left its reward pending and none was posted within reward.timeout_s="
                    f"{self.reward_timeout_s:g} (POST /admin/rollouts/{result.rollout_id}/reward to the "
                    "gateway the agent called, or LateRewards.post in the trainer's process)"
                ),
                elapsed_s=result.elapsed_s,
            )
        return replace(result, status=RolloutStatus.OK, reward=reward, error=None)

    async def cancel_groups(self, group_ids: Iterable[str]) -> None:
        """Ask the runtime to stop every running rollout of ``group_ids`` (their
        ``run_one`` then returns a failed outcome)."""
        wanted = set(group_ids)
        for rollout_id, group_id in list(self._active.items()):
            if group_id in wanted:
                await self.runtime.cancel(rollout_id)

    async def _close_session(self, sid: str) -> tuple[Harvest, dict[str, int], str]:
        """Finish and drop ``sid``; what it recorded, its fault counters, and why its
        gateway shard is gone ('' while it answers).

        Tolerates a session someone else already finished (its rows are still there) or
        dropped (its trace is lost: ``session_lost``), so one odd session never fails the
        step it belongs to.
        """
        lost_faults = {"session_lost": 1, "model_turns": 0}
        try:
            found = await self.sessions.harvest(sid)
        except ShardLost as exc:
            return Harvest(rows=[]), lost_faults, str(exc)
        if found is None:  # dropped (admin DELETE): nothing left to read
            return Harvest(rows=[]), lost_faults, ""
        faults = {key: int(found.counters.get(key, 0)) for key in FAULT_KEYS}
        faults["model_turns"] = int(found.counters.get("model_turns", 0))
        if found.finished_early:
            faults["finished_early"] = 1
        if found.lost:
            faults["session_lost"] = 1
        return found, faults, ""

    def _unhosted(self, payload: dict[str, Any], rollout_id: str, group_id: str, why: str) -> RolloutOutcome:
        """The outcome of a rollout no gateway could open a session for: it never ran."""
        request = RolloutRequest(
            rollout_id=rollout_id, group_id=group_id, payload=payload, base_url="", session_id="",
            model_id=self.model_id, timeout_s=self.timeout_s,
        )
        result = RolloutResult(rollout_id, RolloutStatus.CRASHED, error=f"no gateway session: {why}")
        return RolloutOutcome(request=request, result=result, rows=[], faults={"session_lost": 1, "model_turns": 0})

    async def run_groups(
        self,
        payloads: Sequence[tuple[str, dict[str, Any]]],
        *,
        group_size: int,
        sampling: SamplingParams,
        on_done: Callable[[RolloutOutcome], None] | None = None,
    ) -> list[RolloutOutcome]:
        """``group_size`` rollouts of each ``(group_id, payload)``, all concurrently."""
        return await run_groups(
            self.run_one, payloads, group_size=group_size, sampling=sampling, on_done=on_done
        )


RunOne = Callable[..., Awaitable[RolloutOutcome]]
"""A runner's ``run_one(payload, *, group_id, sampling)``."""


async def run_groups(
    run_one: RunOne,
    payloads: Sequence[tuple[str, dict[str, Any]]],
    *,
    group_size: int,
    sampling: SamplingParams,
    on_done: Callable[[RolloutOutcome], None] | None = None,
) -> list[RolloutOutcome]:
    """``group_size`` rollouts of each ``(group_id, payload)`` through ``run_one``, all
    concurrently, in order; what both ``RolloutRunner`` and the eval's ``EndpointRunner`` do.

    A seeded ``sampling`` gives rollout i its own seed (``seed + 7919 * i``), so a run
    repeats and no two samples of a prompt share a stream.
    """

    async def one(group_id: str, payload: dict[str, Any], seed: int | None) -> RolloutOutcome:
        outcome = await run_one(payload, group_id=group_id, sampling=replace(sampling, seed=seed))
        if on_done is not None:
            on_done(outcome)
        return outcome

    def seed_of(index: int) -> int | None:
        return None if sampling.seed is None else (sampling.seed + 7_919 * index) % (2**63)

    tasks = [
        one(gid, p, seed_of(i * group_size + k))
        for i, (gid, p) in enumerate(payloads)
        for k in range(group_size)
    ]
    return list(await asyncio.gather(*tasks))
