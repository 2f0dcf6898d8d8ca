"""Hydra node ``backend/tinker``.

Required: ``base_model`` (unless ``resume_from`` is set) and an API key
(``api_key`` here or ``TINKER_API_KEY`` in the environment). ``from_config``
checks both before anything is sent to the service.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TinkerBackendConfig:
    """Which model Tinker trains, how, and how tracerl talks to the service."""

    name: str = "tinker"
    """Backend name."""
    base_model: str = ""
    """Required (unless ``resume_from``): the model Tinker fine-tunes, e.g. ``Qwen/Qwen3-8B``."""
    api_key: str = ""
    """Tinker API key (``tml-...``); empty reads ``TINKER_API_KEY``. Prefer the variable."""
    base_url: str = ""
    """Service URL; empty reads ``TINKER_BASE_URL``, then the SDK's production default."""
    lora_rank: int = 32
    """LoRA rank."""
    train_mlp: bool = True
    """Put adapters on the MLP layers."""
    train_attn: bool = True
    """Put adapters on the attention layers."""
    train_unembed: bool = True
    """Put an adapter on the unembedding."""
    seed: int | None = None
    """Seed of the adapter initialisation; null lets the service pick."""
    resume_from: str = ""
    """A ``tinker://`` state path from ``save_state``: start from its weights and optimizer."""
    tokenizer: str = ""
    """Empty: the SDK's tokenizer for the model (downloads from the Hugging Face hub).
    Otherwise ``tiny`` or a Hugging Face name or local path (no SDK call)."""
    model_id: str = ""
    """Model name agents send in requests; empty uses ``base_model``."""
    checkpoint_ttl_seconds: int | None = None
    """Lifetime of checkpoints written by ``save_state``; null keeps them."""
    request_timeout_s: float = 900.0
    """Longest wait for one training operation or sampling request."""
