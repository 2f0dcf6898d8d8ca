"""Core's own reward plugin: registers ``agent``, ``match``, ``math`` and ``judge``."""

from __future__ import annotations

from typing import Any

from core.plugins.hookspecs import hookimpl
from core.plugins.registry import RewardRegistry, RewardSpec
from core.rewards.base import RewardConfig
from core.rewards.builtin import MatchReward, MatchRewardConfig, MathReward, MathRewardConfig
from core.rewards.judge import JudgeReward, JudgeRewardConfig


def _agent(cfg: Any) -> None:
    return None  # the agent's own reward stands


@hookimpl
def tracerl_register_rewards(registry: RewardRegistry) -> None:
    registry.add(RewardSpec("agent", _agent, RewardConfig, "the agent's own reward (default)"))
    registry.add(
        RewardSpec(
            "match", lambda cfg: MatchReward(cfg.reward), MatchRewardConfig,
            "1 when the final answer equals payload[answer_key] (exact, or a regex's group)",
        )
    )
    registry.add(
        RewardSpec(
            "math", lambda cfg: MathReward(cfg.reward), MathRewardConfig,
            "1 when the final answer equals payload[answer_key] mathematically (math-verify)",
        )
    )
    registry.add(
        RewardSpec(
            "judge", lambda cfg: JudgeReward(cfg.reward), JudgeRewardConfig,
            "an LLM judge scoring a group's trajectories against a rubric (OpenAI-compatible endpoint)",
        )
    )
