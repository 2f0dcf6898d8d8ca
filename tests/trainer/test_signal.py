"""Core's tier of the parity check: the loop's own datum building (``build_signal``,
which ``Trainer._signal`` calls) gives the parity batch the per-token advantages
``core.testing.parity`` specifies."""

from __future__ import annotations

import pytest

from core.testing.parity import expected_token_advantages, parity_batch
from core.trainer.signal import build_signal


@pytest.mark.parametrize("std", ["population", "sample"])
def test_loop_datums_match_the_parity_specification(std: str) -> None:
    batch = parity_batch()
    signal = build_signal(batch, std=std)
    expected = expected_token_advantages(batch, std=std)  # type: ignore[arg-type]
    assert len(signal.sources) == len(set(signal.sources)) == len(signal.datums)
    assert set(signal.sources) == set(expected)
    rows = {(r.request.rollout_id, row.row_index): row for r in batch for row in r.rows}
    for key, datum in zip(signal.sources, signal.datums, strict=True):
        # Datums are shifted by one (Tinker's convention): target t is token t + 1 of the row.
        assert datum.target_tokens == rows[key].token_ids[1:], key
        assert datum.advantages == pytest.approx(expected[key][1:], abs=1e-12), key
    # the cases the fixture exists for
    trained = {rid for rid, _ in signal.sources}
    assert not trained & {"survivor-1", "survivor-2", "broken-2", "broken-3"}
    assert signal.advantages["survivor-0"] == 0.0 and signal.advantages["constant-2"] == 0.0
    assert ("forked-0", 0) in signal.sources and ("forked-0", 1) in signal.sources
    assert signal.metrics["groups/skipped_too_small"] == 1 and signal.metrics["groups/skipped_constant"] == 1
    assert signal.metrics["rollouts/excluded_failed"] == 4


def test_sign_of_the_advantages_follows_the_reward() -> None:
    signal = build_signal(parity_batch())
    adv = signal.advantages
    assert adv["normal-0"] > 0 > adv["normal-1"]  # rewards 1.0 and 0.0 around a mean of 0.5
    assert adv["normal-2"] == pytest.approx(0.0)  # reward 0.5: the mean itself
    assert signal.has_signal


def test_trained_token_mean_leaves_out_groups_without_signal() -> None:
    signal = build_signal(parity_batch(), token_mean_over="trained")
    trained = {rid for rid, _ in signal.sources}
    assert not trained & {"survivor-0", "constant-0", "constant-1", "constant-2"}
    assert "normal-0" in trained


def test_scoring_failures_zero_only_touches_failures_with_rows() -> None:
    batch = parity_batch()
    signal = build_signal(batch, exclude_failed=False)
    trained = {rid for rid, _ in signal.sources}
    # a timeout with a row is pushed down; failures without rows have nothing to push
    assert "survivor-1" in trained and signal.advantages["survivor-1"] < 0
    assert "broken-2" in trained  # sampler_error with a row: the user asked to score failures 0
    assert "survivor-2" not in signal.advantages and "broken-3" not in signal.advantages
    assert signal.metrics["rollouts/scored_failed"] == 2
    assert signal.metrics["rollouts/excluded_failed"] == 2


def test_a_step_of_constant_groups_has_no_signal() -> None:
    constant = [r for r in parity_batch() if r.request.group_id in ("constant", "survivor")]
    signal = build_signal(constant)
    assert signal.datums and not signal.has_signal  # tokens to count, nothing to learn
