"""Config schema of the ``ray`` runtime (the ``runtime=ray`` Hydra node).

Kept free of ray so that Hydra registers the node without the ``ray`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.runtime.config import AgentServerSettings


@dataclass
class RayRuntimeConfig(AgentServerSettings):
    """Agent sessions on a Ray cluster: actors, each hosting one node-local agent server pool.

    The agent server settings (``python``, ``max_restarts``, ``result_channel``, ``s3_*``...)
    come from ``AgentServerSettings`` and reach each actor's pool as under ``runtime=local``."""

    name: str = "ray"
    """Runtime name."""
    address: str = ""
    """Cluster to join: ``auto`` (the cluster of this node), ``ray://host:10001`` (Ray client),
    ``host:6379``; empty starts a private Ray on this machine (stopped by ``aclose``)."""
    namespace: str = "tracerl"
    """Ray namespace of the agent actors (their names start with ``tracerl-agent-``)."""
    num_actors: int = 2
    """Agent actors; each runs ``processes_per_actor`` agent servers on its node."""
    agents_per_actor: int = 64
    """Sessions one actor serves at once (rollouts in flight: ``num_actors * agents_per_actor``)."""
    num_cpus_per_agent: float = 0.01
    """CPUs one session needs; an actor reserves ``num_cpus_per_agent * agents_per_actor``."""
    memory_per_agent_mb: float = 0.0
    """Memory (MiB) one session needs, reserved like the CPUs; 0 reserves none."""
    resources_per_agent: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources one session needs (e.g. ``{sandbox: 1}``), reserved like the CPUs."""
    label_selector: dict[str, str] = field(default_factory=dict)
    """Node labels an actor's node must carry (Ray label selectors, e.g.
    ``{ray.io/node-group: agents}`` or ``{"zone": "in(a,b)"}``)."""
    scheduling_strategy: str = "SPREAD"
    """``SPREAD`` (actors on as many nodes as fit) or ``DEFAULT`` (Ray packs them)."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray ``runtime_env`` of the actors (``working_dir``, ``pip``, ``env_vars``, ...): how the
    agent's code reaches nodes that do not have it installed."""
    max_actor_restarts: int = 10
    """Times Ray may recreate a dead actor (on any node that fits) before it is left dead."""
    call_grace_s: float = 30.0
    """How long past a rollout's own timeout the driver waits for an unresponsive actor."""
    processes_per_actor: int = 1
    """Agent server processes per actor (``runtime=local``'s ``num_processes``, per node)."""
    startup_timeout_s: float = 120.0
    """How long an actor may take to come up (placement plus its agent servers answering)."""
    num_cpus: float = 0.0
    """With an empty ``address``: CPUs of the private Ray (0: all of this machine's)."""
    object_store_memory_mb: int = 0
    """With an empty ``address``: object store size of the private Ray (0: Ray's default)."""
