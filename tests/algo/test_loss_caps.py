"""``algorithm.tis_cap`` and ppo's dual-clip compose with every loss (issue #28).

One token, ratio ``r = pi_trainer / pi_sampler = 10`` (a stale or mismatched token),
cap 2: its weight in the gradient of ``logp`` is ``-d loss / d logp / adv``.
"""

from __future__ import annotations

import math

import pytest
import torch
from tracerl_local.losses import parse_loss_config, token_losses

from core.algo.losses import remote_loss
from core.errors import ConfigError

RATIO, CAP = 10.0, 2.0


def weight(loss: str, adv: float, **cfg: float) -> float:
    """The token's gradient weight: ``d loss / d logp = -weight * adv``."""
    logp = torch.tensor([math.log(RATIO)], requires_grad=True)
    per_token, _ = token_losses(parse_loss_config(loss, cfg), logp, torch.tensor([0.0]), torch.tensor([adv]))
    per_token.sum().backward()
    assert logp.grad is not None
    return float(-logp.grad[0]) / adv


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_importance_sampling_weight_is_min_of_ratio_and_cap(adv: float) -> None:
    assert weight("importance_sampling", adv) == pytest.approx(RATIO)
    assert weight("importance_sampling", adv, tis_cap=CAP) == pytest.approx(CAP)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_cispo_caps_its_clipped_weight_instead_of_shrinking_it(adv: float) -> None:
    # The weight is sg(clip(r, 0, 1.2)) = 1.2; the cap 2 is above it, so it stays 1.2
    # (the old scaling gave 1.2 * 2 / 10 = 0.24).
    assert weight("cispo", adv) == pytest.approx(1.2)
    assert weight("cispo", adv, tis_cap=CAP) == pytest.approx(1.2)
    # A clip range wider than the cap: the cap is the bound, min(clip(r), cap) = 2.
    assert weight("cispo", adv, clip_high=3.0) == pytest.approx(4.0)
    assert weight("cispo", adv, clip_high=3.0, tis_cap=CAP) == pytest.approx(CAP)
    # A cap above the clipped weight never changes it.
    assert weight("cispo", adv, clip_high=3.0, tis_cap=RATIO) == pytest.approx(4.0)


def test_ppo_positive_advantage_past_the_clip_gets_no_gradient_with_or_without_cap() -> None:
    assert weight("ppo", 1.0) == pytest.approx(0.0)
    assert weight("ppo", 1.0, tis_cap=CAP) == pytest.approx(0.0)


def test_ppo_negative_advantage_with_a_runaway_ratio_is_bounded_without_tis_cap() -> None:
    # Unclipped branch (min(-10, -1.2) = -10): plain ppo would weigh it r = 10.
    assert weight("ppo", -1.0, dual_clip=0.0) == pytest.approx(RATIO)
    # tis_cap truncates it to the cap ...
    assert weight("ppo", -1.0, tis_cap=CAP, dual_clip=0.0) == pytest.approx(CAP)
    # ... and with tis_cap=0 the default dual-clip (3 < 10) leaves it no gradient.
    assert weight("ppo", -1.0) == pytest.approx(0.0)
    assert weight("ppo", -1.0, tis_cap=CAP) == pytest.approx(0.0)
    # Below the dual-clip constant the unclipped branch keeps its (capped) weight.
    assert weight("ppo", -1.0, dual_clip=20.0) == pytest.approx(RATIO)
    assert weight("ppo", -1.0, dual_clip=20.0, tis_cap=CAP) == pytest.approx(CAP)


def test_ppo_dual_clip_counts_as_clipped() -> None:
    logp = torch.tensor([math.log(RATIO), 0.0])
    _, clipped = token_losses(parse_loss_config("ppo", {}), logp, torch.zeros(2), torch.tensor([-1.0, -1.0]))
    assert clipped.tolist() == [1.0, 0.0]


def test_cross_entropy_has_no_ratio_to_cap() -> None:
    with pytest.raises(ConfigError, match="has no such ratio"):
        parse_loss_config("cross_entropy", {"tis_cap": CAP})


def test_dual_clip_is_checked_and_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ConfigError, match="dual_clip=1.0 must be 0 \\(off\\) or a finite number > 1"):
        parse_loss_config("ppo", {"dual_clip": 1.0})
    with pytest.raises(ConfigError, match="loss 'cispo' has none"):
        parse_loss_config("cispo", {"dual_clip": 3.0})
    with pytest.raises(ConfigError, match="cannot dual-clip"):
        remote_loss("ppo", {"dual_clip": 3.0}, backend="tinker", forwards_temperature=False, docs="d")
    # Not given: the remote ppo loss is what it always was (no dual-clip setting sent).
    assert remote_loss("ppo", {}, backend="tinker", forwards_temperature=False, docs="d").config == {
        "clip_low_threshold": 0.8,
        "clip_high_threshold": 1.2,
    }
