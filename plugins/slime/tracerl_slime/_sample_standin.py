"""A stand-in for slime's ``Sample`` (``slime/utils/types.py``), used only without slime.

slime is not on PyPI and cannot be installed on machines without GitHub
access, yet the generate function, the reward post-processor and their tests
must build real ``Sample`` objects. This module declares a dataclass with the
same field names, order, defaults and ``Status`` values as slime's at commit
``624b824a898ab0ec1fcb4d373004c7f3852bf515`` (``SLIME_COMMIT``), written for
tracerl (no slime code): it holds data and offers the two read helpers our
code calls (``get_reward_value``, ``effective_response_length``). slime's
token-appending and SGLang ``meta_info`` helpers are deliberately absent: our
generate function never calls them (rows come finished from the gateway).

``tracerl_slime.sample.Sample`` picks slime's class when slime imports, else
this one; ``tests/test_sample_standin.py`` pins the field list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
"""The slime commit whose ``Sample`` this stand-in mirrors (THUDM/slime, 2026-08-21)."""


@dataclass
class _SpecInfo:
    """Speculative-decoding counters (slime's ``Sample.SpecInfo``; unused by tracerl)."""

    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0


@dataclass
class _PrefixCacheInfo:
    """Prefix-cache counters (slime's ``Sample.PrefixCacheInfo``; unused by tracerl)."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0


@dataclass
class Sample:
    """One training sample as slime's trainer consumes it (stand-in; see the module docstring)."""

    group_index: int | None = None
    """Prompt counter set by slime's data source; the GRPO group key."""
    index: int | None = None
    """Sample counter set by slime's data source (unique within a run)."""
    rollout_id: int | None = None
    """Rollout (agent run) the sample came from; siblings of one rollout share it."""
    prompt: str | list[dict[str, str]] = ""
    """The dataset prompt (text or chat messages)."""
    tokens: list[int] = field(default_factory=list)
    """Prompt followed by response tokens."""
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    """Decoded response text (logging only)."""
    response_length: int = 0
    """Number of tokens at the end of ``tokens`` that form the response."""
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    """One entry per response token: 1 trains, 0 does not."""
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    """Sampler logprob per response token."""
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    """slime zeroes the loss mask of a removed sample."""
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        """Generation outcome (values as in slime)."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: _SpecInfo = field(default_factory=_SpecInfo)
    prefix_cache_info: _PrefixCacheInfo = field(default_factory=_PrefixCacheInfo)

    def get_reward_value(self, args: Any) -> Any:
        """The scalar reward: ``reward`` itself, or ``reward[args.reward_key]`` when set."""
        key = getattr(args, "reward_key", None)
        if not key:
            return self.reward
        assert isinstance(self.reward, dict)
        return self.reward[key]

    @property
    def effective_response_length(self) -> int:
        """Trained response tokens (the loss mask's sum, else the response length)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length
