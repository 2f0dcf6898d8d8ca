"""The rollout layer: running rollouts, their statuses, and the data they start from.

Used by core's training loop, ``python -m core.eval``, the reward stage, and the verl
and slime backends. Modules:

- ``outcome``: ``RolloutOutcome`` and ``classify`` (the status a rollout trains under);
- ``runner``: ``RolloutRunner`` (one gateway session per rollout, within ``RolloutLimits``)
  and ``run_groups``;
- ``stack``: ``start_rollout_stack`` (gateway server, runtime and runner together);
- ``data``: ``load_payloads``, ``DataOrder`` and ``prepare_data``.
"""

from __future__ import annotations

from core.rollout.data import DataOrder, load_payloads, prepare_data
from core.rollout.outcome import (
    DEFAULT_EXCLUDE_ON,
    DEFAULT_MAX_ABS_REWARD,
    DEFAULT_REWARD_TIMEOUT_S,
    EXCLUDE_ON_CHOICES,
    FAULT_KEYS,
    RolloutOutcome,
    check_exclude_on,
    classify,
)
from core.rollout.runner import RolloutLimits, RolloutRunner, RunOne, run_groups
from core.rollout.stack import RolloutStack, start_rollout_stack

__all__ = [
    "DEFAULT_EXCLUDE_ON",
    "DEFAULT_MAX_ABS_REWARD",
    "DEFAULT_REWARD_TIMEOUT_S",
    "EXCLUDE_ON_CHOICES",
    "FAULT_KEYS",
    "DataOrder",
    "RolloutLimits",
    "RolloutOutcome",
    "RolloutRunner",
    "RolloutStack",
    "RunOne",
    "check_exclude_on",
    "classify",
    "load_payloads",
    "prepare_data",
    "run_groups",
    "start_rollout_stack",
]
