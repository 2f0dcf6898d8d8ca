"""Which policy a turn belongs to: routing by the ``model`` name a request sends.

Defines:

- ``PolicyRoutes``: the policies a gateway serves, the model names that route to each,
  and ``route``, which picks a turn's policy (400 naming the known policies for a model
  name none answers to).

Why the gateway routes: an agent with sub-agents (a planner and a coder) already names
a model per call; one gateway sees every call of every sub-agent, so a policy per
sub-agent needs only that name mapped (docs/multi_agent.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError
from core.gateway.errors import bad_request
from core.types import DEFAULT_POLICY

__all__ = ["PolicyRoutes"]


@dataclass(frozen=True)
class PolicyRoutes:
    """The policies one gateway serves and the model names routed to each."""

    names: tuple[str, ...] = (DEFAULT_POLICY,)
    """Policy names; the first is the default of sessions created without one."""
    models: Mapping[str, str] = field(default_factory=dict)
    """Model name -> policy name. Each policy also answers to its own name."""

    def __post_init__(self) -> None:
        if not self.names or len(set(self.names)) != len(self.names):
            raise ConfigError(f"policies must be distinct names, at least one; got {list(self.names)!r}")
        unknown = sorted({p for p in self.models.values() if p not in self.names})
        if unknown:
            raise ConfigError(f"model names route to unknown policies {unknown}; known: {list(self.names)}")

    @property
    def default(self) -> str:
        """The policy of a session created without one."""
        return self.names[0]

    def check(self, policy: str) -> str:
        """``policy`` when this gateway serves it; ``ConfigError`` naming the known ones otherwise."""
        if policy not in self.names:
            raise ConfigError(f"unknown policy {policy!r}; this gateway serves {list(self.names)}")
        return policy

    def model_names(self, served_as: str) -> list[str]:
        """Every model name a request may send: ``served_as`` (the session's policy), then, with
        several policies, each policy's name and the model names routed to it."""
        if len(self.names) == 1:
            return [served_as]
        names = [served_as, *self.names, *self.models]
        return list(dict.fromkeys(names))

    def route(self, model: Any, session_policy: str, served_as: str) -> str:
        """The policy of a turn whose request sent ``model``.

        With one policy every turn is its own, whatever ``model`` says (the gateway has always
        ignored it). With several: a model name a policy answers to (its name or one of its
        ``models``) picks it; no ``model``, or the gateway's own model id (``served_as``, what
        the runtime hands agents as ``model_id``), takes the session's policy.

        Raises:
            GatewayError: 400 for any other ``model``, naming the known policies.
        """
        if len(self.names) == 1:
            return self.names[0]
        if isinstance(model, str):
            if model in self.models:
                return self.models[model]
            if model in self.names:
                return model
        if model is None or model == served_as:
            return session_policy
        known = {name: sorted([name, *(m for m, p in self.models.items() if p == name)]) for name in self.names}
        shown = model if isinstance(model, str) else type(model).__name__
        raise bad_request(
            f"'model' {shown[:80]!r} names no policy of this gateway; the policies and the model names that "
            f"route to them are {known}. Send one of those names, or {served_as!r} (or no model) for the "
            f"session's policy {session_policy!r} (docs/multi_agent.md)",
            param="model",
            code="model_not_found",
        )
