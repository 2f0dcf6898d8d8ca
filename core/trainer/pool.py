"""Continuous rollouts for ``trainer.mode=async``.

``RolloutPool`` keeps starting GRPO groups (``group_size`` rollouts of one
payload, in the seeded data order) while there is room, and a step takes the
first ``batch_size`` groups that finished. Room is
``(max_staleness + 1) * batch_size`` groups started and not yet trained (the
step being trained counts until its weights are published), further capped
by ``max_rollouts_in_flight``. With ``max_staleness=0`` that is exactly the
synchronous schedule: one batch starts on the current weights and the next
one only after the update. The room bounds staleness at admission (AReaL's
bound); every group that finishes trains, none is dropped for staleness: a
straggler older than the room is corrected per token by the importance weight
against its recorded behaviour logprobs (``algorithm.tis_cap``) and, with
``trainer.max_staleness_per_token``, its older turns become context
(``mask_stale_turns``). A group's staleness is the trained weight version
minus the oldest weight version of any token its trainable rollouts
generated (``ok`` ones, and failed ones with rows under ``exclude_failed=false``,
which trains them at reward 0) (later turns of a rollout may run on newer weights than its first,
and a turn interrupted by a weight update goes on under the new ones: each of
its segments carries its own version). With several policies every turn is aged
against its own policy's version (``Versions``): a policy that did not step does
not age its turns.

Everything runs on the event loop, so state changes between ``await`` points
are atomic; ``state()`` is a consistent snapshot for checkpoints (the data
cursor plus every group started and not yet trained, which a resumed run
starts again with the same seeds).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from core.rollout import RolloutOutcome, RolloutRunner
from core.rollout.data import DataOrder
from core.types import SamplingParams

Versions: TypeAlias = int | Mapping[str, int]
"""The weight version being trained: one for every turn (one policy), or each policy's by
name (several: a turn is aged against its own policy's version, ``TurnSpan.policy``)."""


def current_version(version: Versions, policy: str) -> int:
    """The version ``policy``'s turns are aged against.

    Raises:
        KeyError: ``version`` maps versions by policy and has none for ``policy``.
    """
    if isinstance(version, int):
        return version
    if policy not in version:
        raise KeyError(f"a turn of policy {policy!r} trains, but the run's policies are {sorted(version)}")
    return version[policy]


def trains(outcome: RolloutOutcome, *, exclude_failed: bool = True) -> bool:
    """Whether ``outcome`` trains: ``ok``, or failed with rows under ``exclude_failed=False``
    (scored 0.0, as ``core.algo.advantages`` does)."""
    return outcome.ok or (not exclude_failed and bool(outcome.rows))


def oldest_version(outcomes: Sequence[RolloutOutcome]) -> int | None:
    """Lowest weight version of any generated token in ``outcomes`` (None: no turn)."""
    versions = [g.weight_version for o in outcomes for r in o.rows for t in r.turns for g in t.version_segments()]
    return min(versions) if versions else None


def rollout_age(outcome: RolloutOutcome, version: Versions) -> int | None:
    """Optimizer steps between the weights being trained and the oldest generated token of
    ``outcome``, each token against its own turn's policy (None: no turn)."""
    ages = [
        max(0, current_version(version, t.policy) - g.weight_version)
        for r in outcome.rows
        for t in r.turns
        for g in t.version_segments()
    ]
    return max(ages) if ages else None


def rollout_staleness(outcomes: Sequence[RolloutOutcome], version: Versions) -> list[int]:
    """Each rollout's age (``rollout_age``: its oldest generated token's), for rollouts with turns."""
    return [age for o in outcomes if (age := rollout_age(o, version)) is not None]


def token_staleness(outcomes: Sequence[RolloutOutcome], version: Versions) -> tuple[float, int]:
    """Mean and most optimizer steps between the weights being trained (``version``, each turn's
    own policy's) and the weights of each trained token (``loss_mask`` 1) of ``outcomes``,
    read per segment; ``(0.0, 0)`` without one."""
    total = count = most = 0
    for o in outcomes:
        for r in o.rows:
            for t in r.turns:
                now = current_version(version, t.policy)
                for g in t.version_segments():
                    n = sum(r.loss_mask[g.start : g.end])
                    if n:
                        age = max(0, now - g.weight_version)
                        total, count, most = total + n * age, count + n, max(most, age)
    return (total / count if count else 0.0), most


def interrupted_turns(outcomes: Sequence[RolloutOutcome]) -> int:
    """Turns of ``outcomes`` a weight update interrupted (more than one segment)."""
    return sum(len(t.segments) > 1 for o in outcomes for r in o.rows for t in r.turns)


def mask_stale_turns(
    outcomes: Sequence[RolloutOutcome], version: Versions, max_staleness: int
) -> tuple[list[RolloutOutcome], int]:
    """``outcomes`` with every token more than ``max_staleness`` steps older than the weights
    being trained (``version``; with several policies, the token's turn's policy's) made context.

    A token's version is its turn's segment's (a turn interrupted by a weight update
    and continued on newer weights may be stale in its first segment only). Such
    tokens get loss weight 0 (``loss_mask`` 0, in copies of the rows), so they
    condition the later ones but are not trained; the rollout, its reward and its
    group's advantage stay. Returns the outcomes and how many tokens were masked.
    """
    out: list[RolloutOutcome] = []
    masked = 0
    for o in outcomes:
        rows = []
        for r in o.rows:
            stale = [
                g
                for t in r.turns
                for g in t.version_segments()
                if current_version(version, t.policy) - g.weight_version > max_staleness
            ]
            if not stale:
                rows.append(r)
                continue
            mask = list(r.loss_mask)
            for g in stale:
                masked += sum(mask[g.start : g.end])
                mask[g.start : g.end] = [0] * (g.end - g.start)
            rows.append(replace(r, loss_mask=mask))
        out.append(replace(o, rows=rows) if rows != o.rows else o)
    return out, masked


@dataclass
class FinishedGroup:
    """A group whose rollouts have all finished."""

    seq: int
    """Start number (0, 1, ...): the group's place in the data order and its seed."""
    data_index: int
    """Row of the training set."""
    outcomes: list[RolloutOutcome]
    """Its ``group_size`` rollouts."""
    rerun: bool = False
    """Started again after a resume (it was in flight at the checkpoint)."""

    def staleness(self, version: Versions, *, exclude_failed: bool = True) -> int:
        """Optimizer steps between the weights being trained (``version``, each turn's own
        policy's) and the oldest generated token of the group's rollouts that will train (a
        failed member that started early does not age it, unless ``exclude_failed`` is
        False: then it trains at reward 0 and counts)."""
        return max(
            rollout_staleness([o for o in self.outcomes if trains(o, exclude_failed=exclude_failed)], version),
            default=0,
        )


@dataclass
class _Flow:
    """Counters read (and reset) once per step."""

    started: list[int] = field(default_factory=list)
    """Data indices of groups started for the first time."""
    finished_rollouts: int = 0
    sampler_idle_s: float = 0.0


@dataclass(frozen=True)
class PoolSize:
    """How big a group is and how much the pool may have started."""

    group_size: int
    """Rollouts per group."""
    max_groups: int
    """Most groups started and not yet released by ``release``."""
    max_rollouts: int
    """Most rollouts in flight (at least ``group_size`` is used)."""


@dataclass(frozen=True)
class PoolResume:
    """Where a resumed run's pool starts."""

    next_seq: int
    """Number of the next group to start (seeds follow from it)."""
    pending: list[tuple[int, int]]
    """``(seq, data_index)`` of the groups in flight at the checkpoint, to run again."""


class RolloutPool:
    """Starts groups continuously; ``take`` hands a step its groups.

    Args:
        runner: Runs the rollouts.
        rows: The training payloads.
        order: The seeded data order (advanced as groups start).
        size: Group size and the pool's room.
        sampling: Session sampling settings of group ``seq`` (seeded by it).
        start: Where a resumed run's pool starts (default: group 0, nothing to rerun).
    """

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        rows: Sequence[dict[str, Any]],
        order: DataOrder,
        size: PoolSize,
        sampling: Callable[[int], SamplingParams],
        start: PoolResume | None = None,
    ) -> None:
        start = start or PoolResume(next_seq=0, pending=[])
        self.runner = runner
        self.rows = rows
        self.order = order
        self.group_size = size.group_size
        self.max_groups = size.max_groups
        self.max_rollouts = max(size.max_rollouts, size.group_size)
        self.sampling = sampling
        self.next_seq = start.next_seq
        self._requeue = sorted(start.pending)
        self._cond = asyncio.Condition()
        self._running: dict[int, tuple[int, asyncio.Task[None]]] = {}
        self._ready: list[FinishedGroup] = []
        self._training = 0
        self._rollouts_in_flight = 0
        self._error: BaseException | None = None
        self._producer: asyncio.Task[None] | None = None
        self._closed = False
        self._flow = _Flow()
        self._idle_since: float | None = time.perf_counter()
        self.discarded: list[RolloutOutcome] = []
        """Rollouts ``close`` threw away: finished but untrained, or cancelled."""

    # -- capacity -----------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Groups started and not yet released (running, finished or being trained)."""
        return len(self._running) + len(self._ready) + self._training

    @property
    def rollouts_in_flight(self) -> int:
        return self._rollouts_in_flight

    def _can_start(self) -> bool:
        return (
            not self._closed
            and self._error is None
            and self.outstanding < self.max_groups
            and self._rollouts_in_flight + self.group_size <= self.max_rollouts
        )

    def start(self) -> None:
        """Start the producer task."""
        self._producer = asyncio.create_task(self._produce(), name="tracerl-rollout-pool")

    async def _produce(self) -> None:
        while True:
            async with self._cond:
                await self._cond.wait_for(self._can_start)
                self._start_next()

    def _start_next(self) -> None:
        rerun = bool(self._requeue)
        if rerun:
            seq, index = self._requeue.pop(0)
        else:
            seq, index = self.next_seq, self.order.next_batch(1)[0]
            self.next_seq += 1
            self._flow.started.append(index)
        self._rollouts_in_flight += self.group_size
        self._busy()
        task = asyncio.create_task(self._run_group(seq, index, rerun), name=f"tracerl-group-{seq}")
        self._running[seq] = (index, task)

    def _busy(self) -> None:
        if self._idle_since is not None:
            self._flow.sampler_idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None

    def _rollout_done(self, _outcome: RolloutOutcome) -> None:
        self._rollouts_in_flight -= 1
        self._flow.finished_rollouts += 1
        if self._rollouts_in_flight == 0 and self._idle_since is None:
            self._idle_since = time.perf_counter()

    async def _run_group(self, seq: int, index: int, rerun: bool) -> None:
        try:
            outcomes = await self.runner.run_groups(
                [(f"g{seq}", self.rows[index])],
                group_size=self.group_size,
                sampling=self.sampling(seq),
                on_done=self._rollout_done,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, not an agent fault (those are outcomes): stop the run
            async with self._cond:
                self._running.pop(seq, None)
                self._error = exc
                self._cond.notify_all()
            return
        async with self._cond:
            self._running.pop(seq, None)
            if self._closed:
                self.discarded.extend(outcomes)  # cancelled by close (or finished as it closed)
            else:
                self._ready.append(FinishedGroup(seq, index, outcomes, rerun))
            self._cond.notify_all()

    # -- what a step does ---------------------------------------------------------------

    async def take(self, n: int) -> tuple[list[FinishedGroup], float]:
        """Wait for the first ``n`` finished groups (none is dropped for staleness).

        Returns the groups (by start order) and the seconds waited. Taken groups
        count against the room until ``release``.

        Raises:
            RuntimeError: a group failed outside the agent (a bug); the run stops.
        """
        t0 = time.perf_counter()
        async with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"a rollout group failed: {self._error!r}") from self._error
                if len(self._ready) >= n:
                    break
                await self._cond.wait()
            taken, self._ready = self._ready[:n], self._ready[n:]
            self._training += len(taken)
        return sorted(taken, key=lambda g: g.seq), time.perf_counter() - t0

    async def release(self, n: int) -> None:
        """The step that took ``n`` groups has published its weights: their room is free."""
        async with self._cond:
            self._training -= n
            self._cond.notify_all()

    def pop_flow(self) -> tuple[list[int], int, float]:
        """Data indices started, rollouts finished and sampler idle seconds since the last call."""
        if self._idle_since is not None:  # close the open idle interval at now
            now = time.perf_counter()
            self._flow.sampler_idle_s += now - self._idle_since
            self._idle_since = now
        flow, self._flow = self._flow, _Flow()
        return flow.started, flow.finished_rollouts, flow.sampler_idle_s

    def state(self) -> dict[str, Any]:
        """Checkpoint snapshot: the next start number and every group not yet trained."""
        pending = sorted(
            [(seq, index) for seq, (index, _) in self._running.items()]
            + [(g.seq, g.data_index) for g in self._ready]
            + list(self._requeue)
        )
        return {"next_seq": self.next_seq, "pending": [list(p) for p in pending]}

    async def close(self) -> int:
        """Stop starting groups and cancel the running ones; returns how many were discarded."""
        self._closed = True
        if self._producer is not None:
            self._producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._producer
        discarded = len(self._running) + len(self._ready) + len(self._requeue)
        tasks = [task for _, task in self._running.values()]
        await self.runner.cancel_groups({f"g{seq}" for seq in self._running})
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=10.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        self.discarded.extend(o for g in self._ready for o in g.outcomes)
        self._ready.clear()
        return discarded
