"""Unit tier: the agent loop and the sampler adapter, with a fake LLMServerClient.

The fake stands in for verl's Ray client to a GPU inference engine (a network
edge we cannot reach here) and returns real ``TokenOutput`` objects. Everything
else is real: the gateway and its HTTP server, the local runtime with agent
processes using the openai SDK, verl's ``AgentLoopOutput``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tracerl_verl.agent_loop import RolloutFailed, WorkerHost
from tracerl_verl.rows import order_rows, split_row
from tracerl_verl.sampler import VerlSampler, infer_finish_reason, verl_sampling_params
from verl_fixtures import FakeLLMServerClient, close, expected_logprobs, make_loop
from verl_test_agents import score

from core.errors import SamplerError
from core.types import FinishReason, SamplingParams, TraceRecord, TurnSpan

SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "repetition_penalty": 1.0,
    "logprobs": True,
}


def _row_kwargs(payload: dict[str, Any], uid: str = "u0") -> dict[str, Any]:
    return {
        "tracerl_payload": json.dumps(payload),
        "uid": uid,
        "global_steps": 3,
        "session_id": 0,
        "index": 0,
    }


def _run(host_loop: Any, client: Any, tokenizer: Any, payload: dict[str, Any]) -> list[Any]:
    """Build the loop and run it inside the worker's loop, as verl's AgentLoopWorker does."""
    loop, path = host_loop

    async def go() -> list[Any]:
        agent_loop = make_loop(tokenizer, client, path)
        return await agent_loop.run(dict(SAMPLING), **_row_kwargs(payload))  # type: ignore[no-any-return]

    return loop.run_until_complete(go())


def test_two_turn_rollout_masks_and_logprobs_align(host_loop: Any, tiny_tokenizer: Any) -> None:
    client = FakeLLMServerClient(tiny_tokenizer, text="aa")
    outputs = _run(host_loop, client, tiny_tokenizer, {"mode": "two_turn"})

    assert len(outputs) == 1
    out = outputs[0]
    reply = client.reply_ids()
    assert len(client.calls) == 2
    # the sticky key is the gateway session id, the same for both turns
    assert client.calls[0]["request_id"] == client.calls[1]["request_id"]
    first_prompt = client.calls[0]["prompt_ids"]
    second_prompt = client.calls[1]["prompt_ids"]
    # prompt = exactly what the model read on turn 1
    assert out.prompt_ids == first_prompt
    # response = turn 1, the tool/user tokens, turn 2; masks 1 only on generated tokens
    assert second_prompt[: len(first_prompt)] == first_prompt
    assert second_prompt[len(first_prompt) : len(first_prompt) + len(reply)] == reply
    observation = second_prompt[len(first_prompt) + len(reply) :]
    assert out.response_ids == reply + observation + reply
    assert out.response_mask == [1] * len(reply) + [0] * len(observation) + [1] * len(reply)
    lp = expected_logprobs(len(reply))
    assert close(out.response_logprobs, lp + [0.0] * len(observation) + lp)
    # reward from the agent, set on the row itself
    assert out.reward_score == pytest.approx(score("aa"))
    assert out.extra_fields["min_global_steps"] == 3
    assert out.extra_fields["max_global_steps"] == 3
    assert "reward_extra_info" in out.extra_fields
    # verl can turn it into its tensors (rm_scores at the last response token)
    d = out.as_dict()
    assert d["rm_scores"][-1].item() == pytest.approx(score("aa"))
    assert d["rollout_log_probs"].shape == d["responses"].shape
    # per-turn sampling settings reached verl's server in the keys it accepts
    sp = client.calls[0]["sampling_params"]
    assert sp["max_tokens"] == 6 and sp["logprobs"] is True and sp["repetition_penalty"] == 1.0


def test_forked_rollout_puts_most_trained_row_last(host_loop: Any, tiny_tokenizer: Any) -> None:
    client = FakeLLMServerClient(tiny_tokenizer, text="a")
    outputs = _run(host_loop, client, tiny_tokenizer, {"mode": "fork"})

    assert len(client.calls) == 3
    assert len(outputs) == 2
    trained = [sum(o.response_mask) for o in outputs]
    assert trained[0] < trained[1]
    assert all(o.reward_score == pytest.approx(score("a")) for o in outputs)
    assert all(o.extra_fields["min_global_steps"] == 3 for o in outputs)
    # the forked row starts from the third call's prompt
    assert outputs[0].prompt_ids == client.calls[2]["prompt_ids"]


def test_crashed_rollout_raises_so_verl_drops_it_from_the_group(
    host_loop: Any, tiny_tokenizer: Any
) -> None:
    client = FakeLLMServerClient(tiny_tokenizer)
    with pytest.raises(RolloutFailed, match="crashed") as info:
        _run(host_loop, client, tiny_tokenizer, {"mode": "crash"})
    assert info.value.status == "crashed"


def test_rollout_without_a_model_call_is_a_failure_not_a_reward(
    host_loop: Any, tiny_tokenizer: Any
) -> None:
    client = FakeLLMServerClient(tiny_tokenizer)
    with pytest.raises(RolloutFailed, match="no_model_calls|no trainable model call") as info:
        _run(host_loop, client, tiny_tokenizer, {"mode": "no_call"})
    assert info.value.status == "no_model_calls"
    assert client.calls == []


def test_rollout_whose_model_call_failed_is_dropped_even_when_the_agent_says_ok(
    host_loop: Any, tiny_tokenizer: Any
) -> None:
    """The engine aborts the call (the gateway answers 503); the agent swallows the
    error and returns reward 1.0. verl must not get that reward: the runner marks the
    rollout ``sampler_error`` and the loop raises."""
    client = FakeLLMServerClient(tiny_tokenizer, stop_reason="aborted")
    with pytest.raises(RolloutFailed) as info:
        _run(host_loop, client, tiny_tokenizer, {"mode": "swallow"})
    assert len(client.calls) == 1
    assert info.value.status == "sampler_error"


def test_missing_logprobs_are_not_passed_off_as_zeros(host_loop: Any, tiny_tokenizer: Any) -> None:
    client = FakeLLMServerClient(tiny_tokenizer, with_logprobs=False, global_steps=None)
    outputs = _run(host_loop, client, tiny_tokenizer, {"mode": "two_turn"})
    assert outputs[-1].response_logprobs is None
    # no global_steps from the server: the row's own global_steps (3) stand in
    assert outputs[-1].extra_fields["min_global_steps"] == 3


def test_one_gateway_per_worker_process(host_loop: Any, tiny_tokenizer: Any) -> None:
    client = FakeLLMServerClient(tiny_tokenizer)
    loop, path = host_loop

    async def get() -> Any:
        return await WorkerHost.get(make_loop(tiny_tokenizer, client, path))

    first = loop.run_until_complete(get())
    second = loop.run_until_complete(get())
    assert first is second
    assert first.server.base_url.endswith("/v1")
    assert first.sampler.client is client


# ---------------------------------------------------------------- pure helpers


def test_finish_reason_inference() -> None:
    p = SamplingParams(max_tokens=3)
    eos = frozenset([9])
    assert infer_finish_reason("completed", [1, 2, 3], p, eos) is FinishReason.LENGTH
    assert infer_finish_reason("completed", [1, 2, 9], p, eos) is FinishReason.STOP
    assert infer_finish_reason("completed", [1, 9], p, eos) is FinishReason.STOP
    assert infer_finish_reason("length", [1], p, eos) is FinishReason.LENGTH
    assert infer_finish_reason("stop", [1, 2, 3], p, eos) is FinishReason.STOP
    with pytest.raises(SamplerError, match="aborted"):
        infer_finish_reason("aborted", [], p, eos)


def test_sampling_params_only_send_keys_servers_accept() -> None:
    p = SamplingParams(max_tokens=5, temperature=0.7, stop=("x",), stop_token_ids=(4,), seed=1)
    vllm = verl_sampling_params(p, "vllm")
    sglang = verl_sampling_params(p, "sglang")
    assert vllm == {
        "max_tokens": 5,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": True,
        "stop": ["x"],
        "stop_token_ids": [4],
        "seed": 1,
    }
    assert "seed" not in sglang


def test_sampler_weight_version_and_session_steps(tiny_tokenizer: Any) -> None:
    import asyncio

    client = FakeLLMServerClient(tiny_tokenizer, text="a", global_steps=5)
    sampler = VerlSampler(
        client, rollout_name="vllm", stop_ids=frozenset([tiny_tokenizer.eos_token_id])
    )

    async def go() -> Any:
        r1 = await sampler.sample([1, 2], SamplingParams(max_tokens=4), session_id="s1")
        client.global_steps = 6
        r2 = await sampler.sample([1, 2], SamplingParams(max_tokens=4), session_id="s1")
        return r1, r2

    r1, r2 = asyncio.run(go())
    assert (r1.weight_version, r2.weight_version) == (5, 6)
    assert r1.finish_reason is FinishReason.STOP
    steps = sampler.forget("s1")
    assert steps is not None and (steps.min_global_steps, steps.max_global_steps) == (5, 6)
    assert sampler.steps_for("s1") is None


def test_sampler_rejects_aborted_and_overlong_outputs(tiny_tokenizer: Any) -> None:
    import asyncio

    sampler = VerlSampler(
        FakeLLMServerClient(tiny_tokenizer, stop_reason="aborted"),
        rollout_name="vllm",
        stop_ids=frozenset(),
    )
    with pytest.raises(SamplerError, match="aborted"):
        asyncio.run(sampler.sample([1], SamplingParams(max_tokens=4), session_id="s"))


def _record(prompt: int, gen: list[int], tail: int = 0) -> TraceRecord:
    ids = list(range(prompt + len(gen) + tail))
    mask = [0] * prompt + gen + [0] * tail
    return TraceRecord(
        session_id="s",
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        prompt_length=prompt,
        turns=[TurnSpan(prompt, prompt + len(gen), FinishReason.STOP, 0)],
    )


def test_split_moves_prompt_overflow_into_the_masked_response() -> None:
    row = split_row(_record(10, [1, 1, 1]), prompt_length=8, response_length=100)
    assert row.prompt_ids == list(range(8))
    assert row.response_ids == list(range(8, 13))
    assert row.response_mask == [0, 0, 1, 1, 1]
    assert row.response_logprobs == [0.0, 0.0, -0.5, -0.5, -0.5]
    assert not row.truncated


def test_split_truncates_long_responses_and_order_drops_untrained_rows() -> None:
    row = split_row(_record(4, [1, 1, 1, 1], tail=3), prompt_length=8, response_length=5)
    assert row.response_ids == [4, 5, 6, 7, 8] and row.truncated
    empty = split_row(_record(4, [], tail=2), prompt_length=8, response_length=5)
    small = split_row(_record(4, [1]), prompt_length=8, response_length=5)
    ordered = order_rows([row, empty, small])
    assert [r.trained_tokens for r in ordered] == [1, 4]
