"""Registering every config node with Hydra, and where the composed config comes from.

``register_configs(plugins)`` stores ``base_train`` (the schema the primary
config ``conf/train.yaml`` starts from) and one node per registered backend
(``backend/<name>``), runtime (``runtime/<name>``) and reward (``reward/<name>``), so an installed plugin's
option exists without anyone editing ``conf/``, and the ``sampler`` group
(``backend``, ``vllm``, ``sglang``: ``core.trainer.fleet.SamplerConfig``).

The root schema, ``TrainConfig`` (re-exported here), and its conversion from the composed config
(``load_train_config``) are in ``core.trainer.config``.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from core.plugins.manager import Plugins
from core.trainer.config import TrainConfig
from core.trainer.fleet import SAMPLER_CHOICES, SamplerConfig

__all__ = ["CONFIG_MODULE", "PRIMARY_CONFIG", "VERSION_BASE", "TrainConfig", "register_configs"]

CONFIG_MODULE = "core.conf"
"""Python package holding the YAML configs (the repository's ``conf/``)."""
PRIMARY_CONFIG = "train"
VERSION_BASE = "1.3"


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

