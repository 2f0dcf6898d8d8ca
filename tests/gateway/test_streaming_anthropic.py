"""Streaming (OpenAI SSE) and the Anthropic dialect with the official SDKs over real HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from core.types import SamplingParams
from tests.gateway.conftest import CALC_TOOL, Harness

ANTH_TOOL = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": CALC_TOOL["function"]["parameters"],  # type: ignore[index]
}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'


def test_openai_stream_sync_with_tool_call_and_usage(harness: Harness) -> None:
    h = harness
    long_text = "word " * 40
    h.push(CALL, long_text)
    sid = h.session(sampling=SamplingParams(max_tokens=512))
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=messages, tools=[CALC_TOOL], stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "calculator"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    messages.append(
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": calls[0].id, "type": "function",
                         "function": {"name": "calculator", "arguments": calls[0].function.arguments}}]}
    )
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "4"})
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="tiny", messages=messages, tools=[CALC_TOOL], stream=True)
        if c.choices
    )
    assert text == long_text
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 1 and len(rows[0].turns) == 2  # streamed turns are recorded and stay linear


def test_openai_stream_async(harness: Harness) -> None:
    h = harness
    h.push("streamed")
    sid = h.session()

    async def main() -> str:
        client = openai.AsyncOpenAI(base_url=h.server.base_url, api_key=sid, max_retries=0)
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], stream=True
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await client.close()
        return "".join(parts)

    assert asyncio.run(main()) == "streamed"


@pytest.mark.parametrize("suffix", ["", "/v1"])
def test_anthropic_tool_loop_both_base_urls(harness: Harness, suffix: str) -> None:
    h = harness
    h.push(CALL, "It is 4.")
    sid = h.session()
    client = h.anthropic(sid, base_url=h.server.root_url + suffix)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
    first = client.messages.create(model="tiny", max_tokens=64, system="Be exact.", messages=msgs, tools=[ANTH_TOOL])
    assert first.stop_reason == "tool_use"
    (block,) = first.content
    assert block.type == "tool_use" and block.input == {"expression": "2+2"}
    msgs.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "4"}]})
    second = client.messages.create(model="tiny", max_tokens=64, system="Be exact.", messages=msgs, tools=[ANTH_TOOL])
    assert second.stop_reason == "end_turn" and second.content[0].text == "It is 4."  # type: ignore[union-attr]
    (row,) = h.call(h.gw.finish_session, sid)
    assert len(row.turns) == 2 and row.metadata["forks"] == 0
    # Same conversation in OpenAI form renders to the same tokens: the row is exact.
    oa = [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}}]},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
    ]
    text = h.tok.apply_chat_template(oa, tools=[CALC_TOOL], tokenize=False)
    full = h.tok.encode(text, add_special_tokens=False)
    assert row.token_ids == full[: len(row.token_ids)]


def test_anthropic_stream_sync_and_async(harness: Harness) -> None:
    h = harness
    h.push(CALL, "Four.")
    sid = h.session()
    client = h.anthropic(sid)
    with client.messages.stream(
        model="tiny", max_tokens=64, messages=[{"role": "user", "content": "2+2?"}], tools=[ANTH_TOOL]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == {"expression": "2+2"}

    async def main() -> str:
        ac = anthropic.AsyncAnthropic(base_url=h.server.root_url, api_key=sid, max_retries=0)
        msgs = [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": [b.model_dump() for b in final.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": final.content[0].id, "content": "4"}]},
        ]
        out = ""
        async with ac.messages.stream(model="tiny", max_tokens=64, messages=msgs, tools=[ANTH_TOOL]) as s:
            async for text in s.text_stream:
                out += text
        await ac.close()
        return out

    assert asyncio.run(main()) == "Four."
    (row,) = h.call(h.gw.finish_session, sid)
    assert len(row.turns) == 2


def test_anthropic_count_tokens_is_real(harness: Harness) -> None:
    h = harness
    sid = h.session()
    msgs = [{"role": "user", "content": "How many tokens is this?"}]
    got = h.anthropic(sid).messages.count_tokens(model="tiny", messages=msgs, system="sys", tools=[ANTH_TOOL])
    text = h.tok.apply_chat_template(
        [{"role": "system", "content": "sys"}, *msgs], tools=[CALC_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert got.input_tokens == len(h.tok.encode(text, add_special_tokens=False)) > 50


def test_anthropic_errors_use_anthropic_envelope(harness: Harness) -> None:
    h = harness
    with pytest.raises(anthropic.AuthenticationError) as exc:
        h.anthropic("nope").messages.create(model="tiny", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    sid = h.session(max_context_tokens=5)
    with pytest.raises(anthropic.BadRequestError) as exc2:
        h.anthropic(sid).messages.create(model="tiny", max_tokens=5, messages=[{"role": "user", "content": "x" * 40}])
    assert "prompt is too long" in str(exc2.value)


def test_stop_sequence(harness: Harness) -> None:
    h = harness
    h.push("alpha STOP beta")
    sid = h.session()
    out = h.anthropic(sid).messages.create(
        model="tiny", max_tokens=64, messages=[{"role": "user", "content": "x"}], stop_sequences=["STOP"]
    )
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == "STOP"
    assert out.content[0].text == "alpha "  # type: ignore[union-attr]


def test_client_disconnect_cancels_turn_and_records_nothing(harness: Harness) -> None:
    """A client that gives up mid-sampling: the turn is cancelled and not recorded."""
    h = harness
    h.sampler.delay_s = 2.0
    h.push("slow")
    sid = h.session()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            h.server.base_url + "/chat/completions",
            headers={"authorization": f"Bearer {sid}"},
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True},
            timeout=0.3,
        )

    def counters() -> dict[str, int]:
        return dict(h.gw.session(sid).counters)

    for _ in range(100):
        if counters()["disconnected_turns"]:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert counters()["disconnected_turns"] == 1
    assert h.gw.session(sid).turns == [] and h.gw.session(sid).in_flight == 0
    h.sampler.delay_s = 0.0
    # The cancelled sampler call never took its reply; the retry gets it.
    out = h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == "slow"
    assert json.loads(json.dumps(h.call(h.gw.finish_session, sid)[0].metadata))["disconnected_turns"] == 1
