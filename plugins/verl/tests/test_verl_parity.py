"""Parity: verl trains ``core.testing.parity``'s batch the way the specification says.

Every rollout of ``parity_batch()`` goes through the agent loop's own
translation (``rollout_outputs``: failed, ``sampler_error`` and
``no_model_calls`` rollouts raise ``RolloutFailed`` and never reach verl, the
others become ``AgentLoopOutput`` rows), the rows are batched as verl's v1
trainer batches them, the ``algorithm`` config is what ``verl_overrides``
translates tracerl's config into, and verl's real advantage call
(``trainer_base.compute_advantage_for_multi_trajectories``, routed to our
estimator by ``tracerl_verl.verl_ext``) computes the advantages. They must equal
``expected_token_advantages`` on every response token.
"""

from __future__ import annotations

from typing import Any

import pytest
from tracerl_verl.agent_loop import RolloutFailed, rollout_outputs
from tracerl_verl.translate import LaunchPaths, verl_overrides
from verl_fixtures import compose_tracerl, run_verl_advantage, verl_algorithm_config, verl_batch

from core.testing.parity import expected_token_advantages, parity_batch
from core.types import RolloutStatus

PATHS = LaunchPaths(
    run_dir="/runs/p", model="/m", train_file="/t", val_file="/v", agent_loop_yaml="/a.yaml"
)
PROMPT_LENGTH, RESPONSE_LENGTH = 64, 64


@pytest.fixture(scope="module", autouse=True)
def _verl_ext() -> None:
    import tracerl_verl.verl_ext  # noqa: F401


def _verl_advantages(std: str, normalize: bool) -> tuple[dict[tuple[str, int], list[float]], Any]:
    """Per-token advantage of each row verl trains, keyed like the specification."""
    cfg = compose_tracerl(
        [
            "backend=verl",
            f"algorithm.std={std}",
            f"algorithm.normalize_std={str(normalize).lower()}",
        ]
    )
    algo = verl_algorithm_config(verl_overrides(cfg, PATHS))
    batch = parity_batch()
    sessions: list[tuple[str, list[Any]]] = []
    owners: list[Any] = []
    excluded = []
    for r in batch:
        try:
            outputs = rollout_outputs(
                r,
                prompt_length=PROMPT_LENGTH,
                response_length=RESPONSE_LENGTH,
                exclude_failed=bool(cfg.algorithm.exclude_failed),
            )
        except RolloutFailed:
            excluded.append(r.request.rollout_id)
            continue
        sessions.append((r.request.group_id, outputs))
        owners += [(r, out) for out in outputs]
    assert excluded == [r.request.rollout_id for r in batch if not r.ok]
    data, keys = verl_batch(sessions)
    adv = run_verl_advantage(data, keys, algo, n=int(cfg.trainer.group_size)).batch["advantages"]
    got: dict[tuple[str, int], list[float]] = {}
    for k, (r, out) in enumerate(owners):
        (row,) = [row for row in r.rows if row.token_ids == out.prompt_ids + out.response_ids]
        response = adv[k, : len(out.response_ids)].tolist()
        got[(r.request.rollout_id, row.row_index)] = [0.0] * len(out.prompt_ids) + response
    return got, algo


@pytest.mark.parametrize("std", ["population", "sample"])
@pytest.mark.parametrize("normalize", [True, False])
def test_verl_gives_the_parity_batch_the_specified_advantages(std: str, normalize: bool) -> None:
    got, algo = _verl_advantages(std, normalize)
    expected = expected_token_advantages(
        parity_batch(),
        std=std,
        eps=float(algo.tracerl_eps),
        normalize_std=normalize,  # type: ignore[arg-type]
    )
    assert set(got) == set(expected)
    for key, tokens in expected.items():
        assert got[key] == pytest.approx(tokens, abs=1e-5), key
    # the cases the batch is for, spelled out
    assert set(got[("survivor-0", 0)]) == {0.0}
    assert all(set(got[(f"constant-{i}", 0)]) == {0.0} for i in range(3))
    assert ("broken-2", 0) not in got and ("survivor-1", 0) not in got
    forked = [a for key in (("forked-0", 0), ("forked-0", 1)) for a in got[key] if a]
    assert forked and len(set(forked)) == 1 and forked[0] > 0
    assert algo.adv_estimator == "tracerl_grpo" and algo.tracerl_std == std


@pytest.mark.parametrize("status", [s for s in RolloutStatus if s is not RolloutStatus.OK])
@pytest.mark.parametrize("exclude_failed", [True, False])
def test_the_agent_loop_fails_every_status_but_ok(
    status: RolloutStatus, exclude_failed: bool
) -> None:
    """Any non-ok rollout raises (verl drops it); with ``exclude_failed=false`` one with rows
    is scored 0.0 instead, whatever its status (as core's loop does)."""
    from dataclasses import replace

    template = next(r for r in parity_batch() if r.request.rollout_id == "survivor-1")
    rollout = replace(
        template,
        result=replace(template.result, status=status),
        rows=[replace(row, status=status) for row in template.rows],
    )
    assert rollout.rows  # it has something that could be trained
    kw = {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH}
    if exclude_failed:
        with pytest.raises(RolloutFailed, match=status.value) as info:
            rollout_outputs(rollout, exclude_failed=exclude_failed, **kw)
        assert info.value.status == status.value
    else:
        outputs = rollout_outputs(rollout, exclude_failed=False, **kw)
        assert [o.reward_score for o in outputs] == [0.0]


def test_a_rollout_without_rows_fails_whatever_its_status() -> None:
    for rid in ("broken-3", "survivor-2"):  # no_model_calls, crashed: no rows
        rollout = next(r for r in parity_batch() if r.request.rollout_id == rid)
        with pytest.raises(RolloutFailed):
            rollout_outputs(rollout, prompt_length=8, response_length=8, exclude_failed=False)
