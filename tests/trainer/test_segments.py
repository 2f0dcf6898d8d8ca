"""Interrupted turns (partial rollouts, issue #28): a turn a weight update interrupted
carries segments, each with its weight version and its behaviour logprobs, from the
sampler's result through the gateway's trace, the stored JSONL, the per-token
staleness bound and metrics, to the datum and the loss's importance weight.

The sampler here hands the gateway a scripted two-segment result (the model is the
one thing a test cannot script); the local sampler producing such results on a real
weight update is tested in ``plugins/local/tests/test_interrupt.py``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from tracerl_local.losses import parse_loss_config, token_losses

from core.gateway import Gateway, GatewayConfig
from core.gateway.messages import openai_units
from core.gateway.turn import TurnRequest
from core.rollout import RolloutOutcome
from core.rundir.traces import decode_rows, encode_rows
from core.trainer.metrics import flow_metrics
from core.trainer.pool import mask_stale_turns, oldest_version
from core.trainer.signal import build_signal
from core.types import (
    FinishReason,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SampleResult,
    SamplingParams,
    Segment,
    TraceRecord,
    TurnSpan,
)

OLD, NEW = 3, 4
"""Weight versions of the two segments: the update landed after ``SPLIT`` tokens."""
SPLIT = 3
LP_OLD, LP_NEW = -0.5, -2.0
"""Behaviour logprobs the sampler reported under each version."""


class InterruptedSampler:
    """Answers every call with a reply whose first ``SPLIT`` tokens were sampled under
    version ``OLD`` and the rest, after a weight update, under ``NEW``."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    async def sample(self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str) -> SampleResult:
        ids = [*self.tok.encode("hello there", add_special_tokens=False), self.tok.eos_token_id]
        n = len(ids)
        return SampleResult(
            token_ids=ids,
            logprobs=[LP_OLD] * SPLIT + [LP_NEW] * (n - SPLIT),
            finish_reason=FinishReason.STOP,
            weight_version=OLD,
            segments=(Segment(0, SPLIT, OLD), Segment(SPLIT, n, NEW)),
        )


def _interrupted_row(tok: Any) -> TraceRecord:
    gw = Gateway(tokenizer=tok, sampler=InterruptedSampler(tok), config=GatewayConfig())

    async def go() -> list[TraceRecord]:
        sid = gw.create_session(sampling=SamplingParams(max_tokens=64))
        await gw.run_turn(sid, TurnRequest(units=openai_units([{"role": "user", "content": "hi"}])))
        return gw.finish_session(sid)

    (row,) = asyncio.run(go())
    return row


def _outcome(row: TraceRecord) -> RolloutOutcome:
    return RolloutOutcome(
        request=RolloutRequest(rollout_id="r", group_id="g", payload={}, base_url="u", session_id="s", model_id="m"),
        result=RolloutResult(rollout_id="r", status=RolloutStatus.OK, reward=1.0),
        rows=[row],
    )


def test_the_trace_of_an_interrupted_turn_has_a_segment_per_version(byte_tokenizer: Any) -> None:
    row = _interrupted_row(byte_tokenizer)
    row.validate()
    (turn,) = row.turns
    start, end = turn.start, turn.end
    assert turn.weight_version == OLD  # the version the turn started on, its oldest
    assert turn.segments == (Segment(start, start + SPLIT, OLD), Segment(start + SPLIT, end, NEW))
    assert row.logprobs[start:end] == [LP_OLD] * SPLIT + [LP_NEW] * (end - start - SPLIT)
    versions = row.token_versions()
    assert versions[:start] == [None] * start
    assert versions[start:end] == [OLD] * SPLIT + [NEW] * (end - start - SPLIT)
    # The stored JSONL keeps them (a fifth item on the turn), and reads back the same row.
    stored = encode_rows([row])
    assert stored[0]["turns"][0][4] == [[start, start + SPLIT, OLD], [start + SPLIT, end, NEW]]
    (back,) = decode_rows(stored)
    assert back.turns == row.turns and back.token_versions() == versions


def test_the_hard_staleness_bound_and_the_metrics_read_each_segment(byte_tokenizer: Any) -> None:
    row = _interrupted_row(byte_tokenizer)
    turn = row.turns[0]
    o = _outcome(row)
    assert oldest_version([o]) == OLD
    # Trained at NEW + 1 with max_staleness_per_token=1: the OLD segment (2 steps) becomes
    # context, the NEW one (1 step) trains; the turn as a whole is not masked.
    (masked_o,), masked = mask_stale_turns([o], version=NEW + 1, max_staleness=1)
    assert masked == SPLIT
    mask = masked_o.rows[0].loss_mask
    assert mask[turn.start : turn.start + SPLIT] == [0] * SPLIT
    assert all(mask[turn.start + SPLIT : turn.end])
    n_new = turn.end - turn.start - SPLIT
    flow = flow_metrics([o], NEW + 1, {"rollouts/finished": 1}, 1.0)
    assert flow["async/token_staleness_mean"] == pytest.approx((2 * SPLIT + 1 * n_new) / (SPLIT + n_new))
    assert flow["async/token_staleness_max"] == 2
    assert flow["async/interrupted_turns"] == 1
    assert flow["async/staleness_max"] == 2  # a rollout's staleness is its oldest token's


def test_each_segments_tokens_are_weighted_against_their_own_behaviour_logprobs(byte_tokenizer: Any) -> None:
    """The datum carries each segment's behaviour logprobs on its tokens, so the loss's
    importance ratio ``pi_theta / pi_behav`` of a segment-1 token uses segment 1's logprob
    (weights ``OLD``) and of a segment-2 token segment 2's (weights ``NEW``)."""
    row = _interrupted_row(byte_tokenizer)
    turn = row.turns[0]
    signal = build_signal([_outcome(row)], normalize_std=False)
    (datum,) = signal.datums
    # Datum position t scores row token t + 1.
    old_pos = range(turn.start - 1, turn.start - 1 + SPLIT)
    new_pos = range(turn.start - 1 + SPLIT, turn.end - 1)
    assert [datum.logprobs[t] for t in old_pos] == [LP_OLD] * SPLIT
    assert [datum.logprobs[t] for t in new_pos] == [LP_NEW] * len(new_pos)
    # The trainer's logprob is -1.0 on every token; importance_sampling's gradient weight
    # per token (d loss / d logp = -weight * adv) is its ratio exp(-1 - behaviour).
    trained = [t for t, w in enumerate(datum.weights) if w]
    logp = torch.full((len(trained),), -1.0, requires_grad=True)
    old = torch.tensor([datum.logprobs[t] for t in trained])
    adv = torch.ones(len(trained))
    per_token, _ = token_losses(parse_loss_config("importance_sampling", {}), logp, old, adv)
    per_token.sum().backward()
    assert logp.grad is not None
    ratio = dict(zip(trained, (-logp.grad).tolist(), strict=True))
    for t in old_pos:
        assert ratio[t] == pytest.approx(math.exp(-1.0 - LP_OLD))
    for t in new_pos:
        assert ratio[t] == pytest.approx(math.exp(-1.0 - LP_NEW))


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ((Segment(5, 7, 3), Segment(8, 10, 4)), "must tile"),  # a gap
        ((Segment(5, 7, 4), Segment(7, 10, 3)), "first segment's weight_version 4"),
        ((Segment(5, 7, 3), Segment(7, 10, 2)), "non-decreasing"),
        ((Segment(5, 7, 3), Segment(7, 9, 4)), r"end at \d, not \d+"),
    ],
)
def test_segments_that_do_not_tile_their_turn_are_refused(segments: tuple[Segment, ...], message: str) -> None:
    row = TraceRecord(session_id="s", token_ids=[1] * 10, loss_mask=[0] * 5 + [1] * 5, logprobs=[0.0] * 10,
                      prompt_length=5, turns=[TurnSpan(5, 10, FinishReason.STOP, 3, segments)])
    with pytest.raises(ValueError, match=message):
        row.validate()
    with pytest.raises(ValueError, match=message):
        SampleResult([1] * 5, [0.0] * 5, FinishReason.STOP, 3, segments=tuple(
            Segment(g.start - 5, g.end - 5, g.weight_version) for g in segments))
