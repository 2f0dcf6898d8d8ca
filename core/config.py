"""The root config schema and the registration of every config node with Hydra.

``register_configs(plugins)`` stores ``base_train`` (the schema the primary
config ``conf/train.yaml`` starts from) and one node per registered backend
(``backend/<name>``), runtime (``runtime/<name>``) and reward (``reward/<name>``), so an installed plugin's
option exists without anyone editing ``conf/``, and the ``sampler`` group
(``backend``, ``vllm``, ``sglang``: ``core.trainer.fleet.SamplerConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from core.eval.config import EvalConfig
from core.gateway.config import GatewayConfig
from core.plugins.manager import Plugins
from core.trainer.config import AlgorithmConfig, TaskConfig, TrainerConfig
from core.trainer.fleet import SAMPLER_CHOICES, SamplerConfig

CONFIG_MODULE = "core.conf"
"""Python package holding the YAML configs (the repository's ``conf/``)."""
PRIMARY_CONFIG = "train"
VERSION_BASE = "1.3"


@dataclass
class TrainConfig:
    """Schema of the composed config of ``python -m core.train``."""

    seed: int = 0
    """Seed for data order, sampling and model initialisation."""
    run_dir: str = MISSING
    """Where metrics, checkpoints and the report go (default under ``outputs/``)."""
    backend: Any = MISSING
    """The ``backend/<name>`` node a plugin registered; has at least ``name``."""
    runtime: Any = MISSING
    """The ``runtime/<name>`` node; has at least ``name``."""
    reward: Any = MISSING
    """The ``reward/<name>`` node (``core.rewards.RewardConfig`` fields at least)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and loss."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Data and agent."""
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    """The token-capturing gateway."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop length, sizes and guards."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Who samples: the backend (default) or a vLLM/SGLang fleet (``sampler=sglang``)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """``python -m core.eval`` settings (docs/eval.md)."""


def register_configs(plugins: Plugins) -> None:
    """Store the schema and every plugin's backend/runtime/reward node in Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    cs.store(name="base_train", node=TrainConfig, provider="tracerl")
    for kind in SAMPLER_CHOICES:  # sampler=backend|vllm|sglang
        cs.store(group="sampler", name=kind, node=SamplerConfig(kind=kind), provider="tracerl")
    for group, registry in (("backend", plugins.backends), ("runtime", plugins.runtimes), ("reward", plugins.rewards)):
        for name in registry.names():
            origin = registry.origin(name)
            cs.store(group=group, name=name, node=registry.node(name), provider=origin.distribution or origin.plugin)
