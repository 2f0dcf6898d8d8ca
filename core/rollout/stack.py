"""What every host of rollouts starts: the gateway's HTTP server, the runtime, a runner.

``start_rollout_stack`` brings up the gateway's HTTP server, the configured runtime
and a ``RolloutRunner`` over both: core's loop, ``python -m core.eval``, the verl
agent-loop workers and slime's rollout processes share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.rollout.outcome import (
    DEFAULT_EXCLUDE_ON,
    DEFAULT_MAX_ABS_REWARD,
    DEFAULT_REWARD_TIMEOUT_S,
)
from core.rollout.runner import RolloutLimits, RolloutRunner

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from core.plugins.manager import Plugins


@dataclass
class RolloutStack:
    """A started gateway server, runtime and the runner over both."""

    server: Any
    """The ``GatewayServer`` agents call."""
    runtime: Any
    """The started ``RolloutRuntime``."""
    runner: RolloutRunner
    """Runs rollouts through both."""

    async def aclose(self) -> None:
        """Stop the runtime, then the server."""
        try:
            await self.runtime.aclose()
        finally:
            await self.server.stop()


async def start_rollout_stack(
    cfg: DictConfig, gateway: Any, *, model_id: str, public_host: str = "", plugins: Plugins | None = None
) -> RolloutStack:
    """Serve ``gateway`` over HTTP and start ``runtime=<cfg.runtime.name>`` against it.

    Args:
        cfg: The composed config (``gateway``, ``runtime`` and ``trainer`` sections).
        gateway: The in-process ``Gateway``.
        model_id: Model name agents pass.
        public_host: Address agents dial, when it differs from ``cfg.gateway.host``
            (default: ``cfg.gateway.public_host``).
        plugins: Loaded plugins to find the runtime in (default: ``load_plugins()``).
    """
    from core.gateway import GatewayServer
    from core.plugins import load_plugins

    server = GatewayServer(
        gateway,
        host=str(cfg.gateway.host),
        port=int(cfg.gateway.port),
        public_host=public_host or str(cfg.gateway.public_host or ""),
    )
    await server.start()
    try:
        runtime = (plugins or load_plugins()).runtime(str(cfg.runtime.name)).factory(cfg)
        await runtime.start()
    except BaseException:
        await server.stop()
        raise
    trainer = cfg.trainer
    runner = RolloutRunner(
        gateway=gateway,
        base_url=server.base_url,
        runtime=runtime,
        model_id=model_id,
        limits=RolloutLimits(
            max_concurrency=int(trainer.max_concurrent_rollouts),
            timeout_s=float(trainer.rollout_timeout_s),
            exclude_on=[str(x) for x in _setting(trainer, "exclude_on", DEFAULT_EXCLUDE_ON)],
            max_abs_reward=float(_setting(trainer, "max_abs_reward", DEFAULT_MAX_ABS_REWARD)),
            reward_timeout_s=float(_setting(_setting(cfg, "reward", {}), "timeout_s", DEFAULT_REWARD_TIMEOUT_S)),
        ),
    )
    return RolloutStack(server=server, runtime=runtime, runner=runner)


def _setting(section: Any, key: str, default: Any) -> Any:
    """``section.key``, or ``default`` for configs built before the key existed."""
    try:
        value = section.get(key, default) if hasattr(section, "get") else getattr(section, key, default)
    except Exception:  # a config node without the key (struct mode)
        return default
    return default if value is None else value
