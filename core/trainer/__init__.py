"""The training loop for backends core drives (local, Tinker, SageMaker).

Defines ``run_training(cfg, plugins)`` (see ``core.trainer.loop``); the
config schemas are in ``core.trainer.config``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from core.plugins.manager import Plugins

__all__ = ["run_training"]


def run_training(cfg: DictConfig, plugins: Plugins) -> int:
    """Run the GRPO loop described by ``cfg``; returns an exit code."""
    from core.trainer.loop import run_training as _run

    return _run(cfg, plugins)
