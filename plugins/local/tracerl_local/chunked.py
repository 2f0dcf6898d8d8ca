"""Trainer logprobs without full-vocabulary logits for a whole micro-batch.

A model's logits are ``tokens x vocabulary`` floats: for one 8k-token sequence
of a 152k-vocabulary model (Qwen) that is about 5 GB in float32, and scoring
them (temperature, log-softmax, entropy) makes several such tensors. The
trainer needs only one number per token (the target's logprob, and the
entropy). So the decoder runs once for the micro-batch's hidden states, and
the output projection, ``processed_logprobs`` and the gather run per chunk of
``chunk_tokens`` tokens. Each chunk runs under ``torch.utils.checkpoint``: its
logits are freed after the forward and recomputed, one chunk at a time, in the
backward. Peak memory then grows with the chunk, not with tokens x vocabulary;
the price is the projection computed twice.

Defines:

- ``HeadSplit``: the model cut into its decoder and its output projection.
- ``split_head``: that cut for a Hugging Face causal LM (peft-wrapped or not).
- ``check_split``: one short forward proving the cut gives the model's own logits.
- ``chunked_scores``: target logprobs and entropies of hidden states, chunk by chunk.

Liger-Kernel's fused linear cross-entropy does the same on GPUs, but it needs
Triton (no CPU) and fuses a fixed loss, while the trainer needs the target's
logprob under the sampler's processed distribution (temperature, top-k, top-p).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from core.errors import ConfigError
from tracerl_local.logits import processed_logprobs
from tracerl_local.losses import LossSettings


@dataclass(frozen=True)
class HeadSplit:
    """A causal LM as ``decoder`` (ids to hidden states) and ``head`` (hidden states to logits)."""

    decoder: torch.nn.Module
    """Called with ``input_ids``, ``attention_mask``, ``position_ids``; returns ``last_hidden_state``."""
    head: torch.nn.Module
    """The output projection (``lm_head``), LoRA-wrapped when LoRA targets it."""
    softcap: float = 0.0
    """``final_logit_softcapping`` (Gemma 2/3): logits become ``cap * tanh(logits / cap)``; 0: none."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits for ``hidden`` (any leading shape)."""
        out = self.head(hidden)
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Last hidden states ``(B, L, D)`` of a right-padded batch."""
        out = self.decoder(input_ids=ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def split_head(model: torch.nn.Module) -> HeadSplit:
    """Cut ``model`` (a transformers causal LM, possibly peft-wrapped) into decoder and head.

    Raises:
        ConfigError: the model does not expose ``get_decoder``/``get_output_embeddings``.
    """
    base: Any = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):  # peft injects its adapters into the base model's own modules
        base = get_base()
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module) or decoder is base:
        raise ConfigError(
            f"backend.train_logprob_chunk needs a causal LM with a separate decoder and output "
            f"projection; {type(base).__name__} has none. Set backend.train_logprob_chunk=0"
        )
    cap = getattr(getattr(base, "config", None), "final_logit_softcapping", None)
    return HeadSplit(decoder=decoder, head=head, softcap=float(cap or 0.0))


def check_split(model: torch.nn.Module, split: HeadSplit, forward: Callable[..., Any]) -> None:
    """Compare ``split``'s logits with the model's own on a 4-token input; raise when they differ.

    A model that post-processes its logits in a way ``HeadSplit`` does not know
    (a scale, a cap) would otherwise train on logprobs the sampler never served.

    Raises:
        ConfigError: the logits differ; names the setting that turns chunking off.
    """
    device = next(model.parameters()).device
    ids = torch.arange(4, device=device)[None, :]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        whole = forward(ids, mask, ids.clone()).logits.float()
        split_logits = split.logits(split.hidden(ids, mask, ids.clone())).float()
    scale = float(whole.abs().max()) or 1.0
    if whole.shape != split_logits.shape or float((whole - split_logits).abs().max()) > 1e-2 * scale:
        raise ConfigError(
            f"backend.train_logprob_chunk: {type(model).__name__}'s logits are not its output projection of "
            "its last hidden states (the model post-processes them); set backend.train_logprob_chunk=0"
        )


def _chunk_scores(
    split: HeadSplit, hidden: torch.Tensor, targets: torch.Tensor, settings: LossSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = hidden.shape[0]
    device = hidden.device
    lp = processed_logprobs(
        split.logits(hidden),
        torch.full((rows,), settings.temperature, device=device),
        torch.full((rows,), settings.top_k, dtype=torch.long, device=device),
        torch.full((rows,), settings.top_p, device=device),
    )
    picked = lp.gather(-1, targets[:, None]).squeeze(-1)
    # Truncated tokens sit at about -1e4: exp() is exactly 0 there, so they add nothing.
    with torch.set_grad_enabled(torch.is_grad_enabled() and bool(settings.entropy_coef)):
        entropy = -(lp.exp() * lp).sum(-1)
    return picked, entropy


def chunked_scores(
    split: HeadSplit,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    settings: LossSettings,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each target and entropy of each position's sampling distribution.

    Args:
        split: the model's decoder/head cut.
        hidden: ``(N, D)`` last hidden states, one row per scored token.
        targets: ``(N,)`` target token ids.
        settings: temperature, top-k, top-p and ``entropy_coef`` (the entropy
            carries gradient only with it).
        chunk_tokens: rows projected together (> 0).

    Returns:
        ``(N,)`` float32 logprobs (with gradient when ``hidden`` or the head has
        one) and ``(N,)`` float32 entropies.
    """
    picked, entropy = [], []
    recompute = torch.is_grad_enabled()
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if recompute:  # keep only h and t for backward; the chunk's logits are recomputed there
            lp, ent = checkpoint(_chunk_scores, split, h, t, settings, use_reentrant=False)
        else:
            lp, ent = _chunk_scores(split, h, t, settings)
        picked.append(lp)
        entropy.append(ent)
    return torch.cat(picked), torch.cat(entropy)
