"""One reward value must not crash a run (#15.11): parsing and group maths."""

from __future__ import annotations

import math

import pytest

from core.algo import RolloutScore, compute_group_advantages
from core.runtime._results import extract_reward, result_from_output
from core.types import RolloutStatus


@pytest.mark.parametrize(
    "value", [10**400, -(10**309), [0.5, 10**400], 10**5000], ids=["1e400", "-1e309", "list", "1e5000"]
)
def test_integers_too_large_for_a_float_are_invalid_rewards(value: object) -> None:
    status, reward, error = extract_reward({"reward": value})
    assert status is RolloutStatus.INVALID_REWARD and reward is None
    assert "fits a float" in (error or "") and "bits" in (error or "")


def test_a_huge_integer_metric_is_dropped_not_raised() -> None:
    result = result_from_output("r", {"reward": 1, "metrics": {"big": 10**400, "ok": 2}}, 0.1)
    assert result.status is RolloutStatus.OK and result.metrics == {"ok": 2.0}


def test_large_integer_rewards_that_fit_still_count() -> None:
    assert extract_reward({"reward": 10**300}) == (RolloutStatus.OK, 1e300, None)


def _scores(rewards: list[float]) -> list[RolloutScore]:
    return [RolloutScore(f"r{i}", "g", r) for i, r in enumerate(rewards)]


@pytest.mark.parametrize("big", [1e200, 1.7e308])
def test_group_maths_do_not_overflow_on_huge_finite_rewards(big: float) -> None:
    stats = compute_group_advantages(_scores([big, 0.0, -big]))
    adv = [stats.advantages[f"r{i}"] for i in range(3)]
    assert all(math.isfinite(a) for a in adv)
    # same advantages as the rewards scaled down: the normalised advantage is scale-free
    small = compute_group_advantages(_scores([1.0, 0.0, -1.0]), eps=0.0)
    assert adv == pytest.approx([small.advantages[f"r{i}"] for i in range(3)], rel=1e-9)


def test_scaling_keeps_eps_relative_to_the_raw_rewards() -> None:
    # eps is added to the raw std (0.5 for {0, 1}), as before the rescaling
    stats = compute_group_advantages(_scores([1.0, 0.0]), eps=0.5)
    assert stats.advantages["r0"] == pytest.approx(0.5 / (0.5 + 0.5))


@pytest.mark.parametrize(("std", "spread"), [("population", 0.5), ("sample", math.sqrt(0.5))])
def test_std_switch(std: str, spread: float) -> None:
    stats = compute_group_advantages(_scores([1.0, 0.0]), std=std, eps=0.0)
    assert stats.advantages["r0"] == pytest.approx(0.5 / spread)


def test_unknown_std_is_refused() -> None:
    with pytest.raises(ValueError, match="std must be one of"):
        compute_group_advantages(_scores([1.0, 0.0]), std="unbiased")


def test_without_normalisation_advantages_keep_the_reward_scale() -> None:
    stats = compute_group_advantages(_scores([3e8, 1e8]), normalize_std=False)
    assert stats.advantages == pytest.approx({"r0": 1e8, "r1": -1e8})


def test_ordinary_rewards_use_the_plain_formula_bit_for_bit() -> None:
    """Seeded runs reproduce across versions only if the advantages do, to the last bit."""
    rewards = [0.125, 0.0, 0.7, 0.3333333333333333, 0.0]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    stats = compute_group_advantages(_scores(rewards))
    assert [stats.advantages[f"r{i}"] for i in range(5)] == [(r - mean) / (std + 1e-4) for r in rewards]
