"""The canary's advice fits its failure: a context overflow is not an unreachable gateway."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.errors import RunAborted
from core.trainer.guards import check_canary
from core.types import RolloutStatus
from tests.rewards.test_reward_plugins import _outcome

OVERFLOW = (
    "openai.BadRequestError: Error code: 400 - This model's maximum context length is 512 tokens. However, "
    "your messages resulted in 548 tokens. Please reduce the length of the messages. (tracerl: the limit of "
    "512 is backend.tiny.max_position_embeddings; raise it, ...)"
)


def _failed(error: str) -> object:
    o = _outcome("x", {"q": 1}, status=RolloutStatus.CRASHED)
    return replace(o, result=replace(o.result, error=error))


def test_a_context_overflow_says_which_settings_to_raise() -> None:
    with pytest.raises(RunAborted) as info:
        check_canary(_failed(OVERFLOW))  # type: ignore[arg-type]
    text = str(info.value)
    assert "548 tokens" in text and "backend.tiny.max_position_embeddings" in text
    assert "gateway.max_context_tokens" in text and "algorithm.max_tokens" in text
    assert "reaches the gateway" not in text  # the agent did reach it


def test_other_failures_keep_the_wiring_advice() -> None:
    with pytest.raises(RunAborted, match=r"(?s)connection refused.*reaches the gateway"):
        check_canary(_failed("httpx.ConnectError: connection refused"))  # type: ignore[arg-type]
