"""Group-relative advantages (GRPO) with failed rollouts kept out of the baseline.

A failed rollout (timeout, crash, missing reward) says nothing about the
policy's quality, so by default it is excluded from its group: it neither
gets an advantage nor drags the group mean down. Scoring it 0.0 (what other
toolkits do) can be asked for with ``exclude_failed=False``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RolloutScore:
    """One rollout's outcome as the advantage computation sees it."""

    rollout_id: str
    """Rollout id."""
    group_id: str
    """GRPO group (same prompt)."""
    reward: float | None
    """Reward when the rollout succeeded, else None."""


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
    """Advantage per trained rollout id."""


def compute_group_advantages(
    scores: Iterable[RolloutScore],
    *,
    normalize_std: bool = True,
    exclude_failed: bool = True,
    eps: float = 1e-4,
) -> GroupStats:
    """Mean-centred (optionally std-normalised) rewards per group.

    Args:
        scores: Every rollout of the step, failed ones included.
        normalize_std: Divide by the group's standard deviation (+ ``eps``).
        exclude_failed: Leave failed rollouts out; when False they count as 0.0.
        eps: Added to the standard deviation.

    Returns:
        ``GroupStats`` with an advantage for each rollout that trains.
    """
    by_group: dict[str, list[tuple[str, float]]] = {}
    stats = GroupStats()
    for s in scores:
        group = by_group.setdefault(s.group_id, [])
        if s.reward is None:
            if exclude_failed:
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
        mean = sum(rewards) / len(rewards)
        var = sum((r - mean) ** 2 for r in rewards) / len(rewards)
        if var <= 1e-12:
            stats.skipped_constant += 1
            continue
        scale = math.sqrt(var) + eps if normalize_std else 1.0
        for rollout_id, reward in members:
            stats.advantages[rollout_id] = (reward - mean) / scale
    return stats
