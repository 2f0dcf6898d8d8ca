"""The slow-failure scenario of issue #28, on the real ``RolloutPool``.

A runner whose failed rollouts take 16 turns and successful ones 2 (what agents do:
failures loop to the turn cap, time out, or wait for a reward). Row ``i`` is hard
(``HARD``: a rollout fails with probability 0.6) or easy (0.05); an ok rollout scores
1 with probability 0.5 on a hard row, 0.9 on an easy one. Each turn records the
weight version current when it ran, so a slow rollout's first turn is its oldest.
A "trainer" bumps the version each step without a model; ``drive`` returns what
each step took, as ``core.trainer.loop`` would see it (``max_staleness=0`` is the
synchronous schedule).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.rollout import RolloutOutcome
from core.rollout.data import DataOrder
from core.trainer.pool import PoolSize, RolloutPool
from core.trainer.signal import build_signal
from core.trainer.source import PoolSource, StepBatch
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SamplingParams,
    TraceRecord,
    TurnSpan,
)

ROWS = 64
HARD = frozenset(range(0, ROWS, 3))
OK_TURNS, FAILED_TURNS = 2, 16
TURN_S = 0.002


class SlowFailureRunner:
    """``RolloutRunner``'s ``run_groups``/``cancel_groups``, with the scenario's timing."""

    def __init__(self, version: Callable[[], int], seed: int = 0) -> None:
        self.version = version
        self.seed = seed
        self.finished: list[RolloutOutcome] = []
        """Every rollout that returned, in finishing order."""

    async def run_groups(
        self,
        payloads: Sequence[tuple[str, dict[str, Any]]],
        *,
        group_size: int,
        sampling: SamplingParams,
        on_done: Callable[[RolloutOutcome], None] | None = None,
    ) -> list[RolloutOutcome]:
        async def one(group: str, payload: dict[str, Any], i: int) -> RolloutOutcome:
            # Seeded by the group's start number and member: sync and async see the same fates.
            rng = random.Random(f"{self.seed}-{group}-{i}")
            hard = payload["row"] in HARD
            failed = rng.random() < (0.6 if hard else 0.05)
            reward = float(rng.random() < (0.5 if hard else 0.9))
            turns = []
            for t in range(FAILED_TURNS if failed else OK_TURNS):
                turns.append(TurnSpan(2 + 2 * t, 3 + 2 * t, FinishReason.STOP, self.version()))
                await asyncio.sleep(TURN_S)
            n = 3 + 2 * len(turns)
            mask = [0] * n
            for span in turns:
                mask[span.start] = 1
            row = TraceRecord(
                session_id=f"{group}-{i}", token_ids=[1] * n, loss_mask=mask,
                logprobs=[-1.0 if m else 0.0 for m in mask], prompt_length=2, turns=turns,
            )
            status = RolloutStatus.TIMEOUT if failed else RolloutStatus.OK
            outcome = RolloutOutcome(
                request=RolloutRequest(
                    rollout_id=f"{group}-{i}", group_id=group, payload=payload,
                    base_url="http://x/v1", session_id=f"{group}-{i}", model_id="m",
                ),
                result=RolloutResult(
                    rollout_id=f"{group}-{i}", status=status, reward=None if failed else reward,
                    error="turn cap" if failed else None, elapsed_s=0.0,
                ),
                rows=[row],
            )
            self.finished.append(outcome)
            if on_done is not None:
                on_done(outcome)
            return outcome

        jobs = [one(g, p, i) for g, p in payloads for i in range(group_size)]
        return list(await asyncio.gather(*jobs))

    async def cancel_groups(self, group_ids: Iterable[str]) -> None:
        """Nothing to interrupt: the pool's close waits for the groups to return."""


@dataclass
class Drive:
    """What ``drive`` saw."""

    batches: list[StepBatch] = field(default_factory=list)
    end: dict[str, Any] = field(default_factory=dict)
    runner: SlowFailureRunner | None = None

    @property
    def trained(self) -> list[RolloutOutcome]:
        return [o for b in self.batches for o in b.outcomes]

    @property
    def accounted(self) -> list[RolloutOutcome]:
        """What the failure guard and ``rollouts/*`` see: trained and untrained."""
        return [o for b in self.batches for o in [*b.outcomes, *b.untrained]]

    def signal_share(self, group_size: int) -> float:
        """Share of trained groups with a nonzero advantage (as ``build_signal`` computes it)."""
        groups = with_signal = 0
        for b in self.batches:
            by_group: dict[str, list[RolloutOutcome]] = {}
            for o in b.outcomes:
                by_group.setdefault(o.request.group_id, []).append(o)
            for members in by_group.values():
                groups += 1
                sig = build_signal(members, normalize_std=True, exclude_failed=True, std="population",
                                   token_mean_over="batch")
                with_signal += int(sig.has_signal)
        return with_signal / max(1, groups)


def failure_rate(outcomes: Sequence[RolloutOutcome]) -> float:
    return sum(1 for o in outcomes if not o.ok) / max(1, len(outcomes))


async def drive(*, steps: int, batch: int, group: int, max_staleness: int, seed: int = 0,
                train_s: float = 0.004) -> Drive:
    """Run ``steps`` steps of an async trainer over the real pool and source."""
    version = [0]
    runner = SlowFailureRunner(lambda: version[0], seed)
    room = (max_staleness + 1) * batch
    pool = RolloutPool(
        runner=runner,  # type: ignore[arg-type]
        rows=[{"row": i} for i in range(ROWS)],
        order=DataOrder(size=ROWS, seed=seed),
        size=PoolSize(group, max_groups=room, max_rollouts=room * group),
        sampling=lambda seq: SamplingParams(max_tokens=4, seed=seq),
    )
    pool.start()
    source = PoolSource(pool, batch_size=batch, version=lambda: version[0])
    out = Drive(runner=runner)
    try:
        for _ in range(steps):
            b = await source.take()
            out.batches.append(b)
            await asyncio.sleep(train_s)  # the update
            version[0] += 1
            await source.settle(b)
        out.end = (await source.finish()).metrics
    finally:
        await source.aclose()
    return out
