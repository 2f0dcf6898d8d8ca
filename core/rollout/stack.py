"""What every host of rollouts starts: the gateway's HTTP server, the runtime, a runner.

``start_rollout_stack`` brings up the gateway's HTTP server, the configured runtime
and a ``RolloutRunner`` over both: core's loop, ``python -m core.eval``, the verl
agent-loop workers and slime's rollout processes share it. With ``gateway.shards``
above 1 it starts that many gateway processes instead (``core.rollout.shards``),
sampling from the ``sampler`` fleet, and the runner spreads sessions over them; with
``gateway.shards=per_node`` (``runtime=ray``), one on each node of the runtime's agent
actors, started once the runtime is (``core.rollout.node_shards``).
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
    from core.rollout.shards import GatewayShards


@dataclass
class RolloutStack:
    """A started gateway server, runtime and the runner over both."""

    server: Any
    """The ``GatewayServer`` agents call; None when the gateway is sharded."""
    runtime: Any
    """The started ``RolloutRuntime``."""
    runner: RolloutRunner
    """Runs rollouts through both."""
    shards: GatewayShards | None = None
    """The gateway processes, with ``gateway.shards`` above 1."""

    async def aclose(self) -> None:
        """Stop the runtime, then the server (or the shards)."""
        try:
            await self.runtime.aclose()
        finally:
            if self.server is not None:
                await self.server.stop()
            if self.shards is not None:
                await self.shards.aclose()


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
    from core.plugins import load_plugins

    public = public_host or str(cfg.gateway.public_host or "")
    per_node = _per_node(cfg)
    server, shards = (None, None) if per_node else await _serve(cfg, gateway, public)
    try:
        runtime = (plugins or load_plugins()).runtime(str(cfg.runtime.name)).factory(cfg)
        await runtime.start()
        if per_node:
            try:
                shards = await _serve_per_node(cfg, gateway, runtime)
            except BaseException:
                await runtime.aclose()
                raise
    except BaseException:
        if server is not None:
            await server.stop()
        if shards is not None:
            await shards.aclose()
        raise
    trainer = cfg.trainer
    runner = RolloutRunner(
        gateway=gateway,
        base_url=server.base_url if server is not None else "",
        sessions=shards,
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
    return RolloutStack(server=server, runtime=runtime, runner=runner, shards=shards)


def _per_node(cfg: DictConfig) -> bool:
    """True for ``gateway.shards=per_node``; a ``ConfigError`` unless the runtime is ray."""
    from core.gateway.config import SHARDS_PER_NODE

    if _setting(cfg.gateway, "shards", 1) != SHARDS_PER_NODE:
        return False
    runtime = str(_setting(_setting(cfg, "runtime", {}), "name", ""))
    if runtime != "ray":
        from core.errors import ConfigError

        raise ConfigError(
            f"gateway.shards={SHARDS_PER_NODE} starts one gateway on each Ray node that hosts agents, so it "
            f"needs runtime=ray; got runtime={runtime or '?'}. Use gateway.shards=N for N gateway processes "
            "on this machine (docs/scale.md)"
        )
    return True


async def _serve_per_node(cfg: DictConfig, gateway: Any, runtime: Any) -> GatewayShards:
    """A gateway shard on each node of the started ray ``runtime``'s agent actors."""
    import tempfile
    from pathlib import Path

    from core.gateway.config import SHARDS_PER_NODE
    from core.rollout.node_shards import NodeShards
    from core.rollout.shards import shard_spec

    sampler = shard_sampler(_setting(cfg, "sampler", None), SHARDS_PER_NODE)
    with tempfile.TemporaryDirectory(prefix="tracerl-shard-spec-") as folder:
        spec = shard_spec(gateway, sampler, Path(folder))
        shards = await NodeShards.start_on_nodes(spec, runtime)
    shards.collect_late_rewards(getattr(gateway, "late_rewards", None))  # the trainer's book
    return shards


async def _serve(cfg: DictConfig, gateway: Any, public_host: str) -> tuple[Any, GatewayShards | None]:
    """``gateway`` served in this process, or ``gateway.shards`` processes serving its like."""
    count = int(_setting(cfg.gateway, "shards", 1))
    if count <= 1:
        from core.gateway import GatewayServer

        server = GatewayServer(gateway, host=str(cfg.gateway.host), port=int(cfg.gateway.port), public_host=public_host)
        await server.start()
        return server, None
    import tempfile
    from pathlib import Path

    from core.rollout.shards import GatewayShards, shard_spec

    sampler = shard_sampler(_setting(cfg, "sampler", None), count)
    with tempfile.TemporaryDirectory(prefix="tracerl-shard-spec-") as folder:
        spec = shard_spec(gateway, sampler, Path(folder), public_host=public_host)
        shards = await GatewayShards.start(spec, count)
    # Rollouts wait for late rewards in the trainer's book; rewards posted to a shard reach it.
    shards.collect_late_rewards(getattr(gateway, "late_rewards", None))
    return None, shards


def shard_sampler(node: Any, shards: int | str) -> dict[str, Any]:
    """The sampler every shard calls: the ``sampler`` fleet's settings (``HttpSamplerConfig``
    fields); a ``ConfigError`` when the run samples with its backend, whose sampler lives in
    this process and no shard process can call."""
    from dataclasses import fields

    from core.errors import ConfigError
    from core.samplers import HttpSamplerConfig

    kind = str(_setting(node, "kind", "backend")) if node is not None else "backend"
    if kind not in ("vllm", "sglang"):
        raise ConfigError(
            f"gateway.shards={shards} needs a sampler every gateway process can call: sampler=vllm or "
            f"sampler=sglang with sampler.urls (on one machine: python -m tracerl_local.serve --port 30000, "
            f"then sampler=sglang sampler.urls='[http://127.0.0.1:30000]'); sampler={kind} samples inside "
            "the trainer's process. Use gateway.shards=1 with it (docs/scale.md)"
        )
    out: dict[str, Any] = {}
    for f in fields(HttpSamplerConfig):
        value = _setting(node, f.name, None)
        if value is not None:
            out[f.name] = value if isinstance(value, str | int | float | bool) else _plain(value)
    return out


def _plain(value: Any) -> Any:
    """A config node (list or dict) as plain JSON-able values."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _setting(section: Any, key: str, default: Any) -> Any:
    """``section.key``, or ``default`` for configs built before the key existed."""
    try:
        value = section.get(key, default) if hasattr(section, "get") else getattr(section, key, default)
    except Exception:  # a config node without the key (struct mode)
        return default
    return default if value is None else value
