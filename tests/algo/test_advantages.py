"""Group advantages and datum building: the maths every driven backend trains on."""

from __future__ import annotations

import math

import pytest

from core.algo import RolloutScore, compute_group_advantages, trace_to_datum
from core.types import TraceRecord


def _scores(group: str, rewards: list[float | None]) -> list[RolloutScore]:
    return [RolloutScore(f"{group}-{i}", group, r) for i, r in enumerate(rewards)]


def test_mean_centred_and_std_normalised() -> None:
    stats = compute_group_advantages(_scores("g", [1.0, 0.0, 0.0, 1.0]), eps=0.0)
    assert stats.advantages == {"g-0": 1.0, "g-1": -1.0, "g-2": -1.0, "g-3": 1.0}


def test_without_std_normalisation() -> None:
    stats = compute_group_advantages(_scores("g", [0.5, 0.0]), normalize_std=False)
    assert stats.advantages == pytest.approx({"g-0": 0.25, "g-1": -0.25})


def test_failed_rollouts_are_excluded_not_scored_zero() -> None:
    stats = compute_group_advantages(_scores("g", [1.0, None, 0.5]), normalize_std=False)
    assert set(stats.advantages) == {"g-0", "g-2"}
    assert stats.advantages["g-0"] == pytest.approx(0.25)
    assert stats.excluded_failed == 1


def test_failed_scored_zero_when_asked() -> None:
    stats = compute_group_advantages(
        _scores("g", [1.0, None]), normalize_std=False, exclude_failed=False
    )
    assert stats.advantages == pytest.approx({"g-0": 0.5, "g-1": -0.5})
    assert stats.scored_failed == 1


def test_constant_and_tiny_groups_are_skipped_and_counted() -> None:
    scores = _scores("a", [0.3, 0.3, 0.3]) + _scores("b", [1.0, None]) + _scores("c", [0.0, 1.0])
    stats = compute_group_advantages(scores)
    assert stats.groups == 3
    assert stats.skipped_constant == 1
    assert stats.skipped_too_small == 1
    assert set(stats.advantages) == {"c-0", "c-1"}


def test_advantages_sum_to_zero_per_group() -> None:
    stats = compute_group_advantages(_scores("g", [0.1, 0.7, 0.2, 0.9, 0.4]))
    assert math.isclose(sum(stats.advantages.values()), 0.0, abs_tol=1e-9)


def _record() -> TraceRecord:
    # prompt [5, 6, 7], generated [8, 9], tool output [10], generated [11]
    return TraceRecord(
        session_id="s",
        token_ids=[5, 6, 7, 8, 9, 10, 11],
        loss_mask=[0, 0, 0, 1, 1, 0, 1],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -1.0],
        prompt_length=3,
    )


def test_datum_is_shifted_by_one() -> None:
    datum = trace_to_datum(_record(), advantage=2.0)
    assert datum is not None
    assert datum.model_input == [5, 6, 7, 8, 9, 10]
    assert datum.target_tokens == [6, 7, 8, 9, 10, 11]
    assert datum.weights == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert datum.logprobs == [0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert datum.advantages == [0.0, 0.0, 2.0, 2.0, 0.0, 2.0]


def test_row_without_generated_tokens_gives_no_datum() -> None:
    record = TraceRecord("s", [1, 2, 3], [0, 0, 0], [0.0] * 3, prompt_length=3)
    assert trace_to_datum(record, 1.0) is None
