"""One gateway session: its settings, history tree, turns and counters.

Defines ``Session`` and ``new_session_id``. Sessions are created by the trainer
(in process or over the admin routes), never implicitly by a request: an agent
with a wrong or stale key is refused instead of feeding a shared session.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from core.gateway.history import Matched, Node, Turn
from core.gateway.resent import ResentBody
from core.types import DEFAULT_POLICY, SamplingParams

__all__ = ["COUNTERS", "Session", "new_session_id"]

COUNTERS = (
    "ill_formed_tool_calls",
    "unknown_tool_calls",
    "nonlinear_resets",
    "full_renders",
    "tail_fallbacks",
    "context_length_exceeded",
    "disconnected_turns",
    "sampler_errors",
    "aborted_turns",
    "sampling_overrides_ignored",
    "hints_ignored",
    "tool_choice_violations",
    "tool_calls_dropped",
    "strict_violations",
)
"""Per-session counters copied into every row's metadata."""


def new_session_id() -> str:
    """An unguessable session id: 192 random bits, URL- and header-safe."""
    return "tr-" + secrets.token_urlsafe(24)


@dataclass(eq=False)
class Session:
    """State of one session (one agent run)."""

    id: str
    """The session id (the agent's API key)."""
    sampling: SamplingParams
    """Defaults for every turn; see ``Gateway.create_session`` for precedence."""
    max_context_tokens: int
    """Prompt + generation budget per turn; 0 is unlimited."""
    history_mode: str
    """``linear`` or ``tree``."""
    allow_sampling_overrides: bool
    """Whether requests may set temperature/top_p/top_k."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Caller data; ``rollout_id`` and ``group_id`` land on the rows."""
    policy: str = DEFAULT_POLICY
    """The policy of turns whose request names none (``PolicyRoutes.route``)."""
    root: Node = field(default_factory=lambda: Node(canon=[]))
    """Root of the message tree (linear mode: the current chain's root)."""
    tree_version: int = 0
    """Bumped whenever the tree may have changed (a match, a reset, a recorded turn)."""
    matched: Matched | None = None
    """The last recorded turn's messages and their nodes, valid while ``tree_version`` is its own."""
    turns: list[Turn] = field(default_factory=list)
    """Generated turns in creation order."""
    call_ids: set[str] = field(default_factory=set)
    """Tool-call ids returned so far: a model id already given is replaced by a fresh one
    (clients match tool results to calls by id)."""
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    """Diagnostics, see ``COUNTERS``."""
    closed: bool = False
    """Finished: further requests get 409."""
    in_flight: int = 0
    """Turns being sampled right now."""
    sampler_calls: int = 0
    """Sampler calls started so far; the next call's index, which seeds it (``turn_seed``).
    Taken when the call starts, so concurrent turns of one session never share a seed."""
    idle: asyncio.Event | None = None
    """Set when ``in_flight`` drops to 0 (created lazily inside a loop)."""
    created_at: float = field(default_factory=time.time)
    """Creation time (epoch seconds)."""
    resent: ResentBody | None = None
    """The last turn request's body and parsed messages: the next request is parsed only
    past the bytes it resends (``core.gateway.resent``)."""
    responses: dict[str, Any] = field(default_factory=dict)
    """Responses API: the stored responses by id (``core.gateway.responses_api.StoredResponse``),
    kept while the session lives, for ``previous_response_id``."""

    def release(self) -> None:
        """Let go of what only an open session needs, once it is finished or dropped: the stored
        Responses (``previous_response_id`` and ``GET`` need an open session), the last match and
        the last request body.
        The turns and the history tree stay: the rows are built from them."""
        self.responses = {}
        self.matched = None
        self.resent = None

    def summary(self) -> dict[str, Any]:
        """JSON-able view for the admin routes."""
        return {
            "session_id": self.id,
            "closed": self.closed,
            "history_mode": self.history_mode,
            "turns": len(self.turns),
            "in_flight": self.in_flight,
            "max_context_tokens": self.max_context_tokens,
            "sampling": {
                "max_tokens": self.sampling.max_tokens,
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
                "top_k": self.sampling.top_k,
                "stop": list(self.sampling.stop),
            },
            "allow_sampling_overrides": self.allow_sampling_overrides,
            "policy": self.policy,
            "metadata": self.metadata,
            "counters": dict(self.counters),
            "created_at": self.created_at,
        }
