"""Trainer-side rewards: ``reward=<name>`` plugins, the stage that applies them, late rewards.

See docs/eval.md ("Reward plugins") and docs/plugins.md. Everything in ``__all__``
is public.
"""

from __future__ import annotations

# LateRewards lives with the gateway that receives the posts; re-exported here because
# docs/plugins.md lists it in core.rewards' public API (third-party code may import it).
from core.gateway.late_rewards import LateRewards
from core.rewards.base import (
    MODES,
    RewardConfig,
    RewardFunction,
    RewardInput,
    RewardOutput,
    final_answer,
    transcript,
)
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
