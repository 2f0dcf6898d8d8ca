"""Hydra node ``backend/local``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoraConfig:
    """Optional LoRA adapters (needs ``pip install tracerl-local[lora]``)."""

    enabled: bool = False
    """Train LoRA adapters instead of the full model."""
    rank: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Adapter scaling."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Modules that get adapters."""


@dataclass
class LocalBackendConfig:
    """The model, where it runs, and how the sampler batches."""

    name: str = "local"
    """Backend name."""
    model: str = "tiny"
    """``tiny`` (built offline from ``seed``) or a Hugging Face model name or path."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``."""
    dtype: str = "auto"
    """``auto`` (bf16 on CUDA, fp32 on CPU), ``float32``, ``bfloat16`` or ``float16``."""
    num_threads: int = 2
    """torch CPU threads."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings."""
    max_batch_size: int = 256
    """Most sequences the sampler decodes together."""
    batch_wait_ms: float = 2.0
    """How long the sampler waits to gather concurrent requests into one batch."""
    train_micro_batch: int = 64
    """Datums per forward/backward micro-batch."""
