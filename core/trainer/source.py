"""Where a training step's rollouts come from: the seam between ``sync`` and ``async``.

- ``RolloutSource``: what the step asks of either mode (``take`` a batch, ``settle``
  after the update, ``idle_metrics`` at the end of the step, ``finish`` after the
  last step);
- ``StepBatch``: the rollouts a step trains on and the flow metrics so far;
- ``SyncSource`` (``trainer.mode=sync``): each step runs its own rollouts, then trains;
- ``PoolSource`` (``trainer.mode=async``): a step takes the first ``batch_size``
  groups that finished from a running ``RolloutPool`` (none is dropped for staleness);
- ``resumed_pool``: where a resumed run's pool starts (``PoolResume``).

So the step in ``core.trainer.loop`` has no mode branches: both report the same
flow keys (``time/trainer_idle``, ``time/sampler_idle``, ``rollouts/finished``).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import ConfigError
from core.rollout import RolloutOutcome
from core.rundir.checkpoint import Checkpoint
from core.trainer.pool import PoolResume, RolloutPool, Versions


@dataclass(frozen=True)
class StepBatch:
    """The rollouts one step trains on."""

    outcomes: list[RolloutOutcome]
    """Every rollout of the step's groups."""
    data_indices: list[int]
    """The data rows the groups ran (``data/batch``)."""
    waited: float
    """Seconds the trainer waited for them (``time/rollout``)."""
    flow: dict[str, Any] = field(default_factory=dict)
    """Flow metrics so far; the step and the source add to it."""
    untrained: list[RolloutOutcome] = field(default_factory=list)
    """Rollouts that finished but do not train (async: groups dropped as too stale):
    the step still counts them in ``rollouts/*``, ``reward/*`` and the failure guard."""


@dataclass(frozen=True)
class SourceEnd:
    """What a source leaves after the last step."""

    state: dict[str, Any] | None
    """Its part of the final checkpoint (None: nothing to save)."""
    metrics: dict[str, Any]
    """Keys of the final record."""


class RolloutSource(Protocol):
    """Gives each training step its rollouts."""

    async def take(self) -> StepBatch:
        """The next step's rollouts."""
        ...

    async def settle(self, batch: StepBatch) -> dict[str, Any] | None:
        """After the update: add the source's counts to ``batch.flow``; returns the
        source's part of a checkpoint taken now (None: nothing to save)."""
        ...

    def idle_metrics(self, batch: StepBatch, step_time: float) -> dict[str, Any]:
        """End of the step: flow keys only known once the step's time is."""
        ...

    async def finish(self) -> SourceEnd:
        """After the last step: stop producing rollouts."""
        ...


class SyncSource:
    """``trainer.mode=sync``: each step runs its rollouts, then trains on them.

    Args:
        run: Draws the step's rows and runs their groups (the trainer's ``_rollouts``).
        drawn: The rows ``run`` drew last.
    """

    def __init__(
        self, run: Callable[[], Awaitable[list[RolloutOutcome]]], drawn: Callable[[], list[int]]
    ) -> None:
        self._run = run
        self._drawn = drawn

    async def take(self) -> StepBatch:
        t0 = time.perf_counter()
        outcomes = await self._run()
        waited = time.perf_counter() - t0
        return StepBatch(outcomes, list(self._drawn()), waited, {"time/trainer_idle": waited})

    async def settle(self, batch: StepBatch) -> dict[str, Any] | None:
        return None

    def idle_metrics(self, batch: StepBatch, step_time: float) -> dict[str, Any]:
        # The sampler has no training rollout while the step trains, syncs,
        # checkpoints and evaluates.
        return {
            "time/sampler_idle": max(0.0, step_time - batch.waited),
            "rollouts/finished": len(batch.outcomes),
        }

    async def finish(self) -> SourceEnd:
        return SourceEnd(None, {})


class PoolSource:
    """``trainer.mode=async``: steps take finished groups from a running ``RolloutPool``.

    Args:
        pool: The started pool.
        batch_size: Groups per step.
        version: The weights being trained: the backend's current weight version, or with
            several policies each policy's (a group's turns are aged against their own policy's).
        reruns: Groups a resumed run started again (reported once, by the first step).
        exclude_failed: ``algorithm.exclude_failed``: whether failed rollouts train (at
            reward 0, when False), so whether they age their group.
    """

    def __init__(
        self,
        pool: RolloutPool,
        *,
        batch_size: int,
        version: Callable[[], Versions],
        reruns: int = 0,
        exclude_failed: bool = True,
    ) -> None:
        self.pool = pool
        self._exclude_failed = exclude_failed
        self._batch_size = batch_size
        self._version = version
        self._reruns = reruns

    async def take(self) -> StepBatch:
        groups, waited = await self.pool.take(self._batch_size)
        version = self._version()
        flow: dict[str, Any] = {
            "async/wasted_rollouts": 0,  # nothing is dropped for staleness
            "async/group_staleness_max": max(
                (g.staleness(version, exclude_failed=self._exclude_failed) for g in groups), default=0
            ),
            "async/groups": [g.seq for g in groups],
            "async/rerun": sum(1 for g in groups if g.rerun),
            "time/trainer_idle": waited,
        }
        if self._reruns:
            flow["async/rerun_on_resume"], self._reruns = self._reruns, 0
        outcomes = [o for g in groups for o in g.outcomes]
        return StepBatch(outcomes, [g.data_index for g in groups], waited, flow)

    async def settle(self, batch: StepBatch) -> dict[str, Any] | None:
        flow = batch.flow
        await self.pool.release(len(flow["async/groups"]))
        # Cut the started-groups log and snapshot the pool at one instant, so the
        # checkpoint and metrics.jsonl agree on which groups started before it.
        flow["data/started"], finished, flow["time/sampler_idle"] = self.pool.pop_flow()
        flow["rollouts/finished"] = finished
        flow["async/in_flight"] = self.pool.rollouts_in_flight
        return self.pool.state()

    def idle_metrics(self, batch: StepBatch, step_time: float) -> dict[str, Any]:
        return {}  # counted by settle, when the pool was cut

    async def finish(self) -> SourceEnd:
        # Groups still running are not trained: saved as pending (a resumed run
        # with more steps runs them again) and counted here.
        state = self.pool.state()
        discarded = await self.pool.close()
        return SourceEnd(state, {"async/discarded_at_end": discarded, **wasted_metrics(self.pool.discarded)})

    async def aclose(self) -> None:
        await self.pool.close()


def wasted_metrics(outcomes: list[RolloutOutcome]) -> dict[str, int]:
    """``async/wasted_rollouts`` (finished or cancelled, never trained) and its status mix
    (``async/wasted/<status>``)."""
    out = {"async/wasted_rollouts": len(outcomes)}
    for status, n in sorted(Counter(o.result.status.value for o in outcomes).items()):
        out[f"async/wasted/{status}"] = n
    return out


def resumed_pool(saved: dict[str, Any] | None, ckpt: Checkpoint, *, mode: str, batch_size: int) -> PoolResume:
    """The pool's start from checkpoint ``ckpt`` (``saved``: its ``async`` part, None for sync).

    Raises:
        ConfigError: a checkpoint with groups in flight resumed by ``trainer.mode=sync``.
    """
    if saved is not None and saved.get("pending") and mode != "async":
        raise ConfigError(
            f"checkpoint {ckpt.path} was written by trainer.mode=async with "
            f"{len(saved['pending'])} groups in flight; resume it with trainer.mode=async "
            "(a sync run would skip their rows)"
        )
    if saved is None:
        # A sync checkpoint: number the groups on from its steps, so their seeds
        # continue the synchronous sequence (see the trainer's _group_sampling).
        return PoolResume(next_seq=ckpt.step * batch_size, pending=[])
    resume = PoolResume(
        next_seq=int(saved["next_seq"]), pending=[(int(a), int(b)) for a, b in saved["pending"]]
    )
    if resume.pending:
        print(f"{len(resume.pending)} groups were in flight at the checkpoint; running them again", file=sys.stderr)
    return resume
