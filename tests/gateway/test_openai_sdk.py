"""The official openai SDK against the gateway over real HTTP (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from core.gateway import Gateway, GatewayConfig, GatewayServer
from core.samplers import ScriptedSampler, encode_reply
from core.samplers.scripted import fake_logprob
from core.types import FinishReason, SamplingParams
from tests.gateway.conftest import CALC_TOOL, Harness


def _render_ids(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False)
    return list(tok.encode(text, add_special_tokens=False))


def _check_mask_on_generated(h: Harness, row: Any, replies: list[list[int]]) -> None:
    """The mask is 1 exactly on the scripted replies, with their logprobs, and 0 elsewhere."""
    row.validate()
    spans = [(t.start, t.end) for t in row.turns]
    assert [row.token_ids[s:e] for s, e in spans] == replies
    expected_mask = [0] * len(row.token_ids)
    expected_lp = [0.0] * len(row.token_ids)
    for (s, e), reply in zip(spans, replies, strict=True):
        expected_mask[s:e] = [1] * (e - s)
        expected_lp[s:e] = [fake_logprob(t, i) for i, t in enumerate(reply)]
    assert row.loss_mask == expected_mask
    assert row.logprobs == expected_lp


def test_multi_turn_tool_loop_row_equals_template_rendering(harness: Harness) -> None:
    h = harness
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    replies = [h.reply(call), h.reply("The answer is 84.")]
    h.sampler.push(*replies)
    sid = h.session(metadata={"rollout_id": "r1", "group_id": "g1"})
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 12 * 7?"},
    ]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "calculator"
    assert json.loads(tc.function.arguments) == {"expression": "12 * 7"}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": tc.id, "content": "84"})
    second = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC_TOOL])
    assert second.choices[0].message.content == "The answer is 84."
    assert second.choices[0].finish_reason == "stop"
    assert second.usage is not None and second.usage.completion_tokens == len(replies[1])
    messages.append({"role": "assistant", "content": "The answer is 84."})

    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 1
    row = rows[0]
    full = _render_ids(h.tok, messages, [CALC_TOOL])
    # The row is the whole conversation as the template renders it, up to the
    # model's final <|im_end|> (the template's trailing newline was never generated).
    assert row.token_ids == full[: len(row.token_ids)]
    assert h.tok.decode(full[len(row.token_ids) :]) == "\n"
    _check_mask_on_generated(h, row, replies)
    assert row.rollout_id == "r1" and row.group_id == "g1"
    assert row.metadata["turns"] == 2 and row.metadata["forks"] == 0
    assert row.metadata["ill_formed_tool_calls"] == 0 and row.metadata["truncated"] is False
    assert row.prompt_length == row.turns[0].start
    assert [t.finish_reason for t in row.turns] == [FinishReason.STOP, FinishReason.STOP]
    # The second turn was fed the served tokens verbatim plus only the new tail.
    second_prompt = h.sampler.calls[1].prompt_token_ids
    assert list(second_prompt[: row.turns[0].end]) == row.token_ids[: row.turns[0].end]
    assert h.gw.session(sid).counters["full_renders"] == 1


def test_later_requests_after_finish_get_409_and_drop_gives_401(harness: Harness) -> None:
    h = harness
    h.push("hi")
    sid = h.session()
    client = h.openai(sid)
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
    h.call(h.gw.finish_session, sid)
    with pytest.raises(openai.ConflictError) as exc:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "again"}])
    assert "finished" in str(exc.value)
    h.call(h.gw.drop_session, sid)
    with pytest.raises(openai.AuthenticationError) as exc2:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "again"}])
    assert "unknown session" in str(exc2.value)


def test_static_key_is_refused_not_collected(harness: Harness) -> None:
    client = harness.openai("EMPTY")
    with pytest.raises(openai.AuthenticationError) as exc:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    assert harness.gw.sessions() == []


def test_session_in_path_form(harness: Harness) -> None:
    h = harness
    h.push("ok")
    sid = h.session()
    client = h.openai("ignored", base_url=f"{h.server.root_url}/sessions/{sid}/v1")
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == "ok"
    assert len(h.gw.session(sid).turns) == 1


def test_models_and_health(harness: Harness) -> None:
    models = harness.openai("any").models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_sampling_precedence_session_wins_unless_overrides_allowed(harness: Harness) -> None:
    h = harness
    h.push("a", "b")
    locked = h.session(sampling=SamplingParams(max_tokens=32, temperature=0.7))
    free = h.session(sampling=SamplingParams(max_tokens=32, temperature=0.7), allow_sampling_overrides=True)
    for sid in (locked, free):
        h.openai(sid).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], temperature=0.2, top_p=0.5, max_tokens=8
        )
    p_locked, p_free = (c.params for c in h.sampler.calls)
    assert (p_locked.temperature, p_locked.top_p, p_locked.max_tokens) == (0.7, 1.0, 8)
    assert (p_free.temperature, p_free.top_p, p_free.max_tokens) == (0.2, 0.5, 8)
    assert h.gw.session(locked).counters["sampling_overrides_ignored"] == 1
    row = h.call(h.gw.finish_session, locked)[0]
    assert row.metadata["turn_params"] == [{"max_tokens": 8, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "seed": None}]


def test_max_tokens_cuts_and_marks_truncated(harness: Harness) -> None:
    h = harness
    h.push("a long answer that will not fit")
    sid = h.session()
    out = h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert out.choices[0].finish_reason == "length"
    row = h.call(h.gw.finish_session, sid)[0]
    assert row.num_generated == 3 and row.metadata["truncated"] is True


def test_context_length_exceeded(harness: Harness) -> None:
    h = harness
    sid = h.session(max_context_tokens=10)
    with pytest.raises(openai.BadRequestError) as exc:
        h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 50}])
    assert exc.value.code == "context_length_exceeded"
    assert "maximum context length is 10 tokens" in str(exc.value)
    assert "the limit of 10 is gateway.max_context_tokens" in str(exc.value)  # what to change


def test_the_models_own_context_is_a_400_naming_its_setting(harness: Harness) -> None:
    """A prompt within the gateway's budget but past the model's context (the tiny model's
    backend.tiny.max_position_embeddings) is the caller's to fix: a 400 saying which setting,
    not a retryable 503 sampler failure."""
    import pickle

    from core.errors import ContextLengthError

    err = ContextLengthError("m", prompt_tokens=7, context=5, setting="s")
    copy = pickle.loads(pickle.dumps(err))  # it may cross a process boundary (a remote sampler)
    assert (str(copy), copy.prompt_tokens, copy.context, copy.setting) == ("m", 7, 5, "s")

    class ShortContext:
        weight_version = 0

        async def sample(self, prompt: list[int], params: SamplingParams, *, session_id: str = "") -> None:
            raise ContextLengthError(
                "too long", prompt_tokens=len(prompt), context=5, setting="backend.tiny.max_position_embeddings"
            )

    h = harness
    h.call(h.gw.set_sampler, ShortContext())
    sid = h.session()
    with pytest.raises(openai.BadRequestError) as exc:
        h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 20}])
    assert exc.value.code == "context_length_exceeded"
    assert "maximum context length is 5 tokens" in str(exc.value)
    assert "the limit of 5 is backend.tiny.max_position_embeddings" in str(exc.value)
    counters = h.gw.session(sid).counters
    assert counters["context_length_exceeded"] == 1 and counters["sampler_errors"] == 0


def test_async_client_in_process_server() -> None:
    """The lead's usage: GatewayServer inside the caller's loop, AsyncOpenAI against it."""
    from core.tokenizer import build_tiny_tokenizer

    async def main() -> None:
        tok = build_tiny_tokenizer()
        sampler = ScriptedSampler(default=encode_reply(tok, "7"), tokenizer=tok)
        gw = Gateway(tokenizer=tok, sampler=sampler, config=GatewayConfig(), model_id="tiny")
        sids = [
            gw.create_session(sampling=SamplingParams(max_tokens=8), metadata={"rollout_id": f"r{i}"}) for i in range(8)
        ]
        server = GatewayServer(gw, host="127.0.0.1", port=0)
        await server.start()
        try:
            assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")

            async def one(sid: str) -> str:
                client = openai.AsyncOpenAI(base_url=server.base_url, api_key=sid, max_retries=0)
                out = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "6+1"}])
                await client.close()
                return out.choices[0].message.content or ""

            assert await asyncio.gather(*(one(s) for s in sids)) == ["7"] * 8
        finally:
            await server.stop()
        rows = [gw.finish_session(s) for s in sids]
        assert [r[0].rollout_id for r in rows] == [f"r{i}" for i in range(8)]
        assert all(r[0].num_generated == 2 for r in rows)

    asyncio.run(main())
