"""What a reward plugin implements and receives: ``RewardConfig``, ``RewardInput``,
``RewardOutput`` and the ``RewardFunction`` protocol.

A reward function runs trainer-side on finished rollouts. It is called with one
group at a time (the ``K`` rollouts of one prompt that finished ``ok``) and
returns one ``RewardOutput`` per input, in order; a function that scores each
rollout on its own ignores the grouping, a relative judge uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from core.types import RolloutResult, TraceRecord

__all__ = ["MODES", "RewardConfig", "RewardFunction", "RewardInput", "RewardOutput", "final_answer", "transcript"]

MODES = ("replace", "add", "log")
"""``reward.mode`` choices: the plugin's score replaces the agent's reward, is added
to it, or is only logged (as ``reward/<component>``)."""


@dataclass
class RewardConfig:
    """Settings every ``reward/<name>`` node has; a plugin's config subclasses it."""

    name: str = "agent"
    """The reward chosen with ``reward=<name>``."""
    mode: str = "replace"
    """``replace`` (the plugin's score is the reward that trains), ``add`` (the agent's
    reward plus the score) or ``log`` (the agent's reward trains; the score is logged)."""
    component: str = ""
    """Name the score is logged under (``reward/<component>``); empty: the reward's name."""
    timeout_s: float = 60.0
    """How long the loop waits for a reward an agent left pending (posted later through
    ``POST /admin/rollouts/{id}/reward`` or ``LateRewards.post``); then ``reward_timeout``."""


@dataclass
class RewardInput:
    """One finished rollout, as a reward function sees it."""

    rollout_id: str
    """The rollout's id."""
    group_id: str
    """Its group (one prompt)."""
    payload: dict[str, Any]
    """The dataset row it ran (ground truth lives here, e.g. ``payload['answer']``)."""
    result: RolloutResult
    """What the runtime reported (the agent's reward, metrics)."""
    rows: list[TraceRecord]
    """Its trace rows (token ids, loss mask, logprobs); empty without trace capture."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The message tree the gateway recorded (``core.rundir.traces.conversation_tree``)."""

    @property
    def final_answer(self) -> str:
        """Text of the last message the model generated ("" when none was recorded)."""
        return final_answer(self.conversation)


@dataclass
class RewardOutput:
    """A reward function's verdict on one rollout."""

    reward: float | None = None
    """The score (``mode`` decides what it does); None only with ``error``."""
    components: dict[str, float] = field(default_factory=dict)
    """Extra named scores, logged as ``reward/<name>``."""
    error: str | None = None
    """Why the rollout could not be scored: it becomes ``judge_error`` (never a silent 0)."""


@runtime_checkable
class RewardFunction(Protocol):
    """What a ``RewardSpec.factory`` returns."""

    async def score(self, group: Sequence[RewardInput]) -> list[RewardOutput]:
        """One output per input, in order. Raising marks the whole group ``judge_error``."""
        ...


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def final_answer(conversation: Sequence[dict[str, Any]]) -> str:
    """The text of the last generated message of a ``conversation_tree``."""
    for entry in reversed(conversation):
        if entry.get("turn") is not None:
            messages = entry.get("messages") or []
            for message in reversed(messages):
                if isinstance(message, dict) and message.get("role") == "assistant":
                    return _text(message.get("content"))
    return ""


def transcript(conversation: Sequence[dict[str, Any]], *, max_chars: int = 20_000) -> str:
    """The conversation as ``role: text`` lines (for judges), cut to ``max_chars``."""
    lines = []
    for entry in conversation:
        for message in entry.get("messages") or []:
            if not isinstance(message, dict):
                continue
            text = _text(message.get("content"))
            calls = message.get("tool_calls")
            if calls:
                text += f" [tool calls: {calls}]"
            lines.append(f"{message.get('role', '?')}: {text}")
    out = "\n".join(lines)
    return out if len(out) <= max_chars else out[: max_chars // 2] + "\n[...]\n" + out[-max_chars // 2 :]
