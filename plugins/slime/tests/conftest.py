"""Fixtures of the slime plugin's tests.

slime itself cannot be installed here (it is not on PyPI and needs patched
Megatron-LM and SGLang from GitHub), so these tests build slime's ``Sample``
through the plugin's stand-in (``tracerl_slime._sample_standin``, pinned to a
slime commit) and call the hooks exactly as slime would. Everything else is
real: the gateway and its HTTP server, the local runtime with agent processes
using the openai SDK.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

HERE = Path(__file__).parent
AGENTS_DIR = HERE / "agents"
sys.path.insert(0, str(AGENTS_DIR))


def compose_tracerl(overrides: list[str]) -> Any:
    from core.plugins import load_plugins
    from core.testing.fakes import compose

    return compose(overrides, load_plugins())


def slime_args(cfg: Any, **kw: Any) -> SimpleNamespace:
    """The slice of slime's parsed ``args`` our hooks read, as slime sets it at run time."""
    base: dict[str, Any] = {
        "hf_checkpoint": "tiny",
        "sglang_router_ip": "127.0.0.1",
        "sglang_router_port": 1,
        "router_policy": "consistent_hashing",
        "rollout_max_context_len": None,
        "use_rollout_routing_replay": False,
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "reward_key": None,
        "n_samples_per_prompt": 2,
        "rollout_batch_size": 2,
        "tracerl": OmegaConf.to_container(cfg, resolve=True) if cfg is not None else None,
    }
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    from core.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def slime_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One persistent event loop per module, like slime's background rollout loop.

    The plugin's ``WorkerHost`` (gateway server + local runtime) starts in it on
    first use and is shut down at the end of the module.
    """
    from tracerl_slime.host import WorkerHost

    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(WorkerHost.shutdown())
        WorkerHost.sampler_factory = _DEFAULT_FACTORY
        loop.close()


def _default_factory() -> Any:
    from tracerl_slime.host import default_sampler

    return default_sampler


_DEFAULT_FACTORY = _default_factory()


def agent_overrides(run_dir: Path, *extra: str) -> list[str]:
    return [
        "backend=slime",
        f"run_dir={run_dir}",
        "task.agent=slime_test_agents:app",
        f"+task.agent_env.PYTHONPATH={AGENTS_DIR}",
        "runtime.num_processes=1",
        "gateway.history_mode=tree",
        "algorithm.max_tokens=6",
        "trainer.rollout_timeout_s=60",
        *extra,
    ]
