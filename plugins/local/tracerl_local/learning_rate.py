"""Starting learning rates for a real model, by mode, and the warning when a run is far above them.

``algorithm.learning_rate`` defaults to 1e-3, tuned for the ``tiny`` preset
(a random 142k-parameter model). On a pretrained model that is a step size
that wrecks the weights in a few steps, so the local backend warns at start
when ``backend.model`` names a real model and the rate is above its mode's
range. The default itself does not change with the model: a value that
depended on another setting would not be the one ``--cfg job`` prints.

Sources (docs/real_models.md, "Learning rate"):

- Full fine-tuning with RL: 1e-6, the actor learning rate of verl's GRPO
  example for Qwen2-7B (its ``grpo_trainer/run_qwen2-7b.sh``); up to about 1e-5.
- LoRA: about 10x the full fine-tuning rate (Thinking Machines, "LoRA Without
  Regret", 2025; tinker-cookbook's ``get_lora_lr_over_full_finetune_lr``
  returns 10): 1e-5, the default of tinker-cookbook's RL recipe
  (``recipes/math_rl``, LoRA rank 32); up to about 1e-4.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

FULL_START, FULL_MAX = 1e-6, 1e-5
"""Full fine-tuning: where to start, and above what the backend warns."""
LORA_START, LORA_MAX = 1e-5, 1e-4
"""LoRA: where to start, and above what the backend warns."""


def learning_rate_advice(model: str, lora: bool, learning_rate: float) -> str | None:
    """A warning for ``learning_rate`` on ``model`` (None when it is in range or the model is ``tiny``)."""
    if model == "tiny":
        return None
    start, most = (LORA_START, LORA_MAX) if lora else (FULL_START, FULL_MAX)
    if learning_rate <= most:
        return None
    mode = "LoRA" if lora else "full fine-tuning"
    return (
        f"algorithm.learning_rate={learning_rate:g} with backend.model={model!r} ({mode}): the default "
        f"1e-3 suits the tiny model; a pretrained model under {mode} usually starts at {start:g} and stays "
        f"at or below {most:g}. Set algorithm.learning_rate={start:g} (see docs/real_models.md, Learning rate)"
    )


def warn_about_learning_rate(model: str, lora: bool, learning_rate: float) -> None:
    """Log ``learning_rate_advice`` as a warning, if any."""
    advice = learning_rate_advice(model, lora, learning_rate)
    if advice:
        logger.warning(advice)
