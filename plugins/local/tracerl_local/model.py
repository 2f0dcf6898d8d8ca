"""Building or loading the policy model, and calling it the same way everywhere.

Defines:

- ``resolve_device`` / ``resolve_dtype``: what ``device: auto`` and ``dtype: auto`` mean.
- ``build_tiny_model``: the ``tiny`` preset, a Qwen2-style model with random
  weights, deterministic in the seed, sized to the offline tiny tokenizer.
- ``load_model``: ``tiny`` or a Hugging Face name/path, with optional LoRA.
- ``enable_checkpointing``: transformers' activation checkpointing, refused
  for a model configured with dropout.
- ``model_forward``: one forward pass with explicit positions and an optional
  KV cache. transformers 5.x renamed the cache argument from
  ``past_key_values`` to ``cache``; the name is picked once from the signature
  so both spellings work.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from core.errors import ConfigError
from tracerl_local.config import LocalBackendConfig, LoraConfig, TinyModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else must be a torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"backend.device={name!r} is not a torch device; use auto, cpu or cuda[:N]"
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"backend.device={name!r} but CUDA is not available; use backend.device=cpu or auto"
        )
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` is bf16 on CUDA (fast, stable) and fp32 on CPU (bf16 matmuls are slow there)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ConfigError(
            f"backend.dtype={name!r} is not supported; use auto, {', '.join(_DTYPES)}"
        )
    return _DTYPES[name]


def build_tiny_model(tokenizer: Any, shape: TinyModelConfig, seed: int) -> torch.nn.Module:
    """A Qwen2-style causal LM with random weights; the same seed gives the same weights.

    The global torch RNG is forked so building a model does not disturb the
    caller's random stream.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape.hidden_size % shape.num_heads:
        raise ConfigError(
            f"backend.tiny.hidden_size={shape.hidden_size} must be divisible by "
            f"backend.tiny.num_heads={shape.num_heads}"
        )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=shape.initializer_range,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model


def _apply_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError as exc:
        raise ConfigError(
            "backend.lora.enabled=true needs peft; install it with "
            "`pip install -e 'plugins/local[lora]'` (or `pip install tracerl-local[lora]`)"
        ) from exc
    peft_config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def load_model(
    cfg: LocalBackendConfig,
    seed: int,
    *,
    corpus: list[str] | None = None,
    vocab_size: int = 0,
    whole_tokens: list[str] | None = None,
) -> tuple[torch.nn.Module, Any]:
    """The model (on its device, in its dtype, LoRA applied) and its tokenizer.

    ``corpus``, ``vocab_size`` and ``whole_tokens`` shape the tokenizer of the
    ``tiny`` preset (a task's own texts: a small vocabulary and short sequences
    are what let a tiny model learn fast).

    Raises:
        ConfigError: unknown device/dtype, a model or tokenizer that cannot be
            loaded, or LoRA asked for without peft installed.
    """
    from core.tokenizer import build_tiny_tokenizer, load_tokenizer

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.model == "tiny":
        if cfg.tokenizer:
            tokenizer = load_tokenizer(cfg.tokenizer)
        else:
            sizing = {"vocab_size": vocab_size} if vocab_size > 0 else {}
            tokenizer = build_tiny_tokenizer(corpus, whole_tokens=whole_tokens or (), **sizing)
        model = build_tiny_model(tokenizer, cfg.tiny, seed).to(dtype=dtype)
    else:
        from transformers import AutoModelForCausalLM

        try:
            tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
            model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"backend.model={cfg.model!r} could not be loaded ({exc}); pass a local "
                "directory or a Hugging Face model name that is already in the cache, or "
                "backend.model=tiny"
            ) from exc
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"the tokenizer of backend.model={cfg.model!r} has no eos_token; set one or "
            "pick another tokenizer with backend.tokenizer=..."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.lora.enabled:
        with torch.random.fork_rng(devices=[]):  # adapter init is seeded too
            torch.manual_seed(seed)
            model = _apply_lora(model, cfg.lora)
    model.to(device)
    model.train()
    return model, tokenizer


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Turn on transformers' activation checkpointing (non-reentrant, every decoder layer).

    A checkpointed layer is recomputed only in training mode, and the trainer
    keeps the model in eval mode so that it computes what the sampler computes;
    ``tracerl_local.training.checkpointed_layers`` flips the layers' own flag
    for the forward. A dropout probability in the model's config could then
    apply in the trainer and not in the sampler, so such a model is refused.

    Raises:
        ConfigError: the model cannot checkpoint, or its config sets a dropout.
    """
    base: Any = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        base = get_base()
    config = getattr(base, "config", None)
    values = config.to_dict() if config is not None else {}
    dropouts = {
        k: v for k, v in values.items()
        if ("dropout" in k or "pdrop" in k) and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    }
    if dropouts:
        raise ConfigError(
            f"backend.gradient_checkpointing=true with a model whose config sets dropout {dropouts!r}: "
            "the recomputed layers would drop activations the sampler keeps; set those to 0 in the "
            "model's config.json, or backend.gradient_checkpointing=false"
        )
    enable = getattr(base, "activation_checkpointing_enable", None) or getattr(
        base, "gradient_checkpointing_enable", None
    )
    if not callable(enable) or not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"backend.gradient_checkpointing=true but {type(base).__name__} does not support "
            "activation checkpointing; set backend.gradient_checkpointing=false"
        )
    enable({"use_reentrant": False})


def cache_argument(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward`` (``cache`` since transformers 5.24)."""
    target = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):  # a peft wrapper forwards **kwargs to the base model
        target = get_base()
    params = inspect.signature(target.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either attribute name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def model_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    cache: Any = None,
    cache_arg: str = "cache",
    use_cache: bool = False,
    logits_to_keep: int = 0,
) -> Any:
    """One forward pass with explicit ``position_ids`` (left padding needs them for RoPE)."""
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": use_cache,
        "logits_to_keep": logits_to_keep,
    }
    if cache is not None:
        kwargs[cache_arg] = cache
    return model(**kwargs)
