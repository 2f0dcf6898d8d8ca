"""Turn integrity: per-call seeds for concurrent turns, and aborted generations.

The samplers here are scripted (the model is the one thing a test cannot
script); they reflect what the gateway sent them (the seed) or return what a
real engine returns when it aborts a request (``finish_reason`` ``abort`` with
the tokens generated so far).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anthropic
import openai
import pytest

from core.gateway import Gateway, GatewayConfig
from core.gateway.messages import openai_units
from core.gateway.sampling import turn_seed
from core.gateway.turn import TurnRequest
from core.samplers import ScriptedSampler, encode_reply
from core.samplers.scripted import SamplerCall
from core.types import FinishReason, SampleResult, SamplingParams
from tests.gateway.conftest import Harness


class SeedEcho(ScriptedSampler):
    """Answers ``seed <n>``: the sample is a function of the seed it was sent, as a model's is."""

    async def sample(self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str) -> SampleResult:
        self.calls.append(SamplerCall(tuple(prompt_token_ids), params, session_id))
        await asyncio.sleep(0.01)  # the other requests start meanwhile: the turns really overlap
        ids = encode_reply(self.tokenizer, f"seed {params.seed}")
        return SampleResult(ids, [-0.5] * len(ids), FinishReason.STOP, 0)


def _generated(row: Any) -> list[int]:
    return [t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m]


async def _concurrent_session(gw: Gateway, n: int) -> list[list[int]]:
    sid = gw.create_session(sampling=SamplingParams(max_tokens=32, seed=7))
    req = [{"role": "user", "content": "pick a number"}]
    await asyncio.gather(*(gw.run_turn(sid, TurnRequest(units=openai_units(req))) for _ in range(n)))
    return [_generated(r) for r in gw.finish_session(sid)]


def test_concurrent_turns_of_a_seeded_session_get_distinct_seeds_and_rerun_reproduces(byte_tokenizer: Any) -> None:
    sampler = SeedEcho(tokenizer=byte_tokenizer)
    gw = Gateway(tokenizer=byte_tokenizer, sampler=sampler, config=GatewayConfig(history_mode="tree"))
    first = asyncio.run(_concurrent_session(gw, 4))
    seeds = [c.params.seed for c in sampler.calls]
    assert seeds == [7, turn_seed(7, 1), turn_seed(7, 2), turn_seed(7, 3)]
    assert len(set(seeds)) == 4
    assert len(first) == 4 and len({tuple(r) for r in first}) == 4  # four distinct samples
    # The same seeded session run again yields the same samples (reproducible runs).
    again = asyncio.run(_concurrent_session(gw, 4))
    assert again == first
    assert [c.params.seed for c in sampler.calls[4:]] == seeds


def test_sequential_turns_keep_their_seeds(harness: Harness) -> None:
    """Turn i of a sequential seeded session is still seeded ``turn_seed(seed, i)``."""
    h = harness
    h.push("a", "b", "c")
    sid = h.session(sampling=SamplingParams(max_tokens=16, seed=3))
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(3):
        out = client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": out.choices[0].message.content},
                     {"role": "user", "content": "more"}]
    assert [c.params.seed for c in h.sampler.calls] == [3, turn_seed(3, 1), turn_seed(3, 2)]


class Aborting(ScriptedSampler):
    """A scripted engine that aborts the calls whose index is in ``abort_calls``,
    returning the tokens it had generated so far (as vLLM/SGLang do)."""

    def __init__(self, *a: Any, abort_calls: set[int], **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.abort_calls = abort_calls

    async def sample(self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str) -> SampleResult:
        index = len(self.calls)
        result = await super().sample(prompt_token_ids, params, session_id=session_id)
        if index in self.abort_calls:
            ids = result.token_ids[:3]  # cut mid-turn, no end-of-turn token
            return SampleResult(ids, result.logprobs[:3], FinishReason.ABORT, result.weight_version)
        return result


def _aborting_harness(make_harness: Any, byte_tokenizer: Any, abort_calls: set[int]) -> Harness:
    sampler = Aborting(tokenizer=byte_tokenizer, abort_calls=abort_calls)
    h: Harness = make_harness(sampler=sampler)
    return h


def test_aborted_turn_is_a_503_never_a_stop_and_is_not_trained(make_harness: Any, byte_tokenizer: Any) -> None:
    h = _aborting_harness(make_harness, byte_tokenizer, abort_calls={1, 2})
    h.push("first answer", "ABORTED-TEXT-1", "ABORTED-TEXT-2", "second answer")
    sid = h.session()
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q1"}]
    a1 = client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    messages += [{"role": "assistant", "content": a1.choices[0].message.content}, {"role": "user", "content": "q2"}]
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    assert err.value.status_code == 503
    assert err.value.code == "generation_aborted" and "aborted" in err.value.message
    with pytest.raises(openai.APIStatusError) as err:  # streaming: a plain 503 before any chunk
        list(client.chat.completions.create(model="tiny", messages=messages, stream=True))  # type: ignore[arg-type]
    assert err.value.status_code == 503 and err.value.code == "generation_aborted"
    # The agent retries; the retry is a fresh turn that extends what it was served.
    a2 = client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    assert a2.choices[0].message.content == "second answer" and a2.choices[0].finish_reason == "stop"
    (row,) = h.call(h.gw.finish_session, sid)
    row.validate()
    text = h.tok.decode(row.token_ids)
    assert "ABORT" not in text  # neither trained nor left as context
    assert [h.tok.decode(row.token_ids[s.start : s.end]) for s in row.turns] == [
        "first answer<|im_end|>",
        "second answer<|im_end|>",
    ]
    assert all(s.finish_reason is FinishReason.STOP for s in row.turns)
    # The row is exactly the conversation the agent saw, rendered by the template.
    full = h.tok.apply_chat_template([*messages, {"role": "assistant", "content": "second answer"}], tokenize=False)
    assert row.token_ids == list(h.tok.encode(full, add_special_tokens=False))[: len(row.token_ids)]
    meta = row.metadata
    assert meta["aborted_turns"] == 2
    assert (meta["sampler_errors"], meta["disconnected_turns"], meta["in_flight_at_finish"]) == (0, 0, 0)


def test_aborted_turn_in_the_anthropic_dialect_is_an_error(make_harness: Any, byte_tokenizer: Any) -> None:
    h = _aborting_harness(make_harness, byte_tokenizer, abort_calls={0, 1})
    h.push("ABORTED-A", "ABORTED-B", "fine")
    sid = h.session()
    client = h.anthropic(sid)
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="tiny", max_tokens=32, messages=msgs)
    assert err.value.status_code == 503 and "aborted" in str(err.value)
    with pytest.raises(anthropic.APIStatusError) as err:
        with client.messages.stream(model="tiny", max_tokens=32, messages=msgs) as stream:
            list(stream)
    assert err.value.status_code == 503
    out = client.messages.create(model="tiny", max_tokens=32, messages=msgs)
    assert out.stop_reason == "end_turn" and out.content[0].text == "fine"  # type: ignore[union-attr]
    (row,) = h.call(h.gw.finish_session, sid)
    assert row.metadata["aborted_turns"] == 2 and len(row.turns) == 1
    assert "ABORT" not in h.tok.decode(row.token_ids)


def test_rows_carry_every_broken_turn_counter(harness: Harness) -> None:
    """The training loop reads these keys from ``TraceRecord.metadata`` to drop broken rollouts."""
    harness.push("ok")
    sid = harness.session()
    harness.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    (row,) = harness.call(harness.gw.finish_session, sid)
    for key in ("sampler_errors", "disconnected_turns", "in_flight_at_finish", "aborted_turns"):
        assert row.metadata[key] == 0, key
