"""The fork-safe reward post-processor against slime's positional default.

``slime_default`` below re-states, in our own code, what slime's
``RolloutManager._post_process_rewards`` (``slime/ray/rollout.py`` at commit
624b824a898ab0ec1fcb4d373004c7f3852bf515) does: rows of
``n_samples_per_prompt`` by position when the sample count equals
``n_samples_per_prompt * rollout_batch_size``, else the whole batch as one
group; centre; divide by the (Bessel) std + 1e-6 for grpo/gspo/cispo.
Samples are the plugin's stand-in of slime's ``Sample`` (slime is not
installable here).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from conftest import slime_args
from tracerl_slime.rewards import post_process_rewards
from tracerl_slime.sample import Sample


def slime_default(args: Any, samples: list[Any]) -> list[float]:
    raw = [float(s.reward) for s in samples]
    n = args.n_samples_per_prompt
    if len(raw) == n * args.rollout_batch_size:
        groups = [list(range(i, i + n)) for i in range(0, len(raw), n)]
    else:
        groups = [list(range(len(raw)))]
    out = [0.0] * len(raw)
    for g in groups:
        vals = [raw[i] for i in g]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in g:
            out[i] = (raw[i] - mean) / (std + 1e-6)
    return out


def _s(group: int, rid: int, reward: float, *, aborted: bool = False) -> Any:
    s = Sample(group_index=group, index=rid, rollout_id=rid, reward=reward)
    if aborted:
        s.status, s.remove_sample = Sample.Status.ABORTED, True
    else:
        s.status = Sample.Status.COMPLETED
    return s


ARGS = slime_args(None, n_samples_per_prompt=2, rollout_batch_size=2)
Z = 0.5 / math.sqrt(0.5)  # (1 - 0.5) / std([1, 0]) with Bessel's correction


def test_plain_groups_match_slime_default() -> None:
    """Without forks the two agree exactly: ours is a drop-in replacement."""
    samples = [_s(0, 0, 1.0), _s(0, 1, 0.0), _s(1, 2, 0.25), _s(1, 3, 0.75)]
    raw, ours = post_process_rewards(ARGS, samples)
    assert raw == [1.0, 0.0, 0.25, 0.75]
    assert ours == pytest.approx(slime_default(ARGS, samples))


def test_forked_rollout_breaks_slime_default_not_ours() -> None:
    # prompt 0: rollout 0 forked into two rows (reward 1), rollout 1 (reward 0)
    # prompt 1: rollout 2 (reward 1), rollout 3 (reward 0)
    samples = [_s(0, 0, 1.0), _s(0, 0, 1.0), _s(0, 1, 0.0), _s(1, 2, 1.0), _s(1, 3, 0.0)]
    _, ours = post_process_rewards(ARGS, samples)
    assert ours == pytest.approx([Z, Z, -Z, Z, -Z], abs=1e-5)
    default = slime_default(ARGS, samples)
    # 5 != 2 * 2, so slime pools the batch into one group of 5 and counts the fork twice
    pooled_mean = (1 + 1 + 0 + 1 + 0) / 5
    assert default[2] < 0 and default[2] != pytest.approx(-Z, abs=1e-3)
    assert default[3] != pytest.approx(Z, abs=1e-3), (
        "prompt 1's advantages depend on prompt 0's fork"
    )
    assert sum(default) == pytest.approx(0.0, abs=1e-5)
    assert default[0] == pytest.approx((1 - pooled_mean) / 0.5477225, rel=1e-4)


def test_order_does_not_matter() -> None:
    samples = [
        _s(0, 0, 1.0),
        _s(0, 0, 1.0),
        _s(0, 1, 0.0),
        _s(1, 2, 1.0),
        _s(1, 3, 0.0),
        _s(1, 4, 0.5),
    ]
    _, ours = post_process_rewards(ARGS, samples)
    expected = {id(s): v for s, v in zip(samples, ours, strict=True)}
    shuffled = samples[:]
    random.Random(3).shuffle(shuffled)
    _, again = post_process_rewards(ARGS, shuffled)
    assert again == pytest.approx([expected[id(s)] for s in shuffled])


def test_a_fork_counts_once_in_the_baseline() -> None:
    """Ten rows of one rollout must weigh as much as one row of the other."""
    samples = [_s(0, 0, 1.0) for _ in range(10)] + [_s(0, 1, 0.0)]
    _, ours = post_process_rewards(ARGS, samples)
    assert ours[:10] == pytest.approx([Z] * 10, abs=1e-5)
    assert ours[10] == pytest.approx(-Z, abs=1e-5)


def test_failed_rollout_is_out_of_the_baseline_and_gets_zero() -> None:
    samples = [_s(0, 0, 1.0), _s(0, 1, 0.0), _s(0, 2, 0.0, aborted=True)]
    _, ours = post_process_rewards(ARGS, samples)
    assert ours == pytest.approx([Z, -Z, 0.0], abs=1e-5)
    # slime's default would count the aborted sample's 0.0 into the mean
    assert slime_default(ARGS, samples)[0] != pytest.approx(Z, abs=1e-3)


def test_group_with_one_survivor_has_zero_advantage() -> None:
    samples = [_s(0, 0, 1.0), _s(0, 1, 0.0, aborted=True)]
    _, ours = post_process_rewards(ARGS, samples)
    assert ours == [0.0, 0.0]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"advantage_estimator": "reinforce_plus_plus_baseline"}, [0.5, 0.5, -0.5]),
        ({"grpo_std_normalization": False}, [0.5, 0.5, -0.5]),
        ({"rewards_normalization": False}, [1.0, 1.0, 0.0]),
        ({"advantage_estimator": "ppo"}, [1.0, 1.0, 0.0]),
    ],
)
def test_estimator_switches_follow_slime(overrides: dict[str, Any], expected: list[float]) -> None:
    args = slime_args(None, **overrides)
    samples = [_s(0, 0, 1.0), _s(0, 0, 1.0), _s(0, 1, 0.0)]
    raw, ours = post_process_rewards(args, samples)
    assert raw == [1.0, 1.0, 0.0]
    assert ours == pytest.approx(expected)


def test_reward_key_selects_from_dict_rewards() -> None:
    args = slime_args(None, reward_key="acc")
    a, b = _s(0, 0, 0.0), _s(0, 1, 0.0)
    a.reward, b.reward = {"acc": 1.0, "len": 3}, {"acc": 0.0, "len": 9}
    raw, ours = post_process_rewards(args, [a, b])
    assert raw == [1.0, 0.0]
    assert ours == pytest.approx([Z, -Z], abs=1e-5)


def test_missing_group_index_is_an_error() -> None:
    s = Sample(index=0, rollout_id=0, reward=1.0)
    with pytest.raises(ValueError, match="group_index"):
        post_process_rewards(ARGS, [s])
