"""What the built-in runtimes read from the composed run config, besides their own node.

The composed config is the ``DictConfig`` of ``core.config.TrainConfig`` that
``python -m core.train`` (and ``core.eval``, ``core.testing.build_runtime``)
hands every runtime factory. Local and ray read the agent app and its
environment (``task``); ray and agentcore read the host the trainer advertises
for its gateway (``gateway``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig


def agent_app(cfg: DictConfig) -> tuple[str, dict[str, str]]:
    """``task.agent`` and ``task.agent_env`` (as strings).

    Raises:
        ConfigError: ``task.agent`` is empty.
    """
    agent = str(cfg.task.agent or "")
    if not agent:
        raise ConfigError(
            "task.agent is empty; set it to the agent app, e.g. task.agent=my_agent:app"
        )
    env = {str(k): str(v) for k, v in dict(cfg.task.get("agent_env") or {}).items()}
    return agent, env


def check_agent_ref(agent: str) -> None:
    """Refuse an agent app that is not ``module:attribute``.

    Raises:
        ConfigError: naming the expected shape.
    """
    module, sep, attr = agent.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            f"the agent must be 'module:attribute' (e.g. 'examples.math_agent.agent:app'), got {agent!r}"
        )


def advertised_gateway_host(cfg: DictConfig) -> str:
    """``gateway.public_host``, else ``gateway.host``; empty without a ``gateway`` node."""
    gateway = cfg.get("gateway") if hasattr(cfg, "get") else None
    if gateway is None:
        return ""
    return str(gateway.get("public_host") or gateway.get("host") or "")
