"""Where a rollout's gateway session lives: the gateway in this process, or a shard.

Defines:

- ``SessionHost``: what ``RolloutRunner`` needs of the gateway: open a session (its
  id and the base URL its agent dials), harvest it when the rollout ends, and the
  late-reward book when the host keeps one.
- ``InProcessSessions``: the in-process ``Gateway`` behind one ``GatewayServer``
  (the default: no HTTP between the runner and the gateway, exactly as before shards).
- ``ShardLost``: a gateway shard died or stopped answering; its message names the shard
  (``core.rollout.shards``), and the runner fails only that shard's rollouts with it.
"""

from __future__ import annotations

from typing import Any, Protocol

from core.errors import TracerlError
from core.gateway.harvest import Harvest, harvest_session
from core.types import SamplingParams

__all__ = ["InProcessSessions", "SessionHost", "ShardLost"]


class ShardLost(TracerlError, RuntimeError):
    """A gateway shard is gone: its sessions' traces are lost, and new sessions go elsewhere."""


class SessionHost(Protocol):
    """Opens and harvests the gateway sessions of rollouts."""

    late_rewards: Any
    """``core.gateway.late_rewards.LateRewards`` the rewards posted after a rollout land
    in, or None where the host keeps none (then a ``reward_pending`` rollout stays so)."""

    async def open(self, sampling: SamplingParams, metadata: dict[str, Any]) -> tuple[str, str]:
        """A new session's id and the OpenAI-style base URL its agent dials.

        Raises:
            ShardLost: no gateway can take the session.
        """
        ...

    async def harvest(self, sid: str) -> Harvest | None:
        """Finish and drop ``sid``: its rows, counters and conversation; None when it
        was dropped.

        Raises:
            ShardLost: the gateway holding ``sid`` is gone (its message names it).
        """
        ...


class InProcessSessions:
    """Sessions of the ``Gateway`` in this process, reached by agents at ``base_url``."""

    def __init__(self, gateway: Any, base_url: str) -> None:
        self.gateway = gateway
        self.base_url = base_url
        self.late_rewards = getattr(gateway, "late_rewards", None)

    async def open(self, sampling: SamplingParams, metadata: dict[str, Any]) -> tuple[str, str]:
        return self.gateway.create_session(sampling=sampling, metadata=metadata), self.base_url

    async def harvest(self, sid: str) -> Harvest | None:
        return harvest_session(self.gateway, sid)
