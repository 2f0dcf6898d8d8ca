"""Per-token policy losses, Tinker's names, on plain tensors.

Every function maps trainer logprobs ``logp`` (with gradient), sampler
logprobs ``old`` and advantages ``adv`` (all the same shape) to a per-token
loss. ``LocalBackend.forward_backward`` multiplies by the datum weights,
sums over every token of the batch and divides by the batch's total weight
(token-level mean), so long and short replies weigh the same per token.

- ``cross_entropy``:       -logp                  (advantages and ``old`` unused)
- ``importance_sampling``: -r * adv,              r = exp(logp - old)
- ``ppo``:                 -min(r * adv, clip(r, 1 - clip_low, 1 + clip_high) * adv), and for
  ``adv < 0`` dual-clipped: -max(that, dual_clip * adv) (``dual_clip`` default 3; 0: off),
  so a negative-advantage token whose ratio ran away above ``dual_clip`` gets no gradient
- ``cispo``:               -sg(clip(r, 1 - clip_low, 1 + clip_high)) * adv * logp
  (sg: stop-gradient; by default only the upper side is clipped, as in MiniMax-M1)

With ``tis_cap`` (``algorithm.tis_cap``, > 0) a token's importance weight in the
gradient is at most ``tis_cap``, so a token the sampler found much less likely
than the trainer does (stale weights, sampler/trainer numerics) cannot dominate
the step: ``importance_sampling`` and ``ppo`` are multiplied per token by
``sg(min(1, tis_cap / r))`` (their weight is ``r``, so it becomes ``min(r, tis_cap)``);
``cispo``'s weight is already the stop-gradient clipped ratio, so it is capped,
not scaled: ``sg(min(clip(r, ...), tis_cap))`` (ratio 10, clip_high 0.2, cap 2:
weight 1.2, not 1.2 * 2 / 10).

Every loss also takes ``entropy_coef`` (default 0): ``entropy_coef * H`` is
subtracted from each trained token's loss, H being the entropy of the
distribution the token was sampled from. It keeps a group's samples from
all becoming identical; such a group scores the same reward for every
member, has no advantage, and would never change again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from core.algo.losses import CLIPPED_LOSSES, parse_loss_spec
from core.errors import ConfigError

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
"""Losses the local backend computes."""


@dataclass(frozen=True)
class LossSettings:
    """A validated ``loss_config``: clip range and the sampling settings to mirror."""

    name: str
    clip_low: float = 0.2
    clip_high: float = 0.2
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    entropy_coef: float = 0.0
    tis_cap: float = 0.0
    dual_clip: float = 0.0


def parse_loss_config(loss_fn: str, loss_config: Mapping[str, float] | None) -> LossSettings:
    """Check ``loss_fn`` and ``loss_config``; fill the defaults.

    Raises:
        ConfigError: unknown loss, unknown key, or a value out of range.
    """
    if loss_fn not in LOSSES:
        raise ConfigError(f"unknown loss_fn {loss_fn!r}; the local backend knows {', '.join(LOSSES)}")
    given = dict(loss_config or {})
    clips = sorted(str(k) for k in given if str(k).startswith("clip_"))
    if clips and loss_fn not in CLIPPED_LOSSES:
        raise ConfigError(f"loss_config keys {clips!r} are not understood by loss {loss_fn!r}: it clips nothing")
    # Keys, numbers, clip bounds (epsilons or thresholds, per-loss defaults) as every backend checks them.
    spec = parse_loss_spec(loss_fn, given, backend="local", hint="See docs/backends/local.md.")
    settings = LossSettings(
        name=loss_fn,
        clip_low=spec.clip_low,
        clip_high=spec.clip_high,
        temperature=spec.temperature,
        top_k=int(spec.top_k),
        top_p=spec.top_p,
        entropy_coef=spec.entropy_coef,
        tis_cap=spec.tis_cap,
        dual_clip=spec.dual_clip,
    )
    if settings.temperature < 0:
        raise ConfigError(f"loss_config temperature must be >= 0, got {settings.temperature!r}")
    if not 0 < settings.top_p <= 1:
        raise ConfigError(f"loss_config top_p must be in (0, 1], got {settings.top_p!r}")
    return settings


def token_losses(
    settings: LossSettings, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and a 0/1 tensor marking tokens whose ratio was clipped.

    The clipped mask counts a token for ``ppo`` when the clipped branch was
    the one taken (its gradient is zero), and for ``cispo`` when the weight
    was clipped.
    """
    name = settings.name
    if name == "cross_entropy":
        return -logp, torch.zeros_like(logp)
    ratio = torch.exp(logp - old)
    per_token, clipped = _ratio_losses(settings, logp, ratio, adv)
    if settings.tis_cap and name != "cispo":  # cispo caps its weight in _ratio_losses
        per_token = per_token * truncation(ratio, settings.tis_cap)
    return per_token, clipped


def truncation(ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """``sg(min(1, cap / ratio))``: scales a token's loss so its importance weight is at most ``cap``."""
    return (cap / ratio.detach()).clamp(max=1.0)


def _ratio_losses(
    settings: LossSettings, logp: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    name = settings.name
    if name == "importance_sampling":
        return -ratio * adv, torch.zeros_like(logp)
    low, high = 1.0 - settings.clip_low, 1.0 + settings.clip_high
    clipped_ratio = ratio.clamp(min=low, max=high)
    if name == "ppo":
        unclipped, clipped = ratio * adv, clipped_ratio * adv
        took_clip = clipped < unclipped
        objective = torch.minimum(unclipped, clipped)
        if settings.dual_clip:
            floor = settings.dual_clip * adv
            dual = (adv < 0) & (objective < floor)
            objective = torch.where(dual, floor, objective)
            took_clip = took_clip | dual
        return -objective, took_clip.to(logp.dtype)
    # cispo: the weight is sg(clip(r)), further capped (not scaled) by tis_cap
    weight = clipped_ratio.clamp(max=settings.tis_cap) if settings.tis_cap else clipped_ratio
    was_clipped = (weight != ratio).to(logp.dtype)
    return -weight.detach() * adv * logp, was_clipped
