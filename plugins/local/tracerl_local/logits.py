"""The one place that turns logits into the distribution tokens are drawn from.

The sampler and the trainer both call ``processed_logprobs``, so the logprob
a sampled token came back with and the logprob the trainer recomputes for it
come from the same arithmetic (pitfall: a temperature or top-k/top-p mismatch
makes PPO ratios drift from 1 and silently stops learning).

Order, as in vLLM and transformers: divide by the temperature, keep the
``top_k`` largest, keep the smallest set whose mass reaches ``top_p``, then
renormalise. A temperature of 0 means greedy: the token is the argmax and
its logprob is reported under the untruncated temperature-1 distribution.
"""

from __future__ import annotations

import torch

MASKED_LOGIT = -1.0e4
"""Logit given to truncated tokens after the row max is subtracted: exp() of it
is exactly 0 in float32, yet a trainer target that falls outside the kept set
still gets a finite logprob (about -1e4), so sums and gradients stay finite."""


def processed_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Log-probabilities of the distribution actually sampled, one row per position.

    Args:
        logits: ``(N, V)`` raw logits (any float dtype; computed in float32).
        temperature: ``(N,)``; rows with 0 are greedy and use temperature 1.
        top_k: ``(N,)`` integers; -1 (or >= V) keeps every token.
        top_p: ``(N,)`` in (0, 1]; 1 keeps every token.

    Returns:
        ``(N, V)`` float32 log-probabilities; truncated tokens sit near -1e4.
    """
    x = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(x)
    x = x / temp[:, None]
    x = x - x.max(dim=-1, keepdim=True).values
    vocab = x.shape[-1]
    k = torch.where((top_k < 1) | (top_k >= vocab) | greedy, vocab, top_k)
    p = torch.where(greedy, torch.ones_like(top_p), top_p).to(x)
    if bool((k < vocab).any()) or bool((p < 1).any()):
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        ranks = torch.arange(vocab, device=x.device)[None, :]
        keep_sorted = ranks < k[:, None].to(x.device)
        kept = sorted_x.masked_fill(~keep_sorted, MASKED_LOGIT)
        probs = torch.softmax(kept, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        keep_sorted &= mass_before < p[:, None]
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        x = x.masked_fill(~keep, MASKED_LOGIT)
    return torch.log_softmax(x, dim=-1)


def sample_tokens(
    logprobs: torch.Tensor,
    raw_logits: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Draw one token per row by inverting the CDF with one uniform per row.

    One uniform per row (rather than ``torch.multinomial`` on a shared
    generator) is what lets each request carry its own seed inside a batch.

    Args:
        logprobs: ``(N, V)`` from ``processed_logprobs``.
        raw_logits: ``(N, V)`` raw logits, for the argmax of greedy rows.
        greedy: ``(N,)`` bool.
        uniforms: ``(N,)`` in [0, 1).

    Returns:
        ``(N,)`` token ids.
    """
    cdf = torch.cumsum(logprobs.exp(), dim=-1)
    u = (uniforms.to(cdf) * cdf[:, -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
    return torch.where(greedy, raw_logits.argmax(dim=-1), drawn)
