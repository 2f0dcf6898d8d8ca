"""Batched, KV-cached generation for a list of requests with per-request settings.

``generate_batch`` is synchronous (the sampler runs it in a worker thread):
it left-pads the prompts, prefills them in one forward pass with explicit
``position_ids`` (``cumsum(attention_mask) - 1``, so RoPE positions match an
unpadded forward and the trainer's), then decodes one token per row per
forward pass, reusing the KV cache. A row finishes on any of the model's
end-of-turn ids (``eos_ids``: EOS, the generation config's ``eos_token_id``
list, the chat template's end-of-turn token), a stop token id of its own, a
stop string, ``max_tokens`` or the model's context length; its result is
handed to ``on_done`` at once, so short replies do not wait for long ones.
When ``interrupted()`` turns true (a weight update), decoding stops after the
current step and every unfinished row is handed over with the tokens it has
and ``FinishReason.ABORT``, for the caller to continue on the new weights.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.types import FinishReason, SamplingParams
from tracerl_local.logits import processed_logprobs, sample_tokens
from tracerl_local.model import model_forward, output_cache


@dataclass
class GenRequest:
    """One prompt to continue, with its settings."""

    prompt: Sequence[int]
    params: SamplingParams
    generated: Sequence[int] = ()
    """Tokens an interrupted earlier part of this generation produced (the end of
    ``prompt``): stop strings are looked for across them and the new tokens."""
    rng: torch.Generator | None = None
    """The row's own generator (from ``params.seed``), set on first use and kept, so a
    continued generation draws on where it stopped instead of restarting its seed."""


@dataclass
class GenOutput:
    """What one row produced."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.LENGTH


def _hit_stop_string(tokenizer: Any, token_ids: list[int], stops: tuple[str, ...]) -> bool:
    # Generation stops at the first stop string, so any occurrence in the text
    # was completed by the newest token.
    text = tokenizer.decode(token_ids, skip_special_tokens=False)
    return any(s and s in text for s in stops)


@torch.no_grad()
def generate_batch(
    model: torch.nn.Module,
    requests: Sequence[GenRequest],
    *,
    tokenizer: Any,
    max_positions: int,
    cache_arg: str,
    rng: torch.Generator,
    on_done: Callable[[int, GenOutput], None],
    on_forward: Callable[[], None] = lambda: None,
    eos_ids: Collection[int] | None = None,
    interrupted: Callable[[], bool] = lambda: False,
) -> int:
    """Continue every request; call ``on_done(index, output)`` as each row finishes.

    Args:
        model: The causal LM (eval mode, any device).
        requests: Prompts (non-empty, shorter than ``max_positions``) and settings.
        tokenizer: Decodes generated ids for stop strings; gives EOS and pad ids.
        max_positions: Context length; rows stop with ``length`` when it is full.
        cache_arg: Name of the forward's KV-cache argument (``model.cache_argument``).
        rng: Generator for rows without a seed of their own.
        on_done: Called from this thread once per row.
        on_forward: Called before each forward pass (counters that are
            complete by the time the last ``on_done`` fires).
        eos_ids: Ids that end every row's turn (``core.tokenizer.end_of_turn_ids``);
            None means the tokenizer's EOS alone.
        interrupted: Polled after each decode step; once true, every unfinished row
            goes to ``on_done`` with its tokens so far and ``FinishReason.ABORT``.

    Returns:
        Number of forward passes run (1 prefill + decode steps).
    """
    device = next(model.parameters()).device
    n = len(requests)
    ends = {int(i) for i in eos_ids} if eos_ids is not None else {int(tokenizer.eos_token_id)}
    pad_id = int(tokenizer.pad_token_id)
    lengths = [len(r.prompt) for r in requests]
    width = max(lengths)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(requests):
        ids[i, width - lengths[i] :] = torch.tensor(list(r.prompt), dtype=torch.long)
        attn[i, width - lengths[i] :] = 1
    ids, attn = ids.to(device), attn.to(device)
    positions = (attn.cumsum(-1) - 1).clamp_(min=0)

    params = [r.params for r in requests]
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    greedy = temperature <= 0
    budgets = [
        min(p.max_tokens, max_positions - length) for p, length in zip(params, lengths, strict=True)
    ]
    stop_ids = [ends.union(p.stop_token_ids) for p in params]
    for r in requests:
        if r.rng is None and r.params.seed is not None:
            r.rng = torch.Generator().manual_seed(r.params.seed)
    row_rngs = [r.rng for r in requests]
    outputs = [GenOutput() for _ in requests]
    active = [True] * n
    for i, budget in enumerate(budgets):
        if budget <= 0:  # the prompt already fills the context
            active[i] = False
            on_done(i, outputs[i])

    on_forward()
    out = model_forward(
        model, ids, attn, positions, cache_arg=cache_arg, use_cache=True, logits_to_keep=1
    )
    forwards = 1
    cache = output_cache(out)
    logits = out.logits[:, -1, :]
    last_pos = positions[:, -1:]
    while any(active):
        logprobs = processed_logprobs(logits, temperature, top_k, top_p)
        uniforms = torch.rand(n, generator=rng)
        for i, g in enumerate(row_rngs):
            if g is not None and active[i]:
                uniforms[i] = torch.rand((), generator=g)
        tokens = sample_tokens(logprobs, logits, greedy, uniforms)
        # Greedy rows report the temperature-1 logprob (processed_logprobs uses T=1 for them).
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        tokens_list, chosen_list = tokens.tolist(), chosen.tolist()
        for i in range(n):
            if not active[i]:
                continue
            o = outputs[i]
            o.token_ids.append(tokens_list[i])
            o.logprobs.append(chosen_list[i])
            if tokens_list[i] in stop_ids[i] or (
                params[i].stop
                and _hit_stop_string(
                    tokenizer, [*requests[i].generated, *o.token_ids], params[i].stop
                )
            ):
                o.finish_reason = FinishReason.STOP
            elif len(o.token_ids) >= budgets[i]:
                o.finish_reason = FinishReason.LENGTH
            else:
                continue
            active[i] = False
            on_done(i, o)
        if not any(active):
            break
        if interrupted():
            for i in range(n):
                if active[i]:
                    active[i] = False
                    outputs[i].finish_reason = FinishReason.ABORT
                    on_done(i, outputs[i])
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=-1)
        # Finished rows keep decoding (their outputs are ignored); clamp so they never
        # run past the context length while longer rows continue.
        last_pos = (last_pos + 1).clamp_(max=max_positions - 1)
        on_forward()
        out = model_forward(
            model, tokens[:, None], attn, last_pos, cache=cache, cache_arg=cache_arg, use_cache=True
        )
        forwards += 1
        cache = output_cache(out)
        logits = out.logits[:, -1, :]
    return forwards
