"""Per-token policy losses, Tinker's names, on plain tensors.

Every function maps trainer logprobs ``logp`` (with gradient), sampler
logprobs ``old`` and advantages ``adv`` (all the same shape) to a per-token
loss. ``LocalBackend.forward_backward`` multiplies by the datum weights,
sums over every token of the batch and divides by the batch's total weight
(token-level mean), so long and short replies weigh the same per token.

- ``cross_entropy``:       -logp                  (advantages and ``old`` unused)
- ``importance_sampling``: -r * adv,              r = exp(logp - old)
- ``ppo``:                 -min(r * adv, clip(r, 1 - clip_low, 1 + clip_high) * adv)
- ``cispo``:               -sg(clip(r, 1 - clip_low, 1 + clip_high)) * adv * logp
  (sg: stop-gradient; by default only the upper side is clipped, as in MiniMax-M1)

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

from core.errors import ConfigError

_SAMPLING_KEYS = ("temperature", "top_k", "top_p")
_COMMON_KEYS = (*_SAMPLING_KEYS, "entropy_coef")
_CLIP_DEFAULTS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low": 0.2, "clip_high": 0.2},
    "cispo": {"clip_low": 1.0, "clip_high": 0.2},
}


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


def parse_loss_config(loss_fn: str, loss_config: Mapping[str, float] | None) -> LossSettings:
    """Check ``loss_fn`` and ``loss_config``; fill the defaults.

    Raises:
        ConfigError: unknown loss, unknown key, or a value out of range.
    """
    if loss_fn not in _CLIP_DEFAULTS:
        raise ConfigError(
            f"unknown loss_fn {loss_fn!r}; the local backend knows {', '.join(_CLIP_DEFAULTS)}"
        )
    given = dict(loss_config or {})
    allowed = set(_CLIP_DEFAULTS[loss_fn]) | set(_COMMON_KEYS)
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ConfigError(
            f"loss_config keys {unknown!r} are not understood by loss {loss_fn!r}; "
            f"allowed keys: {sorted(allowed)}"
        )
    values = {**_CLIP_DEFAULTS[loss_fn], **given}
    settings = LossSettings(
        name=loss_fn,
        clip_low=float(values.get("clip_low", 0.2)),
        clip_high=float(values.get("clip_high", 0.2)),
        temperature=float(values.get("temperature", 1.0)),
        top_k=int(values.get("top_k", -1)),
        top_p=float(values.get("top_p", 1.0)),
        entropy_coef=float(values.get("entropy_coef", 0.0)),
    )
    if settings.clip_low < 0 or settings.clip_high < 0:
        raise ConfigError(
            f"clip_low and clip_high must be >= 0 (they are distances from ratio 1), "
            f"got {settings.clip_low!r} and {settings.clip_high!r}"
        )
    if settings.temperature < 0:
        raise ConfigError(f"loss_config temperature must be >= 0, got {settings.temperature!r}")
    if settings.entropy_coef < 0:
        raise ConfigError(
            f"loss_config entropy_coef must be >= 0 (a bonus on entropy), got {settings.entropy_coef!r}"
        )
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
    if name == "importance_sampling":
        return -ratio * adv, torch.zeros_like(logp)
    low, high = 1.0 - settings.clip_low, 1.0 + settings.clip_high
    clipped_ratio = ratio.clamp(min=low, max=high)
    if name == "ppo":
        unclipped, clipped = ratio * adv, clipped_ratio * adv
        took_clip = (clipped < unclipped).to(logp.dtype)
        return -torch.minimum(unclipped, clipped), took_clip
    # cispo
    was_clipped = (clipped_ratio != ratio).to(logp.dtype)
    return -clipped_ratio.detach() * adv * logp, was_clipped
