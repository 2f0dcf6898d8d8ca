"""The parity fixture (core.testing.parity) is well formed and says what its docstring says.

Backends compare their training signal against ``expected_token_advantages``;
these tests pin the specification itself, so a change to it is deliberate.
"""

from __future__ import annotations

import math

import pytest

from core.algo import RolloutScore, compute_group_advantages
from core.testing.parity import expected_advantages, expected_token_advantages, parity_batch


def test_rows_are_valid_and_cover_every_case() -> None:
    batch = parity_batch()
    for r in batch:
        for row in r.rows:
            row.validate()
    groups = {r.request.group_id for r in batch}
    assert groups == {"normal", "survivor", "constant", "forked", "broken"}
    assert max(len(r.rows) for r in batch) == 2  # a forked rollout


def test_specification_of_the_awkward_cases() -> None:
    adv = expected_advantages(parity_batch())
    assert adv["survivor-0"] == 0.0  # lone survivor: no baseline, no push
    assert adv["survivor-1"] is None and adv["survivor-2"] is None
    assert {adv[f"constant-{i}"] for i in range(3)} == {0.0}
    assert adv["broken-2"] is None and adv["broken-3"] is None  # never in the baseline
    assert adv["broken-0"] == pytest.approx(-adv["broken-1"])  # type: ignore[operator]
    # The forked rollout counts once: same advantage as an unforked 1.0-vs-0.0 group.
    assert adv["forked-0"] == pytest.approx(adv["broken-0"])
    tokens = expected_token_advantages(parity_batch())
    assert ("forked-0", 0) in tokens and ("forked-0", 1) in tokens
    assert ("broken-2", 0) not in tokens


@pytest.mark.parametrize("std", ["population", "sample"])
def test_std_switch(std: str) -> None:
    adv = expected_advantages(parity_batch(), std=std, eps=0.0)  # type: ignore[arg-type]
    spread = 0.5 if std == "population" else math.sqrt(0.5)  # std of rewards {1, 0}
    assert adv["broken-0"] == pytest.approx(0.5 / spread)


def test_core_advantages_match_the_specification() -> None:
    batch = parity_batch()
    stats = compute_group_advantages(
        RolloutScore(r.request.rollout_id, r.request.group_id, r.result.reward if r.ok else None)
        for r in batch
    )
    expected = expected_advantages(batch)
    for rollout_id, a in expected.items():
        got = stats.advantages.get(rollout_id)
        if a is None:
            assert got is None, rollout_id
        else:  # lone and constant groups get no entry; the loop trains them at 0.0
            assert (0.0 if got is None else got) == pytest.approx(a), rollout_id
