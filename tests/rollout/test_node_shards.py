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


def test_a_late_shard_whose_start_fails_is_logged_and_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A node that got agent actors after the start: while its shard starts, rollouts may wait
    for it (``_is_starting``); a start that fails with any error (here not a Ray one) is logged,
    the waiting rollouts are woken, and the node is tried again ``LATE_RETRY_S`` later. Ray
    itself is not involved: the launch and the runtime are stand-ins (the real start is
    tests/runtime/ray/cluster/test_ray_node_shards.py)."""
    from core.rollout import node_shards

    monkeypatch.setattr(node_shards, "LATE_RETRY_S", 0.1)

    class Launch:
        starts = 0

        async def start(self, nodes: list[str], *, first_index: int) -> list[object]:
            self.starts += 1
            await asyncio.sleep(0.05)
            raise ValueError(f"bad actor options for {nodes} (shard {first_index})")

    class Runtime:
        woken = 0

        async def placement_changed(self) -> None:
            self.woken += 1

    async def go() -> None:
        runtime, launch = Runtime(), Launch()
        shards = node_shards.NodeShards([], "token", runtime)  # type: ignore[arg-type]
        shards._launch = launch  # type: ignore[assignment]
        try:
            assert shards._hosts("node-late") is False
            assert shards._is_starting("node-late") and launch.starts == 0
            assert shards._hosts("node-late") is False and len(shards._late) == 1  # one start at a time
            await asyncio.sleep(0.08)
            assert not shards._is_starting("node-late") and runtime.woken == 1 and launch.starts == 1
            shards._hosts("node-late")
            assert launch.starts == 1 and not shards._is_starting("node-late"), "not again before LATE_RETRY_S"
            await asyncio.sleep(0.15)
            shards._hosts("node-late")
            assert shards._is_starting("node-late"), "tried again"
            await asyncio.sleep(0.08)
            assert launch.starts == 2
        finally:
            await shards.aclose()
        assert shards._launch is None

    with caplog.at_level("ERROR", logger="core.rollout.node_shards"):
        asyncio.run(go())
    assert "starting a gateway shard on node node-late failed: ValueError: bad actor options" in caplog.text
