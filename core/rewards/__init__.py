"""Trainer-side rewards: ``reward=<name>`` plugins, the stage that applies them, late rewards.

See docs/eval.md ("Reward plugins") and docs/plugins.md. Everything in ``__all__``
is public.
"""

from __future__ import annotations

from core.rewards.base import (
    MODES,
    RewardConfig,
    RewardFunction,
    RewardInput,
    RewardOutput,
    final_answer,
    transcript,
)
from core.rewards.late import LateRewards
from core.rewards.stage import RewardStage, build_reward_stage

__all__ = [
    "MODES",
    "LateRewards",
    "RewardConfig",
    "RewardFunction",
    "RewardInput",
    "RewardOutput",
    "RewardStage",
    "build_reward_stage",
    "final_answer",
    "transcript",
]
