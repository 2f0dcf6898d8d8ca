"""The Ray actor that hosts agent sessions on one node: ``AgentHost``.

Plain class (no ray import): the runtime wraps it with ``ray.remote`` when it
starts, so importing this module stays free of ray. Inside, a ``LocalRuntime``
runs the user's agent app as ``python -m core.agent`` servers bound to the
node's loopback; every agent fault (raise, hang, death of the agent process,
bad reward) is handled there exactly as under ``runtime=local`` and comes back
as a ``RolloutResult``. What this layer adds is only what Ray owns: placement
and the actor's own life (a dead actor or node is Ray's to restart).
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from core.runtime.config import LocalRuntimeConfig
from core.types import RolloutRequest, RolloutResult


class AgentHost:
    """One actor: a node-local agent server pool serving ``config.max_concurrency`` sessions.

    Args:
        agent: The agent app as ``module:attribute``.
        config: The pool's settings (``host`` is always loopback: only this actor dials it).
        env: Extra environment variables for the agent processes.
    """

    def __init__(self, agent: str, config: LocalRuntimeConfig, env: dict[str, str]) -> None:
        from core.runtime.local import LocalRuntime

        self._runtime = LocalRuntime(agent, config=config, env=env)
        self._ready: asyncio.Task[None] | None = None

    async def ready(self) -> dict[str, Any]:
        """Start the agent servers (once; Ray reruns ``__init__`` after a restart) and say where."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._runtime.start())
        await asyncio.shield(self._ready)
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "agent_pids": [p.pid for p in self._runtime.processes],
        }

    async def run(self, request: RolloutRequest) -> tuple[RolloutResult, str]:
        """Run one rollout here; returns it with this actor's node id (for placement metrics)."""
        await self.ready()
        import ray

        result = await self._runtime.run_rollout(request)
        return result, ray.get_runtime_context().get_node_id()

    async def cancel(self, rollout_id: str) -> None:
        """Stop a rollout in flight here (its ``run`` returns ``CRASHED``, cancelled)."""
        await self._runtime.cancel(rollout_id)

    async def shutdown(self) -> None:
        """Stop the agent servers (before the runtime kills this actor)."""
        await self._runtime.aclose()
