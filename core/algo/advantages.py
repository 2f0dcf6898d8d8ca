"""Group-relative advantages (GRPO) with failed rollouts kept out of the baseline.

A failed rollout (timeout, crash, missing reward, a broken model call) says
nothing about the policy's quality, so by default it is excluded from its
group: it neither gets an advantage nor drags the group mean down. Scoring it
0.0 (what other toolkits do) can be asked for with ``exclude_failed=False``;
even then a failed rollout without trace rows stays out (it has nothing to
push down), as in the verl and slime plugins.

The group statistics are computed directly for ordinary rewards and on
rewards divided by the group's largest ``|reward|`` beyond 1e100, so no finite
reward can overflow them (``1e200 ** 2`` would); the loop also refuses rewards
above ``trainer.max_abs_reward`` earlier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

StdKind = Literal["population", "sample"]
STD_KINDS: tuple[str, ...] = ("population", "sample")
"""``algorithm.std`` choices: divide squared deviations by n, or by n - 1 (verl's GRPO)."""

_DIRECT_MAX = 1e100
"""Up to this ``|reward|`` the statistics are computed directly (squares stay far from
float overflow); beyond it, on rescaled rewards."""

CONSTANT_SPREAD = 1e-12
"""A group whose rewards span no more than this has no learning signal."""


@dataclass(frozen=True)
class RolloutScore:
    """One rollout's outcome as the advantage computation sees it."""

    rollout_id: str
    """Rollout id."""
    group_id: str
    """GRPO group (same prompt)."""
    reward: float | None
    """Reward when the rollout succeeded, else None."""
    has_rows: bool = True
    """Whether it has anything to train (a failed rollout without rows is never scored)."""


@dataclass
class GroupStats:
    """What happened to the groups of one step."""

    groups: int = 0
    """Groups seen."""
    skipped_constant: int = 0
    """Groups whose scored rewards were all equal (no learning signal)."""
    skipped_too_small: int = 0
    """Groups with fewer than two scored rollouts."""
    excluded_failed: int = 0
    """Failed rollouts left out of their group."""
    scored_failed: int = 0
    """Failed rollouts scored 0.0 (only with ``exclude_failed=False``)."""
    advantages: dict[str, float] = field(default_factory=dict)
    """Advantage per rollout id of the groups with a signal (lone and constant
    groups have no entry: their advantage is 0)."""


def compute_group_advantages(
    scores: Iterable[RolloutScore],
    *,
    normalize_std: bool = True,
    exclude_failed: bool = True,
    std: str = "population",
    eps: float = 1e-4,
) -> GroupStats:
    """Mean-centred (optionally std-normalised) rewards per group.

    Args:
        scores: Every rollout of the step, failed ones included.
        normalize_std: Divide by the group's standard deviation (+ ``eps``).
        exclude_failed: Leave failed rollouts out; when False those with rows count as 0.0.
        std: ``population`` (n) or ``sample`` (n - 1) standard deviation.
        eps: Added to the standard deviation.

    Returns:
        ``GroupStats`` with an advantage for each rollout of a group with signal.
    """
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    by_group: dict[str, list[tuple[str, float]]] = {}
    stats = GroupStats()
    for s in scores:
        group = by_group.setdefault(s.group_id, [])
        if s.reward is None:
            if exclude_failed or not s.has_rows:
                stats.excluded_failed += 1
                continue
            stats.scored_failed += 1
            group.append((s.rollout_id, 0.0))
        else:
            group.append((s.rollout_id, float(s.reward)))
    for members in by_group.values():
        stats.groups += 1
        if len(members) < 2:
            stats.skipped_too_small += 1
            continue
        rewards = [r for _, r in members]
        if max(rewards) - min(rewards) <= CONSTANT_SPREAD:
            stats.skipped_constant += 1
            continue
        denom = len(rewards) if std == "population" else len(rewards) - 1
        largest = max(abs(r) for r in rewards)
        if largest <= _DIRECT_MAX:
            # Ordinary rewards: the plain formula (runs reproduce bit for bit across versions).
            mean = sum(rewards) / len(rewards)
            var = sum((r - mean) ** 2 for r in rewards) / denom
            scale = math.sqrt(var) + eps if normalize_std else 1.0
            for rollout_id, reward in members:
                stats.advantages[rollout_id] = (reward - mean) / scale
            continue
        # Huge rewards: work on rewards / max|reward| (all in [-1, 1]), where squares and
        # sums cannot overflow; (r - mean) / (std + eps) with every term divided by largest.
        unit = [r / largest for r in rewards]
        mean = sum(unit) / len(unit)
        spread = math.sqrt(sum((u - mean) ** 2 for u in unit) / denom)
        for (rollout_id, _), u in zip(members, unit, strict=True):
            if normalize_std:
                stats.advantages[rollout_id] = (u - mean) / (spread + eps / largest)
            else:
                stats.advantages[rollout_id] = (u - mean) * largest
    return stats
