"""Staleness in ``trainer.mode=async`` is bounded at admission and corrected per token
(issue #28): the hard per-token bound masks old turns, the group stays; a group's age
counts only rollouts that will train; ``tis_cap`` is on by default in async. With several
policies every turn is aged against its own policy's version (issue #34)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from core.errors import ConfigError
from core.rollout import RolloutOutcome
from core.trainer.config import ASYNC_TIS_CAP, TrainerConfig
from core.trainer.loop import Trainer
from core.trainer.metrics import flow_metrics
from core.trainer.policies import policy_metrics
from core.trainer.pool import FinishedGroup, mask_stale_turns, rollout_staleness
from core.trainer.signal import StepSignal
from core.types import (
    DEFAULT_POLICY,
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TraceRecord,
    TurnSpan,
)


def _outcome(
    versions: list[int], status: RolloutStatus = RolloutStatus.OK, policy: str = DEFAULT_POLICY
) -> RolloutOutcome:
    turns = [TurnSpan(2 + 3 * i, 4 + 3 * i, FinishReason.STOP, v, policy=policy) for i, v in enumerate(versions)]
    n = 2 + 3 * len(versions)
    mask = [0] * n
    for t in turns:
        mask[t.start : t.end] = [1] * (t.end - t.start)
    row = TraceRecord(session_id="s", token_ids=[1] * n, loss_mask=mask, logprobs=[-1.0] * n,
                      prompt_length=2, turns=turns)
    return RolloutOutcome(
        request=RolloutRequest(rollout_id="r", group_id="g", payload={}, base_url="u", session_id="s", model_id="m"),
        result=RolloutResult(rollout_id="r", status=status, reward=1.0 if status is RolloutStatus.OK else None,
                             error=None, elapsed_s=0.0),
        rows=[row],
    )


def test_turns_older_than_the_hard_bound_become_context() -> None:
    o = _outcome([3, 5, 6])  # trained at version 7, bound 1: turns of versions 3 and 5 are stale
    (masked_o,), masked = mask_stale_turns([o], version=7, max_staleness=1)
    assert masked == 4
    row = masked_o.rows[0]
    assert row.loss_mask == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]
    assert row.token_ids == o.rows[0].token_ids and row.turns == o.rows[0].turns  # still context
    assert masked_o.result.reward == 1.0  # the rollout and its advantage stay
    assert sum(o.rows[0].loss_mask) == 6  # the recorded rollout is not changed
    (same,), none = mask_stale_turns([o], version=7, max_staleness=4)
    assert same is o and none == 0


def test_a_groups_age_counts_only_rollouts_that_will_train() -> None:
    early_failure = _outcome([0], RolloutStatus.TIMEOUT)
    group = FinishedGroup(seq=0, data_index=0, outcomes=[early_failure, _outcome([4]), _outcome([5])])
    assert group.staleness(6) == 2


def test_with_exclude_failed_false_a_failed_rollout_trains_so_it_ages_its_group() -> None:
    """``algorithm.exclude_failed=false`` trains a failed rollout with rows at reward 0, so its
    old tokens are trained and the group's age and the staleness metrics must count them."""
    early_failure = _outcome([0], RolloutStatus.TIMEOUT)
    outcomes = [early_failure, _outcome([4]), _outcome([5])]
    group = FinishedGroup(seq=0, data_index=0, outcomes=outcomes)
    assert group.staleness(6, exclude_failed=False) == 6
    assert group.staleness(6, exclude_failed=True) == 2
    flow = {"rollouts/finished": 3}
    scored = flow_metrics(outcomes, 6, flow, 1.0, exclude_failed=False)
    excluded = flow_metrics(outcomes, 6, flow, 1.0)
    assert (scored["async/staleness_max"], scored["async/staleness_mean"]) == (6, 3.0)
    assert scored["async/token_staleness_max"] == 6
    assert (excluded["async/staleness_max"], excluded["async/staleness_mean"]) == (2, 1.5)
    assert excluded["async/token_staleness_max"] == 2
    # A failed rollout without rows trains in neither case.
    rowless = replace(early_failure, rows=[])
    lone = FinishedGroup(seq=1, data_index=1, outcomes=[rowless, _outcome([5])])
    assert lone.staleness(6, exclude_failed=False) == 1


def _two_roles(up: list[int], down: list[int]) -> RolloutOutcome:
    """A rollout with a row of policy ``up`` and one of ``down``, turns at those versions."""
    a, b = _outcome(up, policy="up"), _outcome(down, policy="down")
    return replace(a, rows=[a.rows[0], b.rows[0]])


def test_each_turn_is_aged_against_its_own_policys_version() -> None:
    """Policy ``up`` stepped to version 5, ``down`` never stepped (version 0): down's turns,
    sampled at 0, are not stale at all, however far up has moved; up's turns at 3 are 2 old."""
    versions = {"up": 5, "down": 0}
    o = _two_roles([3, 5], [0, 0])
    assert rollout_staleness([o], versions) == [2]
    assert rollout_staleness([o], 5) == [5]  # what one version for every turn would say
    assert FinishedGroup(seq=0, data_index=0, outcomes=[o]).staleness(versions) == 2
    flow = flow_metrics([o], versions, {"rollouts/finished": 1}, 1.0)
    assert (flow["async/staleness_max"], flow["async/token_staleness_max"]) == (2, 2)
    assert flow["async/token_staleness_mean"] == pytest.approx(0.5)  # 2 of 8 tokens (up's) 2 old
    # The hard bound masks up's stale turn only; down's turns all still train.
    (masked_o,), masked = mask_stale_turns([o], versions, max_staleness=0)
    assert masked == 2
    up_row, down_row = masked_o.rows
    assert up_row.loss_mask == [0, 0, 0, 0, 0, 1, 1, 0]
    assert down_row.loss_mask == o.rows[1].loss_mask and sum(down_row.loss_mask) == 4


def test_a_policys_staleness_counts_the_failed_rollouts_that_train() -> None:
    """``policy/<name>/staleness_*`` read the rollouts that train, as ``async/staleness_*`` do:
    under ``exclude_failed=false`` a failed rollout with rows trains (at reward 0), so its old
    tokens count; by default it does not train and does not age the policy."""
    failed = replace(_two_roles([1], [4]), result=replace(_outcome([1]).result, status=RolloutStatus.TIMEOUT, reward=None))
    outcomes = [failed, _two_roles([5], [4])]
    versions = {"up": 5, "down": 4}
    scored = policy_metrics(outcomes, StepSignal(), versions, versions, exclude_failed=False)
    excluded = policy_metrics(outcomes, StepSignal(), versions, versions)
    assert scored["policy/up/staleness_max"] == 4 and excluded["policy/up/staleness_max"] == 0
    assert scored["policy/up/rollouts"] == excluded["policy/up/rollouts"] == 1  # rewards: ok ones only
    flow = flow_metrics(outcomes, versions, {"rollouts/finished": 2}, 1.0, exclude_failed=False)
    assert flow["async/staleness_max"] == scored["policy/up/staleness_max"]


def test_a_turn_of_a_policy_the_run_does_not_have_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="policy 'down' trains, but the run's policies are \\['up'\\]"):
        rollout_staleness([_two_roles([1], [1])], {"up": 1})


@pytest.mark.parametrize(
    ("mode", "loss", "given", "applies", "expected"),
    [
        ("async", "ppo", None, True, ASYNC_TIS_CAP),
        ("async", "cispo", None, True, ASYNC_TIS_CAP),
        ("async", "importance_sampling", None, True, ASYNC_TIS_CAP),
        ("async", "ppo", 0.0, True, 0.0),  # explicitly off
        ("async", "ppo", 5.0, True, 5.0),
        ("async", "ppo", None, False, 0.0),  # Tinker, SageMaker: their losses have no cap
        ("async", "cross_entropy", None, True, 0.0),
        ("sync", "ppo", None, True, 0.0),
    ],
)
def test_tis_cap_is_on_by_default_in_async(
    mode: str, loss: str, given: float | None, applies: bool, expected: float
) -> None:
    fake = SimpleNamespace(
        algo=SimpleNamespace(tis_cap=given, loss=loss),
        t=SimpleNamespace(mode=mode),
        backend=SimpleNamespace(truncates_importance_weights=applies),
    )
    assert Trainer.tis_cap.fget(fake) == expected  # type: ignore[attr-defined]


def test_max_staleness_per_token_is_checked() -> None:
    with pytest.raises(ConfigError, match="max_staleness_per_token=-2 must be -1"):
        TrainerConfig(max_staleness_per_token=-2)
