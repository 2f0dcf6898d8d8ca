"""What one training step reports: the keys of its ``metrics.jsonl`` record.

- ``StepTimes``: seconds spent in each phase of a step;
- ``StepReport``: everything a step produced that its record summarises;
- ``step_metrics``: rewards, rollout statuses, trace and fault counts, tool-call parse
  statuses (``core.trainer.parse_watch``), data position, times, the agents' own metrics
  (``agent_metrics``), and the group, train and eval metrics;
- ``agent_metrics``: the mean of each metric the agents returned, as ``agent/<name>``;
- ``flow_metrics``: staleness of what trained (per rollout and per token, read from
  each turn's segments), interrupted turns, idle times and throughput (the same
  keys in ``trainer.mode=sync`` and ``async``).

Writing the records is ``core.rundir.metrics``'s job.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.rollout import FAULT_KEYS, RolloutOutcome
from core.trainer.parse_watch import parse_metrics
from core.trainer.pool import (
    Versions,
    interrupted_turns,
    rollout_staleness,
    token_staleness,
    trains,
)
from core.types import Datum, RolloutStatus


@dataclass
class StepTimes:
    """Seconds spent in each phase of one step."""

    rollout: float = 0.0
    """Waiting for the step's rollouts (sync: running them; async: taking them from the pool)."""
    train: float = 0.0
    """``forward_backward`` and ``optim_step``."""
    sync: float = 0.0
    """Serving the new weights to the sampler."""
    eval: float = 0.0
    """The scheduled evaluation."""
    checkpoint: float = 0.0
    """The scheduled checkpoint."""
    extra: dict[str, float] = field(default_factory=dict)
    """Other phases, by name."""


@dataclass(frozen=True)
class StepReport:
    """What one step did, as ``step_metrics`` summarises it."""

    step: int
    """The step just finished (1-based)."""
    outcomes: list[RolloutOutcome]
    """The rollouts it trained on (after the reward stage)."""
    statuses: Counter[str]
    """How many of them (and of ``untrained``) ended in each ``RolloutStatus``."""
    datums: list[Datum]
    """What was sent to ``forward_backward``."""
    metrics: dict[str, float]
    """Group, train and eval metrics, in that order."""
    times: StepTimes
    """Seconds per phase."""
    step_time: float
    """Seconds of the whole step."""
    weight_version: int
    """The backend's weight version after the step."""
    data: dict[str, Any]
    """``data/epoch``, ``data/cursor`` and ``data/batch`` (the rows drawn)."""
    untrained: list[RolloutOutcome] = field(default_factory=list)
    """Rollouts that finished in the step but do not train (async: dropped groups);
    ``reward/*`` and ``rollouts/*`` count them with ``outcomes``."""


AGENT_PREFIX = "agent/"
"""Where the metrics an agent returns (``{"reward": r, "metrics": {...}}``) are logged."""


def agent_metrics(outcomes: list[RolloutOutcome]) -> dict[str, float]:
    """``agent/<name>``: the mean of each metric the agents returned, over the ``ok``
    rollouts that carry it.

    The agent's ``reward/<component>`` keys are left to ``component_metrics`` (they log
    under ``reward/``, never over ``reward/mean`` or ``reward/std``); prefixing every
    other name keeps an agent from overwriting any key the loop logs itself.
    """
    values: dict[str, list[float]] = {}
    for o in outcomes:
        if not o.ok:
            continue
        for key, value in o.result.metrics.items():
            number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
            if not key.startswith("reward/") and number is not None and math.isfinite(number):
                values.setdefault(AGENT_PREFIX + key, []).append(float(number))
    return {key: sum(v) / len(v) for key, v in sorted(values.items())}


def step_metrics(report: StepReport) -> dict[str, Any]:
    """The step's record, but for ``flow_metrics``, reward components and trace sizes."""
    outcomes, statuses, times, step_time = report.outcomes, report.statuses, report.times, report.step_time
    finished = [*outcomes, *report.untrained]
    rewards = [o.result.reward for o in finished if o.ok and o.result.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5 if rewards else float("nan")
    rows = [r for o in outcomes for r in o.rows]
    accounted = times.rollout + times.train + times.sync + times.eval + times.checkpoint
    ok = statuses.get(RolloutStatus.OK.value, 0)
    return {
        "step": report.step,
        "reward/mean": mean,
        "reward/std": std,
        "rollouts/total": len(finished),
        "rollouts/trained": len(outcomes),
        "rollouts/ok": ok,
        "rollouts/failed": len(finished) - ok,
        **{f"rollouts/{s.value}": statuses.get(s.value, 0) for s in RolloutStatus if s is not RolloutStatus.OK},
        "datums": len(report.datums),
        "tokens/trained": int(sum(sum(d.weights) for d in report.datums)),
        "tokens/total": sum(len(r.token_ids) for r in rows),
        "turns/total": sum(int(r.metadata.get("turns", len(r.turns))) for r in rows),
        "trace/rows": len(rows),
        "trace/forks": sum(int(r.metadata.get("forks", 0)) for r in rows),
        "trace/ill_formed_tool_calls": sum(int(r.metadata.get("ill_formed_tool_calls", 0)) for r in rows),
        "trace/truncated": sum(int(bool(r.metadata.get("truncated", False))) for r in rows),
        **parse_metrics(rows),
        # Read from each rollout's session, so a rollout without rows still counts.
        **{f"faults/{k}": sum(o.faults.get(k, 0) for o in outcomes) for k in FAULT_KEYS},
        "rollouts/with_disconnected_turns": sum(
            1 for o in outcomes if o.faults.get("disconnected_turns", 0) > 0
        ),
        "rollouts/session_finished_early": sum(o.faults.get("finished_early", 0) for o in outcomes),
        "rollouts/session_lost": sum(o.faults.get("session_lost", 0) for o in outcomes),
        "weight_version": report.weight_version,
        **report.data,
        "time/rollout": times.rollout,
        "time/train": times.train,
        "time/weight_sync": times.sync,
        "time/eval": times.eval,
        "time/checkpoint": times.checkpoint,
        "time/step": step_time,
        "time/loop_overhead_frac": max(0.0, step_time - accounted) / step_time if step_time > 0 else 0.0,
        **agent_metrics(finished),
        **report.metrics,
    }


def flow_metrics(
    outcomes: list[RolloutOutcome], version: Versions, flow: dict[str, Any], step_time: float,
    *, exclude_failed: bool = True,
) -> dict[str, Any]:
    """Staleness of what trained (against weight ``version``, with several policies each
    turn against its own policy's; failed rollouts with rows
    train too when ``exclude_failed`` is False), then ``flow`` (the rollout source's idle
    times and counts, which carry ``rollouts/finished``), then throughput."""
    trained = [o for o in outcomes if trains(o, exclude_failed=exclude_failed)]
    ages = rollout_staleness(trained, version)
    token_mean, token_max = token_staleness(trained, version)
    out: dict[str, Any] = {
        "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "async/staleness_max": max(ages) if ages else 0,
        "async/token_staleness_mean": token_mean,
        "async/token_staleness_max": token_max,
        "async/interrupted_turns": interrupted_turns(trained),
        **flow,
    }
    out["rollouts/s"] = out["rollouts/finished"] / step_time if step_time > 0 else 0.0
    return out
