"""Core's own plugin: registers the built-in ``local``, ``agentcore`` and ``ray`` runtimes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.plugins.hookspecs import hookimpl
from core.plugins.registry import RuntimeRegistry, RuntimeSpec
from core.runtime.agentcore.config import AgentCoreRuntimeConfig
from core.runtime.config import LocalRuntimeConfig
from core.runtime.ray.config import RayRuntimeConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from core.runtime.agentcore.runtime import AgentCoreRuntime
    from core.runtime.local import LocalRuntime
    from core.runtime.ray.runtime import RayRuntime

# Each factory gets the composed run config (``core.config.TrainConfig``, as Hydra's DictConfig).


def _make_local(cfg: DictConfig) -> LocalRuntime:
    from core.runtime.local import LocalRuntime

    return LocalRuntime.from_config(cfg)


def _make_agentcore(cfg: DictConfig) -> AgentCoreRuntime:
    # Lazy: the runtime imports boto3 when it starts; core must import without it.
    from core.runtime.agentcore.runtime import AgentCoreRuntime

    return AgentCoreRuntime.from_config(cfg)


def _make_ray(cfg: DictConfig) -> RayRuntime:
    # Lazy: ray is an optional extra (tracerl[ray]); core must import without it.
    from core.runtime.ray.runtime import RayRuntime

    return RayRuntime.from_config(cfg)


@hookimpl
def tracerl_register_runtimes(registry: RuntimeRegistry) -> None:
    registry.add(
        RuntimeSpec(
            name="local",
            factory=_make_local,
            config=LocalRuntimeConfig,
            description="agent app served by a pool of local processes",
        )
    )
    registry.add(
        RuntimeSpec(
            name="agentcore",
            factory=_make_agentcore,
            config=AgentCoreRuntimeConfig,
            description="one AWS Bedrock AgentCore Runtime session per rollout (boto3; TPS-limited)",
        )
    )
    registry.add(
        RuntimeSpec(
            name="ray",
            factory=_make_ray,
            config=RayRuntimeConfig,
            description="agent actors on a Ray cluster, placed by resources and labels (tracerl[ray])",
        )
    )
