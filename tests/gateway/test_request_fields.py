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
from core.gateway.reasoning_switches import template_reasoning
from core.gateway.sampling import call_seed, turn_seed
from core.gateway.tokentext import TokenText, _byte_table
from core.samplers.scripted import fake_logprob
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


# ---------------------------------------------------------------- seed, logprobs, stream_options


def test_openai_seed_feeds_the_sampler_deterministically(harness: Harness) -> None:
    h = harness
    h.sampler.default = h.reply("ok")
    unseeded = h.openai(h.session())
    for _ in range(2):
        unseeded.chat.completions.create(model="tiny", messages=USER, seed=7)
    assert [c.params.seed for c in h.sampler.calls] == [call_seed(None, 7, 0), call_seed(None, 7, 1)] == [
        7, turn_seed(7, 1)
    ]
    # Seeded sessions (the training loop seeds each rollout's): the client seed is mixed in.
    seeds = []
    for session_seed in (100, 100, 101):
        sid = h.session(sampling=SamplingParams(max_tokens=64, seed=session_seed))
        h.openai(sid).chat.completions.create(model="tiny", messages=USER, seed=7)
        seeds.append(h.sampler.calls[-1].params.seed)
        assert h.call(h.gw.finish_session, sid)[0].metadata["turn_params"][0]["seed"] == seeds[-1]
    assert seeds[0] == seeds[1] == call_seed(100, 7, 0)
    assert len({seeds[0], seeds[2], 100, 7}) == 4
    with pytest.raises(openai.BadRequestError) as exc:
        unseeded.chat.completions.create(model="tiny", messages=USER, seed=2**64)
    _openai_400(exc, "seed")


def test_openai_logprobs_are_the_sampled_tokens(harness: Harness) -> None:
    h = harness
    text = "Four, I think."
    h.push(text, text)
    client = h.openai(h.session())
    resp = client.chat.completions.create(model="tiny", messages=USER, logprobs=True, top_logprobs=0)
    ids = h.reply(text)[:-1]  # the end-of-turn token is the turn's closer, not content
    content = (resp.choices[0].logprobs and resp.choices[0].logprobs.content) or []
    assert [e.logprob for e in content] == [fake_logprob(t, i) for i, t in enumerate(ids)]
    assert b"".join(bytes(e.bytes or []) for e in content).decode() == text
    assert "".join(e.token for e in content) == text and all(e.top_logprobs == [] for e in content)
    stream = client.chat.completions.create(model="tiny", messages=USER, logprobs=True, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    h.push(text)
    assert client.chat.completions.create(model="tiny", messages=USER).choices[0].logprobs is None
    for kw in ({"logprobs": True, "top_logprobs": 2}, {"top_logprobs": 0}):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model="tiny", messages=USER, **kw)  # type: ignore[call-overload]
        _openai_400(exc, "top_logprobs")


def test_token_bytes_survive_characters_split_across_tokens(byte_tokenizer: Any) -> None:
    """A token holding part of a UTF-8 character reports its own bytes, not U+FFFD's."""
    text = TokenText(byte_tokenizer)
    table = {v: k for k, v in _byte_table().items()}
    piece = "".join(table[b] for b in "é".encode())  # one byte-level token string per byte
    ids = [i for i in (byte_tokenizer.convert_tokens_to_ids(c) for c in piece) if i is not None]
    unk = getattr(byte_tokenizer, "unk_token_id", None)
    if len(ids) == 2 and unk not in ids:
        out = text.logprobs(ids, [-0.5, -0.25])
        assert [e.bytes for e in out] == [[0xC3], [0xA9]]
    else:  # the tiny vocabulary lacks these bytes: check the table on its own
        assert bytes(_byte_table()[c] for c in piece) == "é".encode()


def test_openai_stream_options(harness: Harness) -> None:
    h = harness
    h.sampler.default = h.reply("ok")
    client = h.openai(h.session())
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, stream=True))
    assert all(c.usage is None for c in chunks)
    chunks = list(
        client.chat.completions.create(model="tiny", messages=USER, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    for options in ({"include_usage": True, "include_everything": True}, {"include_usage": "yes"}):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(
                model="tiny", messages=USER, stream=True, stream_options=options  # type: ignore[arg-type]
            )
        _openai_400(exc, "stream_options")


# ---------------------------------------------------------------- reasoning switches, refused fields

QWEN3_LIKE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
"""A minimal template with Qwen3's thinking switch (written here, not copied from a model)."""
NO_THINK = "<think>\n\n</think>\n\n"


def test_thinking_switch_follows_the_request(make_harness: Any) -> None:
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = QWEN3_LIKE
    h = make_harness(tokenizer=tok)
    h.sampler.default = h.reply("ok")
    sid = h.session(sampling=SamplingParams(max_tokens=4096))
    anth = h.anthropic(sid)
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    anth.messages.create(model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "disabled"})
    anth.messages.create(
        model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    anth.messages.create(model="tiny", max_tokens=2048, messages=msgs)
    oai = h.openai(sid)
    oai.chat.completions.create(model="tiny", messages=msgs, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    oai.chat.completions.create(model="tiny", messages=msgs, reasoning_effort="none")  # type: ignore[arg-type]
    prompts = [h.tok.decode(c.prompt_token_ids) for c in h.sampler.calls]
    assert [p.endswith(NO_THINK) for p in prompts] == [True, False, False, True, True]
    assert all(p.endswith("<|im_start|>assistant\n" + (NO_THINK if i in (0, 3, 4) else "")) for i, p in enumerate(prompts))
    # count_tokens renders with the same switch.
    off = anth.messages.count_tokens(model="tiny", messages=msgs, thinking={"type": "disabled"}).input_tokens
    on = anth.messages.count_tokens(
        model="tiny", messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}
    ).input_tokens
    assert off - on == len(tok.encode(NO_THINK, add_special_tokens=False))
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="tiny", messages=msgs, reasoning_effort="high")  # type: ignore[arg-type]
    _openai_400(exc, "reasoning_effort")
    with pytest.raises(anthropic.BadRequestError) as aexc:
        anth.messages.create(
            model="tiny", max_tokens=1024, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    _anthropic_400(aexc, "thinking")  # the budget must be below max_tokens, as Anthropic requires


def test_thinking_on_a_template_without_reasoning_is_refused(harness: Harness) -> None:
    h = harness
    h.sampler.default = h.reply("ok")
    sid = h.session()
    anth = h.anthropic(sid)
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as exc:
        anth.messages.create(
            model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    _anthropic_400(exc, "thinking")
    with pytest.raises(anthropic.BadRequestError) as exc:
        anth.messages.count_tokens(model="tiny", messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024})
    _anthropic_400(exc, "thinking")
    # Turning off what the template never does is honoured trivially.
    assert anth.messages.create(model="tiny", max_tokens=64, messages=msgs, thinking={"type": "disabled"}).content
    with pytest.raises(openai.BadRequestError) as oexc:
        h.openai(sid).chat.completions.create(model="tiny", messages=USER, reasoning_effort="low")
    _openai_400(oexc, "reasoning_effort")


REFUSED_OPENAI = [
    ("frequency_penalty", 0.5),
    ("presence_penalty", -1),
    ("logit_bias", {"42": 5}),
    ("response_format", {"type": "json_object"}),
    ("functions", [{"name": "f", "parameters": {}}]),
    ("modalities", ["text", "audio"]),
    ("repetition_penalty", 1.2),
    ("guided_json", {"type": "object"}),
    ("chat_template_kwargs", {"tools": []}),
]


def test_openai_fields_that_cannot_be_honoured_are_400(harness: Harness) -> None:
    h = harness
    client = h.openai(h.session())
    for field, value in REFUSED_OPENAI:
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model="tiny", messages=USER, extra_body={field: value})
        _openai_400(exc, field)
    assert h.sampler.calls == []


def test_neutral_and_metadata_fields_are_accepted(harness: Harness) -> None:
    h = harness
    h.sampler.default = h.reply("ok")
    sid = h.session()
    resp = h.openai(sid).chat.completions.create(
        model="tiny", messages=USER, frequency_penalty=0, presence_penalty=0.0, logit_bias={},
        response_format={"type": "text"}, user="u1", metadata={"k": "v"}, store=False, service_tier="auto",
        modalities=["text"], extra_body={"repetition_penalty": 1.0, "prompt_cache_key": "x"},
    )
    assert resp.choices[0].message.content == "ok"
    msg = h.anthropic(sid).messages.create(
        model="tiny", max_tokens=64, messages=[{"role": "user", "content": "hi"}], metadata={"user_id": "u1"},
        service_tier="auto",
    )
    assert msg.content[0].type == "text"
    for field, value in (("mcp_servers", [{"type": "url", "url": "http://x", "name": "x"}]),
                         ("context_management", {"edits": [{"type": "clear_tool_uses_20250919"}]})):
        with pytest.raises(anthropic.BadRequestError) as exc:
            h.anthropic(sid).messages.create(
                model="tiny", max_tokens=64, messages=[{"role": "user", "content": "hi"}], extra_body={field: value}
            )
        _anthropic_400(exc, field)


def test_real_templates_reasoning_switches_are_found() -> None:
    """Qwen3, Qwen3.5/3.6, GLM-4.6/4.7, DeepSeek V3.1 and Nemotron 3 have ``enable_thinking``, Kimi
    K2.5 ``thinking``; DeepSeek R1, gpt-oss and MiniMax M2 always reason, gpt-oss takes
    ``reasoning_effort``; the others never reason."""
    from tests.gateway.families import FAMILIES, chat_template

    # the text only: loading every tokenizer takes seconds
    found = {name: template_reasoning(chat_template(name)) for name in FAMILIES}
    assert {n for n, r in found.items() if r.switch == "enable_thinking"} == {
        "qwen3", "qwen3-nothink", "glm-4.6", "glm-4.7", "deepseek-v3.1", "nemotron-3-nano",
        "qwen3.5", "qwen3.6", "qwen3.6-preserve"}
    assert {n for n, r in found.items() if r.switch == "thinking"} == {"kimi-k2.5"}
    assert {n for n, r in found.items() if r.always} == {"deepseek-r1", "gpt-oss", "minimax-m2"}
    assert {n for n, r in found.items() if r.effort} == {"gpt-oss"}


def test_qwen3_thinking_off_renders_as_apply_chat_template_does(make_harness: Any) -> None:
    """Anthropic ``thinking: disabled`` on Qwen3's real template is its ``enable_thinking=False``."""
    from tests.gateway.families import load

    tok = load("qwen3")
    h = make_harness(tokenizer=tok)
    h.sampler.default = h.reply("ok")
    sid = h.session(sampling=SamplingParams(max_tokens=4096))
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    anth = h.anthropic(sid)
    anth.messages.create(model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "disabled"})
    anth.messages.create(
        model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    for call, enable in zip(h.sampler.calls, (False, True), strict=True):
        expected = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=enable)
        assert list(call.prompt_token_ids) == tok.encode(expected, add_special_tokens=False)
    assert tok.decode(h.sampler.calls[0].prompt_token_ids).endswith(NO_THINK)


def test_deepseek_r1_cannot_turn_thinking_off(make_harness: Any) -> None:
    from tests.gateway.families import load

    h = make_harness(tokenizer=load("deepseek-r1"))
    h.sampler.default = h.reply("ok")
    anth = h.anthropic(h.session(sampling=SamplingParams(max_tokens=4096)))
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as exc:
        anth.messages.create(model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "disabled"})
    _anthropic_400(exc, "thinking")
    anth.messages.create(
        model="tiny", max_tokens=2048, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert len(h.sampler.calls) == 1


def test_tool_choice_shapes_and_enforcement() -> None:
    """The shapes the SDK tests above do not send: allowed_tools (chat and Responses forms),
    Responses' flat named function, and enforce's rules on a parse."""
    from core.gateway.errors import GatewayError
    from core.gateway.toolchoice import ToolChoice, enforce, openai_tool_choice

    tools = [CALC_TOOL, WEATHER_TOOL]
    chat = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "weather"}}]}}
    flat = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "weather"}]}
    assert openai_tool_choice({"tool_choice": chat}, tools) == ToolChoice("required", ("weather",))
    assert openai_tool_choice({"tool_choice": flat}, tools) == ToolChoice("auto", ("weather",))
    named = {"type": "function", "name": "calculator"}
    assert openai_tool_choice({"tool_choice": named, "parallel_tool_calls": False}, tools) == ToolChoice(
        "required", ("calculator",), parallel=False
    )
    with pytest.raises(GatewayError) as exc:
        openai_tool_choice({"tool_choice": {**flat, "tools": [{"type": "function", "name": "nope"}]}}, tools)
    assert exc.value.param == "tool_choice" and "'nope'" in exc.value.message
    # A hostile name or tool list is quoted cut short, not echoed whole.
    many = [{"type": "function", "function": {"name": f"t{i}" + "x" * 1000}} for i in range(100)]
    with pytest.raises(GatewayError) as exc:
        openai_tool_choice({"tool_choice": {"type": "function", "name": "n" * 100_000}}, many)
    assert exc.value.param == "tool_choice" and "'nnn" in exc.value.message and len(exc.value.message) < 2000
    from core.gateway.responses_api import parse_responses_request

    with pytest.raises(GatewayError) as exc:
        parse_responses_request({"input": "x", "include": ["i" * 100_000]}, {})
    assert exc.value.param == "include" and "'iii" in exc.value.message and len(exc.value.message) < 1000
    calc, weather = ("calculator", {"expression": "1"}), ("weather", {"city": "Oslo"})
    subset = enforce(ToolChoice("auto", ("weather",)), "pre", [calc, weather], "TEXT")
    assert (subset.calls, subset.dropped, subset.violated, subset.content) == ([weather], 1, True, "pre")
    free = enforce(ToolChoice("auto", ("weather",)), "just text", [], "just text")
    assert (free.calls, free.violated) == ([], False)
    single = enforce(ToolChoice(parallel=False), "pre", [calc, weather], "TEXT")
    assert (single.calls, single.dropped, single.violated) == ([calc], 1, False)
    forced = enforce(ToolChoice("required", ("weather",)), "pre", [calc], "TEXT")
    assert (forced.calls, forced.content, forced.violated) == ([], "TEXT", True)
