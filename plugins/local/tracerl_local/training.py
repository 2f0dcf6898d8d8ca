"""Trainer-side logprobs and the loss over a list of datums (synchronous, torch).

``LocalBackend.forward_backward`` runs ``forward_backward_sync`` in a thread.
Datums are right-padded (positions 0..n-1 for real tokens, as the sampler's
left-padded ``cumsum(mask) - 1`` gives), scored with the same
``processed_logprobs`` the sampler uses, and processed in micro-batches whose
losses are each divided by the *whole call's* total weight before
``backward``, so the accumulated gradient is that of the token-level mean.

Memory (``TrainShape``): a micro-batch holds at most ``micro_batch`` datums and
``tokens_per_micro_batch`` padded tokens; with ``logprob_chunk`` the logits are
made ``logprob_chunk`` tokens at a time (``tracerl_local.chunked``). With
activation checkpointing on (``enable_checkpointing``) the decoder layers keep
only their inputs for the backward and run again there. With ``bf16_autocast``
the forward runs under ``torch.autocast`` in bf16 while the weights, their
gradients and the optimizer state keep the model's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from core.errors import ConfigError
from core.types import Datum, ForwardBackwardResult
from tracerl_local.chunked import chunked_scores, split_head
from tracerl_local.logits import processed_logprobs
from tracerl_local.losses import LossSettings, token_losses
from tracerl_local.model import model_forward


@dataclass(frozen=True)
class TrainShape:
    """How ``forward_backward_sync`` runs a call: the first three bound its memory and do not
    change the gradient; ``bf16_autocast`` changes the arithmetic."""

    micro_batch: int = 64
    """Most datums per forward/backward."""
    tokens_per_micro_batch: int = 0
    """Most padded tokens (datums x longest) per forward/backward; 0: no bound. A datum
    longer than this goes alone."""
    logprob_chunk: int = 0
    """Tokens whose logits exist at once (``tracerl_local.chunked``); 0: the whole micro-batch's."""
    bf16_autocast: bool = False
    """Run the forward under ``torch.autocast(dtype=torch.bfloat16)`` (matmuls in bf16)."""


def micro_batches(datums: Sequence[Datum], shape: TrainShape) -> list[range]:
    """Consecutive index ranges of ``datums``, each within ``shape``'s datum and token bounds."""
    out: list[range] = []
    start, width = 0, 0
    for i, d in enumerate(datums):
        n = len(d.model_input)
        rows = i - start + 1
        full = rows > max(1, shape.micro_batch)
        over = shape.tokens_per_micro_batch > 0 and rows * max(width, n) > shape.tokens_per_micro_batch
        if i > start and (full or over):
            out.append(range(start, i))
            start, width = i, 0
        width = max(width, n)
    out.append(range(start, len(datums)))
    return out


@contextmanager
def checkpointed_layers(model: torch.nn.Module) -> Iterator[None]:
    """Mark the layers transformers checkpoints as training, for the duration, and only them.

    transformers recomputes a checkpointed layer only when the layer is in
    training mode; ``model.train()`` would also switch on every dropout below
    it, which the sampler never applies. The layers' own flag alone is set
    (``LocalBackend`` refuses activation checkpointing for models configured
    with dropout), then restored.
    """
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    before = [m.training for m in layers]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m, was in zip(layers, before, strict=True):
            m.training = was


def check_datums(datums: Sequence[Datum], vocab: int, max_positions: int) -> None:
    """Raise ``ConfigError`` naming the first datum that the model cannot read."""
    if not datums:
        raise ConfigError("forward_backward got no datums; pass at least one")
    for i, d in enumerate(datums):
        if not d.model_input:
            raise ConfigError(f"datum {i} is empty; a datum needs at least one input token")
        if len(d.model_input) > max_positions:
            raise ConfigError(
                f"datum {i} has {len(d.model_input)} input tokens but the model's context is "
                f"{max_positions}; drop or truncate it"
            )
        for field_name, ids in (("model_input", d.model_input), ("target_tokens", d.target_tokens)):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ConfigError(
                    f"datum {i} {field_name} holds token ids {bad[:5]!r} outside the vocabulary [0, {vocab})"
                )
        if any(w < 0 or not math.isfinite(w) for w in d.weights):
            raise ConfigError(f"datum {i} has negative or non-finite weights; weights must be >= 0")


def trainer_logprobs(
    model: torch.nn.Module,
    datums: Sequence[Datum],
    settings: LossSettings,
    pad_id: int,
    cache_arg: str,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """``(B, L)`` logprobs of each datum's targets (with gradient); padding positions are 0."""
    return trainer_logprobs_and_entropy(model, datums, settings, pad_id, cache_arg, chunk_tokens)[0]


def trainer_logprobs_and_entropy(
    model: torch.nn.Module,
    datums: Sequence[Datum],
    settings: LossSettings,
    pad_id: int,
    cache_arg: str,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``trainer_logprobs`` and the ``(B, L)`` entropy of each position's sampling
    distribution (padding positions are 0). The entropy carries gradient only with
    ``settings.entropy_coef``: as a plain metric it would keep two vocabulary-sized
    tensors per token alive in the autograd graph until ``backward``.

    ``chunk_tokens`` > 0 scores the real (unpadded) tokens that many at a time
    (``tracerl_local.chunked``); 0 makes the whole batch's logits at once."""
    device = next(model.parameters()).device
    n, width = len(datums), max(len(d.model_input) for d in datums)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    targets = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    for i, d in enumerate(datums):
        k = len(d.model_input)
        ids[i, :k] = torch.tensor(d.model_input)
        targets[i, :k] = torch.tensor(d.target_tokens)
        attn[i, :k] = 1
    ids, targets, attn = ids.to(device), targets.to(device), attn.to(device)
    positions = torch.arange(width, device=device).expand(n, width)
    if chunk_tokens > 0:
        split = split_head(model)
        real = attn.bool()
        hidden = split.hidden(ids, attn, positions)
        picked_flat, entropy_flat = chunked_scores(split, hidden[real], targets[real], settings, chunk_tokens)
        zeros = torch.zeros((n, width), dtype=torch.float32, device=device)
        return zeros.masked_scatter(real, picked_flat), zeros.masked_scatter(real, entropy_flat)
    logits = model_forward(model, ids, attn, positions, cache_arg=cache_arg).logits
    flat = logits.reshape(n * width, -1)
    rows = flat.shape[0]
    lp = processed_logprobs(
        flat,
        torch.full((rows,), settings.temperature, device=device),
        torch.full((rows,), settings.top_k, dtype=torch.long, device=device),
        torch.full((rows,), settings.top_p, device=device),
    )
    picked = lp.gather(-1, targets.reshape(-1, 1)).reshape(n, width)
    # Truncated tokens sit at about -1e4: exp() is exactly 0 there, so they add nothing.
    with torch.set_grad_enabled(torch.is_grad_enabled() and bool(settings.entropy_coef)):
        entropy = -(lp.exp() * lp).sum(-1).reshape(n, width)
    return picked * attn, entropy * attn


def forward_backward_sync(
    model: torch.nn.Module,
    datums: Sequence[Datum],
    settings: LossSettings,
    *,
    pad_id: int,
    cache_arg: str,
    shape: TrainShape,
) -> ForwardBackwardResult:
    """Accumulate the gradient of the token-level mean loss over ``datums``.

    Returns metrics ``loss``, ``num_tokens`` (total weight), ``logprob_diff/max``
    and ``logprob_diff/mean`` (|sampler - trainer| over weighted tokens),
    ``clip_fraction``, ``ratio/mean``, ``tis_truncated_fraction`` (with ``tis_cap``) and ``entropy`` (weighted; nats), and per-datum
    trainer logprobs. ``settings.entropy_coef`` adds ``-entropy_coef * entropy`` to
    each token's loss. ``shape`` bounds the memory of each forward/backward.
    """
    device = next(model.parameters()).device
    total_weight = sum(sum(d.weights) for d in datums)
    norm = total_weight if total_weight > 0 else 1.0
    loss_sum = diff_max = diff_sum = clip_sum = ratio_sum = entropy_sum = truncated_sum = 0.0
    per_datum: list[list[float]] = []
    for indices in micro_batches(datums, shape):
        chunk = datums[indices.start : indices.stop]
        width = max(len(d.model_input) for d in chunk)

        def padded(values: list[list[float]], width: int = width) -> torch.Tensor:
            out = torch.zeros((len(values), width), dtype=torch.float32)
            for i, v in enumerate(values):
                out[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
            return out.to(device)

        weights = padded([list(d.weights) for d in chunk])
        old = padded([list(d.logprobs) for d in chunk])
        adv = padded([list(d.advantages) for d in chunk])
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=shape.bf16_autocast)
        with checkpointed_layers(model), autocast:
            logp, entropy = trainer_logprobs_and_entropy(
                model, chunk, settings, pad_id, cache_arg, shape.logprob_chunk
            )
        per_token, clipped = token_losses(settings, logp, old, adv)
        if settings.entropy_coef:
            per_token = per_token - settings.entropy_coef * entropy
        loss = (per_token * weights).sum() / norm
        if total_weight > 0:
            loss.backward()
        with torch.no_grad():
            loss_sum += float(loss)
            trained = weights > 0
            diff = (logp.detach() - old).abs()[trained]
            if diff.numel():
                diff_max = max(diff_max, float(diff.max()))
                diff_sum += float((diff * weights[trained]).sum())
            clip_sum += float((clipped * weights).sum())
            ratio = torch.exp(logp.detach() - old)
            ratio_sum += float((ratio * weights).sum())
            if settings.tis_cap:
                truncated_sum += float(((ratio > settings.tis_cap).to(ratio.dtype) * weights).sum())
            entropy_sum += float((entropy.detach() * weights).sum())
        for i, d in enumerate(chunk):
            per_datum.append(logp[i, : len(d.model_input)].detach().float().cpu().tolist())
    metrics = {
        "loss": loss_sum,
        "num_tokens": float(total_weight),
        "logprob_diff/max": diff_max,
        "logprob_diff/mean": diff_sum / norm,
        "clip_fraction": clip_sum / norm,
        "ratio/mean": ratio_sum / norm,
        "entropy": entropy_sum / norm,
    }
    if settings.tis_cap:
        metrics["tis_truncated_fraction"] = truncated_sum / norm
    return ForwardBackwardResult(metrics=metrics, logprobs=per_datum)
