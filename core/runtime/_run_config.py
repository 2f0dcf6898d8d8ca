"""What the built-in runtimes read from the composed run config, besides their own node.

The composed config is the ``DictConfig`` of ``core.config.TrainConfig`` that
``python -m core.train`` (and ``core.eval``, ``core.testing.build_runtime``)
hands every runtime factory. Local and ray read the agent app and its
environment (``task``); ray and agentcore read the host the trainer advertises
for its gateway (``gateway``). All three read their own node's fields, and take
keyword overrides of them, the same way.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from omegaconf import DictConfig

SettingsT = TypeVar("SettingsT", bound="DataclassInstance")


def node_values(node: DictConfig, schema: type[DataclassInstance], *, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of dataclass ``schema`` that ``node`` sets (a wrapper's extra fields are not read)."""
    names = {f.name for f in dataclasses.fields(schema)} - set(leave_out)
    return {k: node[k] for k in names if k in node}


def with_overrides(settings: SettingsT, overrides: dict[str, Any], *, runtime: str) -> SettingsT:
    """``settings`` with the keyword ``overrides`` a runtime's constructor took.

    Raises:
        ConfigError: an override names no field of the settings (``runtime`` says whose).
    """
    known = {f.name for f in dataclasses.fields(settings)}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(f"unknown {runtime} settings {sorted(unknown)!r}; known: {sorted(known)!r}")
    return dataclasses.replace(settings, **overrides)


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
