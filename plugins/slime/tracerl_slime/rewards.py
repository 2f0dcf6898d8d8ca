"""Fork-safe GRPO reward post-processing for slime (``--custom-reward-post-process-path``).

Defines ``post_process_rewards`` (the hook: ``(args, samples) -> (raw_rewards,
rewards)``) and ``group_normalize`` (the pure maths).

Why: slime's default (``RolloutManager._post_process_rewards`` in
``slime/ray/rollout.py``) reshapes the flat reward list by position into
rows of ``n_samples_per_prompt``, and when the count differs (a rollout
returned several samples) it normalises the whole batch as one group. With
tracerl a rollout that forks returns one sample per trace row, so position no
longer says which prompt a sample belongs to and a forked rollout would count
once per row. Here:

- groups are keyed by ``Sample.group_index`` (set per prompt by slime's data
  source), never by position;
- each rollout counts once in its group's mean and standard deviation
  (samples deduplicated by ``rollout_id``, falling back to ``index``);
- failed rollouts (``remove_sample`` or ABORTED, see ``tracerl_slime.rows``)
  are left out of the baseline and get 0.0;
- every sibling of a rollout gets that rollout's normalised reward.

Which estimators normalise follows slime: for ``grpo``, ``gspo``, ``cispo``
and ``reinforce_plus_plus_baseline`` with ``rewards_normalization`` on,
subtract the group mean; for ``grpo``, ``gspo`` and ``cispo`` with
``grpo_std_normalization`` on (``algorithm.normalize_std``), divide by the
group's standard deviation + eps. Other estimators get raw rewards. A group
with one scored rollout, or with equal rewards, has no spread: advantage 0.0.

The spread is core's (``core.testing.parity``), so one config gives the same
advantages on every backend: ``algorithm.std`` of the tracerl config on
``args`` (``population`` by default, or ``sample``) and eps 1e-4. Only when
``args`` carries no tracerl config (the post-processor used on its own) does
it keep slime's arithmetic: the sample standard deviation + 1e-6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from tracerl_slime.host import CONFIG_ATTR, tracerl_config_of
from tracerl_slime.sample import reward_value

CENTERED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
"""Estimators whose rewards are group-centred (as in slime's default)."""
STD_SCALED = ("grpo", "gspo", "cispo")
"""Estimators whose centred rewards are divided by the group's standard deviation."""
EPS = 1e-4
"""Added to the standard deviation (core's value, ``core.algo.compute_group_advantages``)."""
SLIME_EPS = 1e-6
"""slime's own value, used without a tracerl config on ``args``."""
STD_KINDS = ("population", "sample")
"""``algorithm.std``: squared deviations divided by n, or by n - 1 (slime's ``torch.std``)."""


@dataclass(frozen=True)
class Scored:
    """One sample as the normalisation sees it."""

    group: Any
    """Group key (``group_index``)."""
    rollout: Any
    """Rollout key (``rollout_id``, else ``index``, else the position)."""
    reward: float
    """Raw scalar reward."""
    excluded: bool
    """True for a failed rollout (kept out of the baseline)."""


def _is_excluded(sample: Any) -> bool:
    status = getattr(sample, "status", None)
    return (
        bool(getattr(sample, "remove_sample", False))
        or getattr(status, "value", status) == "aborted"
    )


def group_normalize(
    items: Sequence[Scored],
    *,
    center: bool,
    scale: bool,
    std: str = "population",
    eps: float = EPS,
) -> list[float]:
    """Per-item normalised rewards, each rollout counted once in its group (see module docstring).

    Args:
        std: ``population`` (n) or ``sample`` (n - 1) standard deviation.
        eps: Added to the standard deviation.
    """
    per_group: dict[Any, dict[Any, float]] = {}
    for it in items:
        if it.excluded:
            continue
        # first sample of a rollout wins; siblings carry the same reward
        per_group.setdefault(it.group, {}).setdefault(it.rollout, it.reward)
    stats: dict[Any, tuple[float, float]] = {}
    for group, rollouts in per_group.items():
        values = list(rollouts.values())
        mean = sum(values) / len(values)
        denom = len(values) if std == "population" else len(values) - 1
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / denom) if len(values) > 1 else 0.0
        stats[group] = (mean, spread)
    out = []
    for it in items:
        if it.excluded:
            out.append(0.0)
            continue
        if not center:
            out.append(it.reward)
            continue
        mean, spread = stats[it.group]
        value = it.reward - mean
        if scale:
            value = value / (spread + eps)
        out.append(value)
    return out


def spread_of(args: Any) -> tuple[str, float]:
    """``(std kind, eps)`` for ``args``: core's from the tracerl config, else slime's."""
    if getattr(args, CONFIG_ATTR, None) is None:
        return "sample", SLIME_EPS
    algorithm = tracerl_config_of(args).get("algorithm") or {}
    std = str(algorithm.get("std", "population"))
    if std not in STD_KINDS:
        raise ConfigError(f"algorithm.std={std!r}; use one of {STD_KINDS}")
    return std, EPS


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's reward post-process hook, fork-safe (see the module docstring).

    Args:
        args: slime's parsed arguments (``advantage_estimator``,
            ``rewards_normalization``, ``grpo_std_normalization``, ``reward_key``,
            and the tracerl config under ``tracerl`` for ``algorithm.std``).
        samples: The step's samples, flattened, in slime's order.

    Returns:
        ``(raw_rewards, rewards)``, both one entry per sample in input order.

    Raises:
        ValueError: a sample without ``group_index`` while normalising (slime's data
            source always sets it; a hand-built sample must too).
    """
    estimator = str(getattr(args, "advantage_estimator", "grpo"))
    normalize = bool(getattr(args, "rewards_normalization", True)) and estimator in CENTERED
    scale = (
        normalize
        and estimator in STD_SCALED
        and bool(getattr(args, "grpo_std_normalization", True))
    )
    items = []
    for pos, s in enumerate(samples):
        excluded = _is_excluded(s)
        group = getattr(s, "group_index", None)
        if normalize and group is None and not excluded:
            raise ValueError(
                f"sample at position {pos} (index={getattr(s, 'index', None)!r}) has no group_index; "
                "the fork-safe reward post-processor groups by it"
            )
        rollout = s.rollout_id if s.rollout_id is not None else s.index
        items.append(
            Scored(
                group=group,
                rollout=rollout if rollout is not None else ("pos", pos),
                reward=0.0 if excluded else reward_value(s, args),
                excluded=excluded,
            )
        )
    raw = [reward_value(s, args) for s in samples]
    if not normalize:
        return raw, [0.0 if it.excluded else it.reward for it in items]
    std, eps = spread_of(args)
    return raw, group_normalize(items, center=True, scale=scale, std=std, eps=eps)
