"""Reasoning split off generated turns, returned in each dialect and taken back; DeepSeek V3 tool calls."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ConfigError
from core.gateway import GatewayConfig
from core.gateway.errors import GatewayError
from core.gateway.harmony import parse_harmony, split_harmony
from core.gateway.messages import anthropic_units, openai_units
from core.gateway.reasoning_parsers import (
    get_reasoning_parser,
    prompt_closes_think,
    prompt_opens_think,
    split_think,
)
from core.gateway.toolparse import detect_parser, parse_deepseek_v3
from core.samplers import ScriptedSampler
from core.tokenizer import CHATML_TOOLS_TEMPLATE, build_tiny_tokenizer
from tests.gateway.conftest import Harness


@pytest.mark.parametrize(
    ("text", "opened", "expected"),
    [
        ("<think>\nplan\n</think>\n\nanswer", False, ("plan", "answer")),
        ("<think>\nplan\n</think>\n\nanswer", True, ("plan", "answer")),
        ("plan\n</think>\n\nanswer", True, ("plan", "answer")),  # <think> was in the generation prompt (R1)
        # No block was open (Qwen3 hybrid, thinking off): a stray </think> is text the model wrote.
        ("plan\n</think>\n\nanswer", False, ("", "plan\n</think>\n\nanswer")),
        ("<think>\n\n</think>\n\nanswer", False, ("", "answer")),
        ("<think>\ncut off mid-thought", False, ("cut off mid-thought", "")),
        ("\ncut off mid-thought", True, ("cut off mid-thought", "")),  # R1, cut off before </think>
        ("no reasoning here", False, ("", "no reasoning here")),
        ("text first <think>x</think> y", False, ("", "text first <think>x</think> y")),
    ],
)
def test_split_think(text: str, opened: bool, expected: tuple[str, str]) -> None:
    assert split_think(text, opened) == expected


def test_prompt_opens_think() -> None:
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking switched off
    assert not prompt_opens_think("<|im_start|>assistant\n")


def test_prompt_closes_think() -> None:
    assert prompt_closes_think("<|assistant|>\n<think></think>")  # GLM-4.6, enable_thinking=false
    assert not prompt_closes_think("<|assistant|>")
    assert not prompt_closes_think("<|im_start|>assistant\n<think>\n")


R1_LIKE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if open_think is defined and open_think %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
    "{#- </think> -#}"
)
"""A minimal template that opens the reasoning block in its generation prompt when asked
(as DeepSeek R1 and Qwen3 Thinking-2507 do), written here."""


def test_a_stray_close_tag_splits_only_where_the_prompt_opened_the_block(make_harness: Any) -> None:
    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320, chat_template=R1_LIKE)
    h: Harness = make_harness(tokenizer=tok)
    assert h.gw.reasoning_parser_name == "think"
    text = "plan\n</think>\n\nanswer"
    h.push(text, text)
    client = h.openai(h.session())
    opened = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "q"}], extra_body={"chat_template_kwargs": {"open_think": True}}
    ).choices[0].message
    assert (opened.content, getattr(opened, "reasoning_content", None)) == ("answer", "plan")
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}]).choices[0].message
    assert plain.content == text and getattr(plain, "reasoning_content", None) is None


def test_reasoning_parser_is_detected_from_the_template_and_can_be_set() -> None:
    assert get_reasoning_parser("auto", "{{ '</think>' }}")[0] == "think"
    assert get_reasoning_parser("auto", CHATML_TOOLS_TEMPLATE) == (None, None)
    assert get_reasoning_parser("think", "")[0] == "think"
    assert get_reasoning_parser("none", "</think>") == (None, None)
    with pytest.raises(ConfigError, match="unknown gateway.reasoning_parser 'r1'"):
        get_reasoning_parser("r1", "")


DS_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"e\": \"1+1\"}\n```"
    "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>clock\n```json\n{}\n```<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>"
)


def test_deepseek_v3_calls_parse_and_broken_ones_are_ill_formed() -> None:
    out = parse_deepseek_v3("Checking." + DS_CALL)
    assert out.content == "Checking." and out.tool_calls == [("calc", {"e": "1+1"}), ("clock", {})]
    assert parse_deepseek_v3("plain").tool_calls == [] and not parse_deepseek_v3("plain").ill_formed
    for broken in (
        DS_CALL[: -len("<｜tool▁calls▁end｜>")],  # unterminated
        DS_CALL.replace('{"e": "1+1"}', "{e: }"),  # not JSON
        DS_CALL.replace("function<｜tool▁sep｜>calc", "builtin<｜tool▁sep｜>calc"),
        DS_CALL + " trailing",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>x\n```json\n{}\n```<｜tool▁call▁end｜>",  # no block
    ):
        out = parse_deepseek_v3(broken)
        assert out.ill_formed and out.content == broken and out.error
    assert detect_parser("{{'<｜tool▁calls▁begin｜>'}}") == "deepseek_v3"


def test_reasoning_sent_back_becomes_reasoning_content() -> None:
    openai = openai_units([{"role": "assistant", "content": "a", "reasoning_content": "r"}])
    assert openai[0].canon() == [{"role": "assistant", "content": "a", "reasoning_content": "r"}]
    assert openai_units([{"role": "assistant", "content": "a", "reasoning": "r"}])[0].canon()[0]["reasoning_content"] == "r"
    with pytest.raises(GatewayError, match=r"messages\[0\].reasoning_content must be a string"):
        openai_units([{"role": "assistant", "content": "a", "reasoning_content": 3}])[0].canon()
    blocks = [{"type": "thinking", "thinking": "r", "signature": "s"}, {"type": "redacted_thinking", "data": "x"},
              {"type": "text", "text": "a"}]
    anthropic = anthropic_units(None, [{"role": "assistant", "content": blocks}])
    assert anthropic[0].canon() == [{"role": "assistant", "content": "a", "reasoning_content": "r"}]


THINK_TEMPLATE = CHATML_TOOLS_TEMPLATE + "{#- reasoning: <think></think> -#}"


@pytest.fixture
def thinking(make_harness: Any) -> Harness:
    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320, chat_template=THINK_TEMPLATE)
    return make_harness(tokenizer=tok, sampler=ScriptedSampler(tokenizer=tok), config=GatewayConfig())


def test_openai_returns_reasoning_content_streamed_or_not(thinking: Harness) -> None:
    h = thinking
    h.push("<think>\nweigh it\n</think>\n\nYes.", "<think>\nagain\n</think>\n\nNo.")
    client = h.openai(h.session())
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}])
    message = out.choices[0].message
    assert message.content == "Yes." and message.reasoning_content == "weigh it"  # type: ignore[attr-defined]
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}], stream=True))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "again"
    assert "".join(d.get("content") or "" for d in deltas) == "No."


def test_anthropic_returns_thinking_blocks_streamed_or_not(thinking: Harness) -> None:
    h = thinking
    h.push("<think>\nweigh it\n</think>\n\nYes.", "<think>\nagain\n</think>\n\nNo.")
    client = h.anthropic(h.session())
    msg = client.messages.create(model="tiny", max_tokens=64, messages=[{"role": "user", "content": "q"}])
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "weigh it" and msg.content[1].text == "Yes."  # type: ignore[union-attr]
    with client.messages.stream(model="tiny", max_tokens=64, messages=[{"role": "user", "content": "q"}]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "again" and final.content[1].text == "No."  # type: ignore[union-attr]


def test_trained_tokens_keep_the_reasoning(thinking: Harness) -> None:
    h = thinking
    h.push("<think>\nweigh it\n</think>\n\nYes.")
    sid = h.session()
    h.openai(sid).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}])
    (row,) = h.call(h.gw.finish_session, sid)
    (span,) = row.turns
    assert h.tok.decode(row.token_ids[span.start : span.end]) == "<think>\nweigh it\n</think>\n\nYes.<|im_end|>"
    assert row.metadata["reasoning_parser"] == "think"


HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need it.<|end|>"
    '<|start|>assistant to=functions.calc<|channel|>commentary json<|message|>{"e": "1+1"}'
)


def test_harmony_turns_split_into_reasoning_answer_and_calls() -> None:
    final = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done."
    assert split_harmony(final) == ("Think.", "Done.")
    reasoning, rest = split_harmony(HARMONY_CALL)
    assert reasoning == "Need it." and rest.startswith("<|start|>assistant to=functions.calc")
    assert parse_harmony(rest).tool_calls == [("calc", {"e": "1+1"})]
    # The recipient may follow the channel, with <|constrain|> before the message.
    after = '<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"e": "2"}'
    assert parse_harmony(after).tool_calls == [("calc", {"e": "2"})]
    assert split_harmony("plain text") == ("", "plain text") and parse_harmony("plain").tool_calls == []
    for broken in (HARMONY_CALL.replace('{"e": "1+1"}', "{e"), HARMONY_CALL.replace("functions.calc", "browser.open"),
                   HARMONY_CALL.replace('{"e": "1+1"}', "[1]")):
        out = parse_harmony(broken)
        assert out.ill_formed and out.content == broken and out.error
    assert detect_parser("<|start|>assistant to=functions.x<|channel|>commentary<|call|>") == "harmony"
    assert get_reasoning_parser("auto", "<|channel|>analysis<|message|>")[0] == "harmony"
