"""What a route hands the gateway for one turn, and what it gets back, in dialect-neutral form.

Defines:

- ``TurnRequest``: a chat request (messages, tools, sampling asks, ``tool_choice``, strict schemas).
- ``TurnResult``: what the model answered, ready for either dialect.

The dialect modules (``openai_api``, ``anthropic_api``, ``responses_api``) build the one and
render the other; ``Gateway.run_turn`` turns the one into the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.gateway.messages import Unit
from core.gateway.tokentext import TokenLogprob
from core.gateway.toolchoice import AUTO, ToolChoice
from core.types import FinishReason

__all__ = ["TurnRequest", "TurnResult"]


@dataclass
class TurnRequest:
    """A chat request in dialect-neutral form."""

    units: Sequence[Unit]
    """The conversation, one unit per wire message (``messages.Units`` from the routes)."""
    tools: list[dict[str, Any]] | None = None
    """Tools in chat-template form."""
    max_tokens: int | None = None
    """Requested generation cap (may only lower the session's)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    """Extra stop strings."""
    tool_choice: ToolChoice = AUTO
    """Which parsed calls the reply may return (``core.gateway.toolchoice``)."""
    seed: int | None = None
    """The client's seed, mixed into the call's seed (``call_seed``)."""
    logprobs: bool = False
    """Return each sampled token's logprob (``TurnResult.logprobs``)."""
    template_kwargs: dict[str, Any] | None = None
    """Template variables for this request only (``core.gateway.reasoning_switches``)."""
    strict: dict[str, Any] | None = None
    """Schemas of the tools sent with ``strict: true``, by name (``core.gateway.strict``)."""
    hints_ignored: tuple[str, ...] = ()
    """Hints the request gave that the template cannot express and that constrain nothing
    the sampler may produce (``verbosity: low``): counted in ``hints_ignored``, not passed on."""
    model: Any = None
    """The request's ``model`` as sent (None when absent): it picks the turn's policy
    (``core.gateway.policies``)."""
    size: int = 0
    """Bytes of the request body; a full render of a body of ``GatewayConfig.render_offload_chars``
    or more runs in a worker thread."""


@dataclass
class TurnResult:
    """What the model answered, ready for either dialect."""

    content: str
    """Assistant text (without tool-call markup unless ill-formed)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Canonical tool calls (``id``, ``function.name``, ``function.arguments`` dict)."""
    finish_reason: FinishReason = FinishReason.STOP
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ill_formed: bool = False
    stop_string: str | None = None
    """The stop string that ended the turn, if one did."""
    tool_choice_violated: bool = False
    """The model did not follow the request's ``tool_choice`` (``toolchoice.enforce``)."""
    logprobs: list[TokenLogprob] | None = None
    """When asked for: every sampled token but the end-of-turn token that closed the turn."""
    reasoning: str = ""
    """Reasoning split off the turn's text (``<think>…</think>``); '' when none. OpenAI chat
    returns it as ``reasoning_content``, Anthropic messages as a ``thinking`` block."""
