"""Each loss against values computed by hand on small tensors, and loss_config checks."""

from __future__ import annotations

import math

import pytest
import torch
from tracerl_local.losses import parse_loss_config, token_losses

from core.errors import ConfigError

LOGP = [-1.0, -0.5, -2.0]
OLD = [-1.2, -0.5, -1.0]
ADV = [1.0, -2.0, 0.5]


def _run(name: str, **cfg: float) -> tuple[list[float], list[float], list[float]]:
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, clipped = token_losses(
        parse_loss_config(name, cfg), logp, torch.tensor(OLD), torch.tensor(ADV)
    )
    loss.sum().backward()
    assert logp.grad is not None
    return loss.tolist(), clipped.tolist(), logp.grad.tolist()


def test_cross_entropy() -> None:
    loss, _, grad = _run("cross_entropy")
    assert loss == pytest.approx([1.0, 0.5, 2.0])
    assert grad == pytest.approx([-1.0, -1.0, -1.0])


def test_importance_sampling() -> None:
    loss, _, grad = _run("importance_sampling")
    r = [math.exp(a - b) for a, b in zip(LOGP, OLD, strict=True)]  # e^0.2, 1, e^-1
    assert loss == pytest.approx([-r[0] * 1.0, -r[1] * -2.0, -r[2] * 0.5])
    assert grad == pytest.approx([-r[0] * 1.0, 2.0, -r[2] * 0.5])  # d(-r*A)/dlogp = -r*A


def test_ppo_clips_per_side() -> None:
    loss, clipped, grad = _run("ppo", clip_low=0.1, clip_high=0.1)
    r0, r2 = math.exp(0.2), math.exp(-1.0)
    # token 0: r=1.221 > 1.1, A>0 -> clipped branch 1.1*1, no gradient
    # token 1: r=1, unclipped, -(1*-2) = 2
    # token 2: r=0.368 < 0.9, A>0 -> min(0.368*0.5, 0.9*0.5) = unclipped branch
    assert loss == pytest.approx([-1.1, 2.0, -r2 * 0.5])
    assert clipped == [1.0, 0.0, 0.0]
    assert grad == pytest.approx([0.0, 2.0, -r2 * 0.5])
    assert r0 > 1.1


def test_cispo_uses_clipped_detached_weight() -> None:
    loss, clipped, grad = _run("cispo", clip_high=0.1)
    r2 = math.exp(-1.0)
    # default clip_low=1.0: the lower side is not clipped (ratios are >= 0)
    w = [1.1, 1.0, r2]
    assert loss == pytest.approx([-w[i] * ADV[i] * LOGP[i] for i in range(3)])
    assert clipped == [1.0, 0.0, 0.0]
    assert grad == pytest.approx([-w[i] * ADV[i] for i in range(3)])


def test_loss_config_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="unknown loss_fn 'dpo'"):
        parse_loss_config("dpo", None)
    with pytest.raises(ConfigError, match="clip_lo"):
        parse_loss_config("ppo", {"clip_lo": 0.2})
    with pytest.raises(ConfigError, match="clip_low"):
        parse_loss_config("cross_entropy", {"clip_low": 0.2})
    with pytest.raises(ConfigError, match=">= 0"):
        parse_loss_config("ppo", {"clip_low": -0.1})
    assert parse_loss_config("ppo", {"temperature": 0.7}).temperature == 0.7


def test_clip_bounds_may_be_given_as_ratio_thresholds_as_on_every_backend() -> None:
    settings = parse_loss_config("ppo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.28})
    assert (settings.clip_low, settings.clip_high) == pytest.approx((0.3, 0.28))
    with pytest.raises(ConfigError, match="both clip_low and clip_low_threshold"):
        parse_loss_config("ppo", {"clip_low": 0.2, "clip_low_threshold": 0.8})
    assert parse_loss_config("cispo", {}).clip_low == 1.0  # one-sided by default


def test_tis_cap_truncates_the_importance_weight_in_the_gradient() -> None:
    """Token 0: r = e^1.5 = 4.48 > cap 2, so its gradient weight is 2 instead of 4.48;
    token 1 (r = 1) and token 2 (r = e^-1) are below the cap and untouched."""
    logp_values, old_values, adv_values = [-0.5, -0.5, -2.0], [-2.0, -0.5, -1.0], [1.0, -2.0, 0.5]

    def grads(name: str, **cfg: float) -> list[float]:
        logp = torch.tensor(logp_values, requires_grad=True)
        loss, _ = token_losses(
            parse_loss_config(name, cfg), logp, torch.tensor(old_values), torch.tensor(adv_values)
        )
        loss.sum().backward()
        assert logp.grad is not None
        return logp.grad.tolist()

    r = [math.exp(a - b) for a, b in zip(logp_values, old_values, strict=True)]
    assert r[0] > 4
    plain = grads("importance_sampling")
    assert plain == pytest.approx([-r[i] * adv_values[i] for i in range(3)])
    capped = grads("importance_sampling", tis_cap=2.0)
    assert capped == pytest.approx([-2.0 * adv_values[0], -r[1] * adv_values[1], -r[2] * adv_values[2]])
    # PPO with a negative advantage on a token whose ratio ran away: the unclipped branch
    # is taken (min of -4.48 and -1.2), so without a cap its weight is the full ratio.
    # With dual-clip off (its default 3 < 4.48 gives that token no gradient at all).
    adv_values[0] = -1.0
    assert grads("ppo", dual_clip=0.0)[0] == pytest.approx(r[0])
    assert grads("ppo")[0] == pytest.approx(0.0)
    assert grads("ppo", tis_cap=2.0, dual_clip=0.0)[0] == pytest.approx(2.0)
    # A cap above every ratio changes nothing.
    assert grads("ppo", tis_cap=10.0) == pytest.approx(grads("ppo"))


def test_tis_cap_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"tis_cap=0.5 must be 0 \(off\) or a finite number >= 1"):
        parse_loss_config("ppo", {"tis_cap": 0.5})
    with pytest.raises(ConfigError, match="loss 'cross_entropy' has no such ratio"):
        parse_loss_config("cross_entropy", {"tis_cap": 2.0})
