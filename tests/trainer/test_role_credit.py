"""Credit with several policies (docs/multi_agent.md): every row trains with its rollout's
group advantage, except the rows of a policy the rollout returned a ``role_rewards`` entry
for, which get that role's advantage within its group; datums are grouped by the policy
that sampled them; role rewards naming no policy fail their rollout, saying so."""

from __future__ import annotations

from typing import Any

import pytest

from core.rollout import RolloutOutcome
from core.runtime._results import result_from_output
from core.trainer.signal import build_signal, check_role_rewards, datums_by_policy
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)


def _row(rollout_id: str, index: int, policy: str) -> TraceRecord:
    ids = [1, 2, 3, 10 + index, 4]
    return TraceRecord(
        session_id=f"s-{rollout_id}",
        token_ids=ids,
        loss_mask=[0, 0, 0, 1, 1],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.1],
        prompt_length=3,
        turns=[TurnSpan(3, 5, FinishReason.STOP, 0, policy=policy)],
        row_index=index,
        rollout_id=rollout_id,
        group_id="g",
    )


def _outcome(
    rollout_id: str, reward: float, roles: dict[str, float] | None = None, *, status: RolloutStatus = RolloutStatus.OK
) -> RolloutOutcome:
    request = RolloutRequest(rollout_id, "g", {}, "http://x/v1", f"s-{rollout_id}", "m")
    ok = status is RolloutStatus.OK
    result = RolloutResult(
        rollout_id, status, reward=reward if ok else None, role_rewards=roles or {}, error=None if ok else "x"
    )
    return RolloutOutcome(request=request, result=result, rows=[_row(rollout_id, 0, "up"), _row(rollout_id, 1, "down")])


def _advantage(signal: Any, rollout_id: str, policy: str) -> float:
    for (rid, _), pol, datum in zip(signal.sources, signal.policies, signal.datums, strict=True):
        if rid == rollout_id and pol == policy:
            return float(datum.advantages[-1])
    raise AssertionError(f"no datum of {rollout_id}/{policy}")


def test_without_role_rewards_every_row_gets_the_rollouts_group_advantage() -> None:
    signal = build_signal([_outcome("a", 1.0), _outcome("b", 0.0)], normalize_std=False)
    assert _advantage(signal, "a", "up") == _advantage(signal, "a", "down") == pytest.approx(0.5)
    assert _advantage(signal, "b", "up") == _advantage(signal, "b", "down") == pytest.approx(-0.5)
    assert signal.policies == ["up", "down", "up", "down"]


def test_role_rewards_give_each_role_its_own_group_baseline() -> None:
    """Rollout a's up was right and its down wrong, b the other way round: the rollout rewards
    are equal (no signal at all by default), yet each role's turns are pushed the right way."""
    outcomes = [
        _outcome("a", 0.5, {"up": 1.0, "down": 0.0}),
        _outcome("b", 0.5, {"up": 0.0, "down": 1.0}),
    ]
    assert not build_signal([_outcome("a", 0.5), _outcome("b", 0.5)]).has_signal
    signal = build_signal(outcomes, normalize_std=False)
    assert signal.has_signal
    assert _advantage(signal, "a", "up") == pytest.approx(0.5) and _advantage(signal, "a", "down") == pytest.approx(-0.5)
    assert _advantage(signal, "b", "up") == pytest.approx(-0.5) and _advantage(signal, "b", "down") == pytest.approx(0.5)
    assert signal.metrics["groups/skipped_constant"] == 1  # the rollout rewards' own group: constant


def test_a_role_without_a_role_reward_keeps_the_rollout_advantage() -> None:
    outcomes = [_outcome("a", 1.0, {"up": 0.0}), _outcome("b", 0.0, {"up": 1.0})]
    signal = build_signal(outcomes, normalize_std=False)
    assert _advantage(signal, "a", "up") == pytest.approx(-0.5)  # the role's own reward
    assert _advantage(signal, "a", "down") == pytest.approx(0.5)  # the rollout's


def test_failed_rollouts_stay_out_of_role_baselines() -> None:
    outcomes = [
        _outcome("a", 1.0, {"up": 1.0}),
        _outcome("b", 0.0, {"up": 0.0}),
        _outcome("c", 0.0, status=RolloutStatus.TIMEOUT),
    ]
    signal = build_signal(outcomes, normalize_std=False)
    assert {rid for rid, _ in signal.sources} == {"a", "b"}
    assert _advantage(signal, "a", "up") == pytest.approx(0.5)


def test_datums_are_grouped_by_the_policy_that_sampled_them() -> None:
    signal = build_signal([_outcome("a", 1.0), _outcome("b", 0.0)])
    grouped = signal.by_policy()
    assert list(grouped) == ["up", "down"] and [len(v) for v in grouped.values()] == [2, 2]
    ups = [d for d, p in zip(signal.datums, signal.policies, strict=True) if p == "up"]
    assert grouped["up"] == ups
    with pytest.raises(ValueError):
        datums_by_policy(signal.datums, ["up"])


def test_role_rewards_naming_no_policy_fail_the_rollout_and_say_which() -> None:
    checked = check_role_rewards([_outcome("a", 1.0, {"up": 1.0, "planner": 0.0}), _outcome("b", 0.0)], ["up", "down"])
    bad, good = checked
    assert bad.result.status is RolloutStatus.INVALID_REWARD and bad.result.reward is None
    assert "['planner']" in str(bad.result.error) and "['up', 'down']" in str(bad.result.error)
    assert all(r.status is RolloutStatus.INVALID_REWARD and r.reward is None for r in bad.rows)
    assert good.result.status is RolloutStatus.OK


def test_with_one_policy_role_rewards_are_dropped_and_the_rollout_trains_on_its_reward() -> None:
    """One shared policy: the roles have nothing to tell apart (the two-role task's shared run)."""
    (checked,) = check_role_rewards([_outcome("a", 0.5, {"up": 1.0, "down": 0.0})], [])
    assert checked.result.status is RolloutStatus.OK and checked.result.role_rewards == {}
    assert checked.result.reward == 0.5


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ([1.0], "must map policy names to rewards, got list"),
        ({"up": "1.0"}, "'up': '1.0' must be a finite number"),
        ({"up": float("nan")}, "'up': nan must be a finite number"),
        ({"up": True}, "'up': True must be a finite number"),
    ],
)
def test_malformed_role_rewards_are_an_invalid_reward(roles: Any, message: str) -> None:
    result = result_from_output("r", {"reward": 1.0, "role_rewards": roles}, 0.1)
    assert result.status is RolloutStatus.INVALID_REWARD and result.reward is None
    assert message in str(result.error)


def test_role_rewards_are_read_with_the_reward() -> None:
    result = result_from_output("r", {"reward": 0.5, "role_rewards": {"up": 1, "down": 0.0}}, 0.1)
    assert result.status is RolloutStatus.OK and result.role_rewards == {"up": 1.0, "down": 0.0}
    assert result_from_output("r", {"reward": 0.5}, 0.1).role_rewards == {}
