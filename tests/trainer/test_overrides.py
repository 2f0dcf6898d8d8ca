"""``mask_override_turns``: a turn sampled at other settings than the loss assumes is context."""

from __future__ import annotations

from types import SimpleNamespace

from core.rollout import RolloutOutcome
from core.trainer.overrides import LossSampling, loss_sampling, mask_override_turns
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SamplingParams,
    TraceRecord,
    TurnSpan,
)


def _outcome(params: list[object]) -> RolloutOutcome:
    turns = [TurnSpan(2 + 3 * i, 4 + 3 * i, FinishReason.STOP, 0) for i in range(len(params))]
    n = turns[-1].end
    mask = [0] * n
    for t in turns:
        mask[t.start : t.end] = [1] * (t.end - t.start)
    row = TraceRecord(session_id="s", token_ids=list(range(n)), loss_mask=mask, logprobs=[-1.0] * n,
                      prompt_length=2, turns=turns, metadata={"turn_params": params})
    return RolloutOutcome(
        request=RolloutRequest(rollout_id="r", group_id="g", payload={}, base_url="u", session_id="s", model_id="m"),
        result=RolloutResult(rollout_id="r", status=RolloutStatus.OK, reward=1.0, error=None, elapsed_s=0.0),
        rows=[row],
    )


def test_turns_at_another_temperature_or_top_p_become_context() -> None:
    loss = LossSampling(temperature=1.0)
    o = _outcome([
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),  # an agent's override
        {"temperature": 1.0, "top_p": 0.9, "top_k": -1},  # as read back from a trace
        SamplingParams(temperature=1.0, top_k=-1, seed=3, max_tokens=7),  # seed and budget do not matter
    ])
    (masked,), turns, tokens = mask_override_turns([o], loss)
    assert (turns, tokens) == (2, 4)
    assert masked.rows[0].loss_mask == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert masked.rows[0].token_ids == o.rows[0].token_ids and masked.result.reward == 1.0
    assert sum(o.rows[0].loss_mask) == 8  # the recorded rollout is not changed
    (same,), none, _ = mask_override_turns([_outcome([SamplingParams(temperature=1.0)])], loss)
    assert none == 0 and same.rows[0].loss_mask == [0, 0, 1, 1]


def test_the_loss_settings_come_from_the_algorithm_node() -> None:
    algo = SimpleNamespace(temperature=0.7, loss_config={"top_k": 0, "top_p": 0.95})
    assert loss_sampling(algo) == LossSampling(temperature=0.7, top_p=0.95, top_k=-1)
    assert LossSampling(0.7, 0.95, -1).matches(SamplingParams(temperature=0.7, top_p=0.95))
    assert not LossSampling(0.7, 0.95, -1).matches(SamplingParams(temperature=0.7, top_p=0.95, top_k=40))


def test_each_policys_turns_are_compared_with_its_own_loss_sampling() -> None:
    """Policies sampling apart (``policies.<name>.temperature``): a turn is context only when it
    differs from what its own policy's loss assumes."""
    from dataclasses import replace

    def of(policy: str, temperature: float) -> RolloutOutcome:
        o = _outcome([SamplingParams(temperature=temperature)])
        row = o.rows[0]
        return replace(o, rows=[replace(row, turns=[replace(t, policy=policy) for t in row.turns])])

    losses = {"up": LossSampling(temperature=0.5), "down": LossSampling(temperature=1.0)}
    outcomes = [of("up", 0.5), of("down", 1.0), of("down", 0.5), of("up", 1.0)]
    masked, turns, tokens = mask_override_turns(outcomes, losses)
    assert (turns, tokens) == (2, 4)
    assert [sum(o.rows[0].loss_mask) for o in masked] == [2, 2, 0, 0]
