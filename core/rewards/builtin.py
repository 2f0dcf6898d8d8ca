"""Built-in reward functions: answer match (exact or regex) and a math-answer checker.

Both compare the rollout's final answer (the last message the model generated)
with the payload's ground truth under ``reward.answer_key``. ``reward.pattern`` is
matched with RE2 (``core.safe_regex``): the text is the policy's, and a backtracking
engine would let it stall the run on a pattern like ``^(a+)+$``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.rewards.base import RewardConfig, RewardInput, RewardOutput
from core.safe_regex import RegexError, compile_regex

__all__ = ["MatchReward", "MatchRewardConfig", "MathReward", "MathRewardConfig"]


def _truth(item: RewardInput, key: str) -> str | None:
    value = item.payload.get(key)
    return None if value is None else str(value)


@dataclass
class MatchRewardConfig(RewardConfig):
    """``reward=match``: 1.0 when the final answer matches the payload's answer, else 0.0."""

    name: str = "match"
    answer_key: str = "answer"
    """Payload field with the expected answer; empty: ``pattern`` alone decides."""
    pattern: str = ""
    """Regex (RE2 syntax: no backreferences or lookaround) searched in the final answer;
    its first group (or the whole match) is the answer compared. Empty: the whole
    stripped final answer."""
    ignore_case: bool = False
    """Compare case-insensitively."""


class MatchReward:
    """Exact or regex match of the final answer."""

    def __init__(self, config: Any) -> None:
        self.answer_key = str(config.answer_key)
        self.ignore_case = bool(config.ignore_case)
        try:
            self.pattern: Any = compile_regex(str(config.pattern)) if config.pattern else None
        except RegexError as exc:
            raise ConfigError(f"reward.pattern is not a valid regex: {exc}") from exc
        if self.pattern is None and not self.answer_key:
            raise ConfigError("reward=match needs reward.answer_key, reward.pattern, or both")

    def _one(self, item: RewardInput) -> RewardOutput:
        text = item.final_answer.strip()
        if self.pattern is not None:
            found = self.pattern.search(text)
            if found is None:
                return RewardOutput(reward=0.0)
            text = (found.group(1) if found.groups() else found.group(0)).strip()
            if not self.answer_key:
                return RewardOutput(reward=1.0)
        truth = _truth(item, self.answer_key)
        if truth is None:
            return RewardOutput(error=f"the payload has no {self.answer_key!r} (reward.answer_key)")
        if self.ignore_case:
            text, truth = text.lower(), truth.lower()
        return RewardOutput(reward=1.0 if text == truth.strip() else 0.0)

    async def score(self, group: Sequence[RewardInput]) -> list[RewardOutput]:
        return [self._one(item) for item in group]


@dataclass
class MathRewardConfig(RewardConfig):
    """``reward=math``: 1.0 when the final answer is mathematically equal to the payload's."""

    name: str = "math"
    answer_key: str = "answer"
    """Payload field with the expected answer (LaTeX or plain)."""


class MathReward:
    """Equivalence by ``math-verify`` (Hugging Face's parser and sympy checker): ``\\frac12``,
    ``0.5`` and ``\\boxed{1/2}`` are one answer."""

    def __init__(self, config: Any) -> None:
        try:
            import math_verify
        except ImportError as exc:
            raise ConfigError(
                "reward=math needs the math-verify package: pip install 'tracerl[math]' (or math-verify)"
            ) from exc
        self._mv = math_verify
        self.answer_key = str(config.answer_key)

    def _one(self, item: RewardInput) -> RewardOutput:
        truth = _truth(item, self.answer_key)
        if truth is None:
            return RewardOutput(error=f"the payload has no {self.answer_key!r} (reward.answer_key)")
        # math-verify's timeouts use SIGALRM, which exists only on the main thread.
        limit = 5 if threading.current_thread() is threading.main_thread() else None
        gold = self._mv.parse(truth, parsing_timeout=limit)
        if not gold:
            return RewardOutput(error=f"math-verify cannot parse the expected answer {truth!r}")
        answer = self._mv.parse(item.final_answer, parsing_timeout=limit)
        ok = bool(answer) and self._mv.verify(gold, answer, timeout_seconds=limit)
        return RewardOutput(reward=1.0 if ok else 0.0)

    async def score(self, group: Sequence[RewardInput]) -> list[RewardOutput]:
        return [self._one(item) for item in group]
