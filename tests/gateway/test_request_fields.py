"""Request fields real clients send, honoured or refused, with the official SDKs over real HTTP.

The sampler is scripted (a model's output cannot be scripted otherwise), so
each test scripts what the model writes, e.g. a tool call although
``tool_choice`` was ``none``, and checks what the client gets and what the
trace records.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from core.gateway.app import TOOL_CHOICE_HEADER
from core.types import SamplingParams
from tests.gateway.conftest import CALC_TOOL, Harness

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ANTH_CALC = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": CALC_TOOL["function"]["parameters"],  # type: ignore[index]
}
ANTH_WEATHER = {
    "name": "weather",
    "description": "Weather in a city.",
    "input_schema": WEATHER_TOOL["function"]["parameters"],  # type: ignore[index]
}
CALC_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
WEATHER_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
USER = [{"role": "user", "content": "2+2?"}]


def _openai_400(excinfo: pytest.ExceptionInfo[openai.BadRequestError], field: str) -> None:
    err = excinfo.value.response.json()["error"]
    assert err["param"] == field and field in err["message"], err


def _anthropic_400(excinfo: pytest.ExceptionInfo[anthropic.BadRequestError], field: str) -> None:
    body = excinfo.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert field in body["error"]["message"], body


def _session_meta(h: Harness, sid: str) -> dict[str, Any]:
    """Finish ``sid``; the metadata of its last row (session counters are on every row)."""
    meta: dict[str, Any] = h.call(h.gw.finish_session, sid)[-1].metadata
    return meta


def test_openai_tool_choice_none_returns_no_call_and_flags_the_turn(harness: Harness) -> None:
    h = harness
    h.push(CALC_CALL, "4")
    sid = h.session()
    client = h.openai(sid)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, tools=[CALC_TOOL], tool_choice="none"
    )
    choice = raw.parse().choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == CALC_CALL  # what the model wrote, unparsed
    assert raw.headers[TOOL_CHOICE_HEADER] == "violated"
    # The prompt is the one `auto` renders: the tools are in it.
    assert "calculator" in h.tok.decode(h.sampler.calls[0].prompt_token_ids)
    ok = client.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, tools=[CALC_TOOL], tool_choice="none"
    )
    assert ok.parse().choices[0].message.content == "4" and TOOL_CHOICE_HEADER not in ok.headers
    meta = _session_meta(h, sid)
    assert meta["tool_choice_violations"] == 1 and meta["tool_calls_dropped"] == 1


def test_openai_named_function_keeps_only_calls_to_it(harness: Harness) -> None:
    h = harness
    h.push(WEATHER_CALL + "\n" + CALC_CALL, WEATHER_CALL)
    sid = h.session(sampling=SamplingParams(max_tokens=512))
    client = h.openai(sid)
    forced = {"type": "function", "function": {"name": "calculator"}}
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, tools=[CALC_TOOL, WEATHER_TOOL], tool_choice=forced
    )
    (call,) = raw.parse().choices[0].message.tool_calls or []
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "2+2"}
    assert raw.headers[TOOL_CHOICE_HEADER] == "violated"  # it also called a tool it was not allowed
    # Only a call to another tool: nothing is returned, the text is, flagged.
    second = client.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, tools=[CALC_TOOL, WEATHER_TOOL], tool_choice=forced
    )
    choice = second.parse().choices[0]
    assert choice.message.tool_calls is None and choice.message.content == WEATHER_CALL
    assert choice.finish_reason == "stop" and second.headers[TOOL_CHOICE_HEADER] == "violated"
    meta = _session_meta(h, sid)
    assert meta["tool_choice_violations"] == 2 and meta["tool_calls_dropped"] == 2


def test_openai_tool_choice_refusals_name_the_field(harness: Harness) -> None:
    h = harness
    client = h.openai(h.session())
    for choice in (
        {"type": "function", "function": {"name": "weather"}},  # not offered
        {"type": "custom", "custom": {"name": "x"}},
        "sometimes",
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model="tiny", messages=USER, tools=[CALC_TOOL], tool_choice=choice)  # type: ignore[arg-type]
        _openai_400(exc, "tool_choice")
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=USER, tool_choice="required")
    _openai_400(exc, "tool_choice")
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="tiny", messages=USER, tools=[CALC_TOOL], parallel_tool_calls="no"  # type: ignore[arg-type]
        )
    _openai_400(exc, "parallel_tool_calls")
    assert h.sampler.calls == []


def test_openai_required_without_a_call_is_flagged(harness: Harness) -> None:
    h = harness
    h.push("I will not call anything.", CALC_CALL)
    sid = h.session()
    client = h.openai(sid)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, tools=[CALC_TOOL], tool_choice="required"
    )
    assert raw.parse().choices[0].message.content == "I will not call anything."
    assert raw.headers[TOOL_CHOICE_HEADER] == "violated"
    ok = client.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, tools=[CALC_TOOL], tool_choice="required"
    )
    assert ok.parse().choices[0].finish_reason == "tool_calls" and TOOL_CHOICE_HEADER not in ok.headers
    rows = h.call(h.gw.finish_session, sid)
    assert sum(r.metadata["tool_choice_violated_turns"] for r in rows) == 1


def test_openai_parallel_tool_calls_false_returns_one_call(harness: Harness) -> None:
    h = harness
    two = CALC_CALL + "\n" + WEATHER_CALL
    h.push(two, two)
    sid = h.session(sampling=SamplingParams(max_tokens=512))
    client = h.openai(sid)
    resp = client.chat.completions.create(
        model="tiny", messages=USER, tools=[CALC_TOOL, WEATHER_TOOL], parallel_tool_calls=False
    )
    (call,) = resp.choices[0].message.tool_calls or []
    assert call.function.name == "calculator"
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=USER, tools=[CALC_TOOL, WEATHER_TOOL], parallel_tool_calls=False, stream=True
        )
    )
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in streamed] == ["calculator"]
    rows = h.call(h.gw.finish_session, sid)
    meta = rows[-1].metadata
    assert meta["tool_calls_dropped"] == 2 and meta["tool_choice_violations"] == 0
    # The trained tokens are what the model generated: both calls.
    assert [h.tok.decode(r.token_ids[t.start : t.end]).count("<tool_call>") for r in rows for t in r.turns] == [2, 2]


def test_anthropic_tool_choice_is_honoured(harness: Harness) -> None:
    h = harness
    two = CALC_CALL + "\n" + WEATHER_CALL
    h.push(CALC_CALL, two, two, "No tools today.")
    sid = h.session(sampling=SamplingParams(max_tokens=512))
    client = h.anthropic(sid)
    msgs: list[Any] = [{"role": "user", "content": "2+2?"}]
    tools: list[Any] = [ANTH_CALC, ANTH_WEATHER]
    none = client.messages.with_raw_response.create(
        model="tiny", max_tokens=400, messages=msgs, tools=tools, tool_choice={"type": "none"}
    )
    msg = none.parse()
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "end_turn"
    assert none.headers[TOOL_CHOICE_HEADER] == "violated"
    named = client.messages.create(
        model="tiny", max_tokens=400, messages=msgs, tools=tools, tool_choice={"type": "tool", "name": "weather"}
    )
    assert [(b.type, getattr(b, "name", None)) for b in named.content] == [("tool_use", "weather")]
    single = client.messages.create(
        model="tiny", max_tokens=400, messages=msgs, tools=tools,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert [getattr(b, "name", None) for b in single.content] == ["calculator"]
    anyone = client.messages.with_raw_response.create(
        model="tiny", max_tokens=400, messages=msgs, tools=tools, tool_choice={"type": "any"}
    )
    assert anyone.parse().stop_reason == "end_turn" and anyone.headers[TOOL_CHOICE_HEADER] == "violated"
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(
            model="tiny", max_tokens=400, messages=msgs, tools=[ANTH_CALC], tool_choice={"type": "tool", "name": "weather"}
        )
    _anthropic_400(exc, "tool_choice")
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model="tiny", max_tokens=400, messages=msgs, tool_choice={"type": "any"})
    _anthropic_400(exc, "tool_choice")
    meta = _session_meta(h, sid)
    assert meta["tool_choice_violations"] == 3  # none + a call, named + a call to another tool, any + text
    assert meta["tool_calls_dropped"] == 3
