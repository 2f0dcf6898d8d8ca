"""``read_reply`` alone: sampled tokens in, what the reply says out, with no session or gateway.

A tiny vocabulary stands in for the tokenizer: token ``i`` decodes to ``PIECES[i]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from core.gateway.parsed_output import ParsedOutput
from core.gateway.reasoning_parsers import split_think
from core.gateway.reply import ReplyFormat, ReplySettings, parse_tools, read_reply
from core.gateway.toolchoice import ToolChoice
from core.gateway.toolparse import parse_hermes
from core.types import FinishReason

END = 0
"""The end-of-turn token."""
STOP_ID = 1
"""A stop token id of the request (not an end-of-turn id)."""
PIECES: list[str] = ["<|im_end|>", "<|stop|>"]


def tokens(*texts: str) -> list[int]:
    """Ids that decode to ``texts`` one piece each (new pieces join the vocabulary)."""
    out = []
    for text in texts:
        if text not in PIECES:
            PIECES.append(text)
        out.append(PIECES.index(text))
    return out


def decode(ids: Sequence[int]) -> str:
    return "".join(PIECES[i] for i in ids)


PLAIN = ReplyFormat(decode=decode, end_of_turn_ids=frozenset({END}))
TOOLS = ReplyFormat(decode=decode, end_of_turn_ids=frozenset({END}), parse_tools=parse_hermes)
THINK = ReplyFormat(decode=decode, end_of_turn_ids=frozenset({END}), split_reasoning=split_think, parse_tools=parse_hermes)


def call(name: str, args: dict[str, Any] | str) -> str:
    """Hermes markup of one call."""
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


CALC_SCHEMA = {
    "type": "object",
    "properties": {"x": {"type": "integer"}},
    "required": ["x"],
    "additionalProperties": False,
}


def test_the_end_of_turn_token_is_cut_from_the_body_and_kept_as_the_closer() -> None:
    ids = tokens("Hello", " world") + [END]
    reply = read_reply(ids, FinishReason.STOP, ReplySettings(), PLAIN)
    assert reply.content == "Hello world"
    assert reply.body == tuple(ids[:-1]) and reply.closer == "<|im_end|>"
    assert reply.calls == () and reply.stop_string is None and not reply.choice_violated


def test_a_request_stop_token_closes_the_turn_too() -> None:
    ids = tokens("Hi") + [STOP_ID]
    assert read_reply(ids, FinishReason.STOP, ReplySettings(), PLAIN).closer == ""
    reply = read_reply(ids, FinishReason.STOP, ReplySettings(stop_token_ids=(STOP_ID,)), PLAIN)
    assert reply.closer == "<|stop|>" and reply.content == "Hi" and reply.body == tuple(ids[:-1])


def test_the_text_is_cut_at_the_first_stop_string() -> None:
    ids = tokens("Count: 1, 2", " END 3 ", "HALT 4")
    reply = read_reply(ids, FinishReason.STOP, ReplySettings(stop=("HALT", "END")), PLAIN)
    assert reply.content == "Count: 1, 2 " and reply.stop_string == "END"
    assert reply.body == tuple(ids)  # the tokens stay: only the text is cut


@pytest.mark.parametrize(
    ("ids_end", "finish"),
    [([END], FinishReason.STOP), ([], FinishReason.LENGTH)],
    ids=["a token closed the turn", "cut at max_tokens"],
)
def test_stop_strings_apply_only_to_a_turn_that_stopped_on_text(ids_end: list[int], finish: FinishReason) -> None:
    ids = tokens("a STOP b") + ids_end
    reply = read_reply(ids, finish, ReplySettings(stop=("STOP",)), PLAIN)
    assert reply.content == "a STOP b" and reply.stop_string is None


def test_reasoning_is_split_off_the_content() -> None:
    reply = read_reply(tokens("<think>", "add them", "</think>", "3") + [END], FinishReason.STOP, ReplySettings(), THINK)
    assert (reply.reasoning, reply.content) == ("add them", "3")
    # The prompt opened the block: the turn starts inside it.
    opened = read_reply(tokens("add them", "</think>", "3"), FinishReason.STOP, ReplySettings(opened_think=True), THINK)
    assert (opened.reasoning, opened.content) == ("add them", "3")
    # It did not: a stray closing tag is text.
    stray = read_reply(tokens("add them", "</think>", "3"), FinishReason.STOP, ReplySettings(), THINK)
    assert (stray.reasoning, stray.content) == ("", "add them</think>3")


def test_a_parsed_tool_call_is_returned_and_its_markup_leaves_the_content() -> None:
    ids = tokens("Let me add.", call("calc", {"x": 1})) + [END]
    reply = read_reply(ids, FinishReason.STOP, ReplySettings(tools=("calc",)), TOOLS)
    assert reply.calls == (("calc", {"x": 1}),) and reply.content == "Let me add."
    assert not reply.ill_formed and reply.unknown_calls == 0 and reply.dropped == 0


def test_without_tools_offered_the_text_is_not_parsed() -> None:
    text = "Let me add." + call("calc", {"x": 1})
    reply = read_reply(tokens(text), FinishReason.STOP, ReplySettings(), TOOLS)
    assert reply.calls == () and reply.content == text


def test_a_call_to_a_tool_not_offered_is_returned_and_counted() -> None:
    reply = read_reply(tokens(call("search", {"q": "x"})), FinishReason.STOP, ReplySettings(tools=("calc",)), TOOLS)
    assert reply.calls == (("search", {"q": "x"}),) and reply.unknown_calls == 1


def test_an_ill_formed_call_comes_back_as_text() -> None:
    text = '<tool_call>{"name": calc</tool_call>'
    reply = read_reply(tokens(text), FinishReason.STOP, ReplySettings(tools=("calc",)), TOOLS)
    assert reply.ill_formed and reply.content == text and reply.calls == ()
    assert not reply.choice_violated  # tool_choice auto: nothing was required
    required = ReplySettings(tools=("calc",), tool_choice=ToolChoice(mode="required"))
    assert read_reply(tokens(text), FinishReason.STOP, required, TOOLS).choice_violated


def test_a_strict_schema_misfit_is_dropped_and_flagged() -> None:
    text = "Adding." + call("calc", {"x": "one"})
    settings = ReplySettings(tools=("calc",), strict={"calc": CALC_SCHEMA})
    reply = read_reply(tokens(text), FinishReason.STOP, settings, TOOLS)
    assert reply.calls == () and reply.strict_misfits == 1 and reply.dropped == 1
    assert reply.choice_violated and reply.content == text  # no call left: the raw text
    fits = read_reply(tokens("Adding." + call("calc", {"x": 1})), FinishReason.STOP, settings, TOOLS)
    assert fits.calls == (("calc", {"x": 1}),) and fits.strict_misfits == 0 and not fits.choice_violated


def test_tool_choice_none_refuses_the_calls() -> None:
    text = "Adding." + call("calc", {"x": 1})
    settings = ReplySettings(tools=("calc",), tool_choice=ToolChoice(mode="none"))
    reply = read_reply(tokens(text), FinishReason.STOP, settings, TOOLS)
    assert reply.calls == () and reply.dropped == 1 and reply.choice_violated and reply.content == text


def test_tool_choice_required_is_violated_only_without_a_call() -> None:
    settings = ReplySettings(tools=("calc",), tool_choice=ToolChoice(mode="required"))
    answered = read_reply(tokens("It is 3."), FinishReason.STOP, settings, TOOLS)
    assert answered.choice_violated and answered.calls == () and answered.content == "It is 3."
    called = read_reply(tokens(call("calc", {"x": 1})), FinishReason.STOP, settings, TOOLS)
    assert not called.choice_violated and called.calls == (("calc", {"x": 1}),)


def test_tool_choice_names_and_parallel_keep_only_the_allowed_calls() -> None:
    text = call("calc", {"x": 1}) + call("search", {"q": "a"}) + call("calc", {"x": 2})
    only_calc = ReplySettings(tools=("calc", "search"), tool_choice=ToolChoice(names=("calc",), parallel=False))
    reply = read_reply(tokens(text), FinishReason.STOP, only_calc, TOOLS)
    assert reply.calls == (("calc", {"x": 1}),) and reply.dropped == 2 and reply.choice_violated


def test_a_parser_that_raises_makes_an_ill_formed_call_not_an_error() -> None:
    def broken(text: str) -> ParsedOutput:
        raise RuntimeError("boom")

    out = parse_tools(broken, "x")
    assert out.ill_formed and out.content == "x" and "RuntimeError: boom" in out.error
    fmt = ReplyFormat(decode=decode, end_of_turn_ids=frozenset({END}), parse_tools=broken)
    reply = read_reply(tokens("hello"), FinishReason.STOP, ReplySettings(tools=("calc",)), fmt)
    assert reply.ill_formed and reply.content == "hello"
