"""``gateway.shards=per_node`` without a cluster: the setting composes, its bad spellings and
its use outside ``runtime=ray`` are refused with what to do, and the ray runtime skips the
trainer-gateway address check (agents dial their own node's shard). The shards themselves run
on a loopback Ray cluster: ``tests/runtime/ray/cluster/test_ray_node_shards.py`` (marker ``ray``).
"""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf

from core.errors import ConfigError
from core.gateway import GatewayConfig
from core.plugins import load_plugins
from core.rollout.stack import start_rollout_stack
from core.runtime.ray import RayRuntime
from core.testing.fakes import compose, fake_backend_plugin
from core.trainer.config import load_train_config


def _compose(*overrides: str) -> object:
    return compose(["backend=fake", *overrides], load_plugins(extra_plugins=(fake_backend_plugin(),)))


def test_per_node_composes_and_reaches_the_gateway_config() -> None:
    cfg = _compose("runtime=ray", "gateway.shards=per_node")
    assert load_train_config(cfg).gateway.shards == "per_node"  # type: ignore[arg-type]
    assert load_train_config(_compose("gateway.shards=3")).gateway.shards == 3  # type: ignore[arg-type]


def test_bad_shard_settings_are_refused_naming_both_forms() -> None:
    for bad in ("per-node", 0, True, 2.5):
        with pytest.raises(ConfigError, match=r"gateway.shards must be an integer >= 1 .* or 'per_node'"):
            GatewayConfig(shards=bad)  # type: ignore[arg-type]


def test_per_node_needs_the_ray_runtime() -> None:
    """Refused before anything starts (no gateway served, no agent spawned)."""
    cfg = _compose("gateway.shards=per_node")
    assert cfg.runtime.name == "local"  # type: ignore[attr-defined]

    async def go() -> None:
        await start_rollout_stack(cfg, gateway=None, model_id="tiny")  # type: ignore[arg-type]

    with pytest.raises(ConfigError, match=r"gateway.shards=per_node starts one gateway on each Ray node .* needs "
                       r"runtime=ray; got runtime=local. Use gateway.shards=N"):
        asyncio.run(go())


def test_with_per_node_the_ray_runtime_does_not_check_the_trainers_gateway_address() -> None:
    """Agents call their own node's shard, so a loopback ``gateway.host`` is no error with
    nodes on other machines; without per_node the check stays."""
    base = ["runtime=ray", "task.agent=core.testing.conformance_agent:app", "gateway.host=127.0.0.1"]
    per_node = RayRuntime.from_config(_compose(*base, "gateway.shards=per_node"))  # type: ignore[arg-type]
    assert per_node.gateway_host == ""
    assert RayRuntime.from_config(_compose(*base)).gateway_host == "127.0.0.1"  # type: ignore[arg-type]


def test_per_node_with_the_backends_sampler_is_refused() -> None:
    from core.rollout.stack import shard_sampler

    with pytest.raises(ConfigError, match=r"gateway.shards=per_node needs a sampler every gateway process can call"):
        shard_sampler(OmegaConf.create({"kind": "backend"}), "per_node")
