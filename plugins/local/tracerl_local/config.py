"""Hydra node ``backend/local``: model, device, dtype, LoRA, optimizer and sampler batching.

The plugin registers ``LocalBackendConfig`` through ``tracerl_register_backends``;
``python -m core.train backend=local backend.model=Qwen/Qwen3-0.6B`` overrides
fields type-checked against these dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoraConfig:
    """Optional LoRA adapters (needs ``pip install tracerl-local[lora]``)."""

    enabled: bool = False
    """Train LoRA adapters instead of the full model (full fine-tuning by default)."""
    rank: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Adapter scaling."""
    dropout: float = 0.0
    """Adapter dropout; keep 0 so sampler and trainer logprobs agree."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """Modules that get adapters."""


@dataclass
class TinyModelConfig:
    """Shape of the ``model: tiny`` preset (a Qwen2-style model with random weights).

    The defaults are the shape of the toy-task prototype (about 137k
    parameters), which learns the embedded task; see docs/backends/local.md.
    """

    hidden_size: int = 64
    """Width of the residual stream."""
    intermediate_size: int = 256
    """Width of the MLP."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads (and key/value heads)."""
    max_position_embeddings: int = 4096
    """Context length: prompt plus generated tokens. As large as the gateway's default
    budget (``gateway.max_context_tokens``), so an agent's tool loop fits; it costs
    nothing until used (rotary positions: no weights per position)."""
    initializer_range: float = 0.02
    """Standard deviation of the random initial weights."""


@dataclass
class OptimizerConfig:
    """Optimizer state the backend keeps between ``optim_step`` calls.

    Step size, betas, eps, weight decay and clipping come with each
    ``optim_step(AdamParams)`` call, as in Tinker; only the kind is fixed here.
    """

    name: str = "adamw"
    """``adamw`` (Adam with decoupled weight decay; plain Adam when weight_decay is 0)."""


@dataclass
class LocalBackendConfig:
    """The model, where it runs, and how the sampler batches."""

    name: str = "local"
    """Backend name."""
    model: str = "tiny"
    """``tiny`` (built offline from ``seed``) or a Hugging Face model name or path."""
    tokenizer: str = ""
    """Tokenizer name or path; empty uses the model's (the offline tiny one for ``tiny``)."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``."""
    dtype: str = "auto"
    """``auto`` (bf16 on CUDA, fp32 on CPU), ``float32``, ``bfloat16`` or ``float16``."""
    num_threads: int = 1
    """torch CPU threads (process-wide: ``torch.set_num_threads``). 1 by default: the
    agents and the gateway share the cores, and oversubscribed OpenMP threads spin
    (see docs/backends/local.md); raise it when the backend has cores to itself."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the ``tiny`` preset."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer kind."""
    max_batch_size: int = 256
    """Most sequences the sampler decodes together."""
    batch_wait_ms: float = 2.0
    """How long the sampler waits to gather concurrent requests into one batch."""
    on_update: str = "continue"
    """What generations running at a weight sync do: ``continue`` (interrupted and
    continued under the new weights, keeping their tokens: partial rollouts, each
    turn recording a segment per weight version), ``abort`` (end them, as an
    engine's abort-on-update does) or ``finish`` (on the weights they started with)."""
    train_micro_batch: int = 64
    """Most datums per forward/backward micro-batch (bounds activation memory)."""
    train_tokens_per_micro_batch: int = 16384
    """Most padded tokens (datums x longest datum) per forward/backward micro-batch; a
    datum longer than this goes alone. 0: only ``train_micro_batch`` bounds a micro-batch."""
    train_logprob_chunk: int = 1024
    """Tokens whose full-vocabulary logits exist at once when the trainer scores its
    tokens (computed again in the backward, one chunk at a time). 0: the whole
    micro-batch's at once (faster for tiny vocabularies, tokens x vocabulary floats)."""
    train_bf16_autocast: bool = False
    """Run the trainer's forward in bf16 under ``torch.autocast`` while weights, gradients
    and AdamW's state stay in ``dtype``: with ``dtype: float32`` this is mixed precision,
    which keeps the small updates of a full fine-tune that bf16 weights round away.
    The sampler computes in ``dtype``, so trainer and sampler logprobs differ by bf16
    rounding."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input for the backward and run the layer again
    there (transformers' activation checkpointing): less memory, about a third more
    compute. Refused for models configured with dropout."""
