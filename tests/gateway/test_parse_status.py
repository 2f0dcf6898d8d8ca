"""Every generated turn records what its tool-call parse came to (``core.types.ParseStatus``).

Driven through the real gateway app over HTTP with the ``openai`` SDK; the sampler is
scripted to write each kind of output (the model is the only thing faked). The status
travels from the turn to the trace row, through the stored trace file and back, and
into the conversation tree the viewer shows.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.gateway import GatewayConfig
from core.rundir.traces import conversation_tree, decode_rows, decode_turn, encode_rows, encode_turn
from core.types import FinishReason, ParseStatus, SamplingParams, Segment, TurnSpan
from tests.gateway.conftest import CALC_TOOL, Harness

USER = [{"role": "user", "content": "What is 2+2?"}]
STRICT_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "add",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def hermes(name: str, args: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


CASES: list[tuple[str, list[Any] | None, ParseStatus, str]] = [
    ("Four.", None, ParseStatus.NO_TOOLS, ""),
    ("Four, no tool needed.", [CALC_TOOL], ParseStatus.TEXT, ""),
    (hermes("calculator", {"expression": "2+2"}), [CALC_TOOL], ParseStatus.CALLS, ""),
    (hermes("abacus", {"expression": "2+2"}), [CALC_TOOL], ParseStatus.UNKNOWN_TOOL, "'abacus'"),
    ('<tool_call>\n{"name": "calculator", "arguments": {expression: 2+2}}\n</tool_call>', [CALC_TOOL],
     ParseStatus.BAD_JSON, "not JSON"),
    (hermes("add", {"a": 2, "b": "two"}), [STRICT_TOOL], ParseStatus.SCHEMA_MISMATCH,
     "arguments of 'add' break its strict schema: 'two' is not of type 'integer'"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}', [CALC_TOOL],
     ParseStatus.MARKUP_NO_CALL, "unterminated"),
]


@pytest.mark.parametrize(("text", "tools", "status", "detail"), CASES, ids=[c[2].value for c in CASES])
def test_each_kind_of_reply_gets_its_parse_status_on_the_turn_and_in_the_trace(
    harness: Harness, text: str, tools: list[Any] | None, status: ParseStatus, detail: str
) -> None:
    h = harness
    h.push(text)
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    kw: dict[str, Any] = {"tools": tools} if tools else {}
    out = client.chat.completions.create(model="tiny", messages=USER, **kw)  # type: ignore[arg-type]
    calls = out.choices[0].message.tool_calls or []
    # A call to a tool not offered is still returned (as vLLM does): the client says it
    # does not know it. Every other failure comes back as the model's text.
    assert bool(calls) is (status in (ParseStatus.CALLS, ParseStatus.UNKNOWN_TOOL))
    session = h.gw.session(sid)
    (turn,) = session.turns
    assert turn.parse is status
    assert detail in turn.parse_detail and bool(turn.parse_detail) is status.failed
    conversation = conversation_tree(session.root, session.turns)
    (answer,) = [n for n in conversation if n["turn"] is not None]
    assert answer["parse"] == status.value
    assert answer.get("parse_detail", "") == turn.parse_detail
    (row,) = h.call(h.gw.finish_session, sid)
    (span,) = row.turns
    assert span.parse is status and span.parse_detail == turn.parse_detail
    # Stored and read back: the status survives the trace file's JSON.
    stored = json.loads(json.dumps(encode_rows([row])))
    assert stored[0]["turns"][0][4]["parse"] == status.value
    (back,) = decode_rows(stored)
    assert back.turns == row.turns
    assert status.failed is (status not in (ParseStatus.NO_TOOLS, ParseStatus.TEXT, ParseStatus.CALLS))
    assert status.tools_offered is (tools is not None)


def test_markup_of_the_template_that_the_configured_parser_cannot_read_is_markup_without_a_call(
    make_harness: Any,
) -> None:
    """The ART failure: the parser is set to a format the model does not write, so every call
    reads as plain text and the run trains with no tool call at all. The tiny model's
    template writes Hermes ``<tool_call>`` markup; with ``tool_parser=llama3_json`` the reply
    is not a call, but it is not plain text either."""
    h: Harness = make_harness(GatewayConfig(tool_parser="llama3_json"))
    h.push(hermes("calculator", {"expression": "2+2"}), "Just four.")
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    first = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC_TOOL])  # type: ignore[list-item]
    assert first.choices[0].message.tool_calls is None
    client.chat.completions.create(model="tiny", messages=USER, tools=[CALC_TOOL])  # type: ignore[list-item]
    marked, plain = h.gw.session(sid).turns
    assert marked.parse is ParseStatus.MARKUP_NO_CALL and "'<tool_call>'" in marked.parse_detail
    assert "gateway.tool_parser" in marked.parse_detail
    assert plain.parse is ParseStatus.TEXT


def test_a_parse_status_survives_a_fork_on_every_row(make_harness: Any) -> None:
    """In tree mode a rewritten history forks the trace: the shared first turn keeps its
    status in both rows."""
    h: Harness = make_harness(GatewayConfig(history_mode="tree"))
    h.push(hermes("calculator", {"expression": "2+2"}), "Four.", "4")
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    first = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC_TOOL])  # type: ignore[list-item]
    (call,) = first.choices[0].message.tool_calls or []
    history: list[Any] = [*USER, first.choices[0].message.model_dump(exclude_none=True)]
    for result in ("4", "four"):
        msgs = [*history, {"role": "tool", "tool_call_id": call.id, "content": result}]
        client.chat.completions.create(model="tiny", messages=msgs, tools=[CALC_TOOL])  # type: ignore[arg-type]
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 2
    for row in rows:
        assert [t.parse for t in row.turns] == [ParseStatus.CALLS, ParseStatus.TEXT]
    assert [r.metadata["shared_turns"] for r in rows] == [0, 1]


def test_old_four_item_turns_read_back_without_a_status() -> None:
    """Trace files written before parse statuses hold ``[start, end, finish, version]``; a
    status name this version does not know reads as none rather than failing the file."""
    assert decode_turn([3, 9, "stop", 2]) == TurnSpan(3, 9, FinishReason.STOP, 2)
    assert decode_turn([3, 9, "stop", 2, {"parse": "from_the_future"}]).parse is None
    newer = decode_turn([3, 9, "length", 2, {"parse": "bad_json", "parse_detail": "x", "unknown_name": [1]}])
    assert newer.parse is ParseStatus.BAD_JSON and newer.parse_detail == "x"
    assert newer.finish_reason is FinishReason.LENGTH


def test_a_turn_with_segments_and_a_parse_status_keeps_both() -> None:
    """An interrupted turn stores its segments as a list and its named fields as an object,
    after the four items; either may be absent."""
    span = TurnSpan(3, 9, FinishReason.STOP, 1, (Segment(3, 5, 1), Segment(5, 9, 2)), ParseStatus.CALLS)
    stored = json.loads(json.dumps(encode_turn(span)))
    assert stored == [3, 9, "stop", 1, [[3, 5, 1], [5, 9, 2]], {"parse": "calls"}]
    assert decode_turn(stored) == span
    assert decode_turn(stored[:5]) == TurnSpan(3, 9, FinishReason.STOP, 1, span.segments)


def test_a_schema_mismatch_says_what_broke_the_schema() -> None:
    from core.gateway.strict import misfit_reason, strict_schemas

    schemas = strict_schemas([STRICT_TOOL])
    assert misfit_reason(schemas, "add", {"a": 1, "b": 2}) == ""
    assert misfit_reason(schemas, "add", {"a": 1}) == "'b' is a required property"
    assert misfit_reason(schemas, "add", "1, 2") == "the arguments are not a JSON object"
    assert misfit_reason(schemas, "calculator", {}) == ""  # not a strict tool
    broken = strict_schemas([{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": 12}}}])
    assert "not valid JSON Schema" in misfit_reason(broken, "f", {})


def test_streamed_and_anthropic_turns_get_the_same_statuses(harness: Harness) -> None:
    """The status is read once per turn whatever the dialect: an OpenAI stream whose call is
    bad JSON, an Anthropic Messages call, an Anthropic stream with a call to an unknown tool."""
    h = harness
    bad = '<tool_call>\n{"name": "calculator", "arguments": {expression}}\n</tool_call>'
    h.push(bad, hermes("calculator", {"expression": "1+1"}), hermes("abacus", {}))
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    stream = h.openai(sid).chat.completions.create(
        model="tiny", messages=USER, tools=[CALC_TOOL], stream=True  # type: ignore[list-item]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == bad
    anth_tool: Any = {"name": "calculator", "input_schema": CALC_TOOL["function"]["parameters"]}
    client = h.anthropic(sid)
    msg = client.messages.create(model="tiny", max_tokens=256, messages=USER, tools=[anth_tool])  # type: ignore[arg-type]
    assert [b.type for b in msg.content] == ["tool_use"]
    with client.messages.stream(model="tiny", max_tokens=256, messages=USER, tools=[anth_tool]) as events:  # type: ignore[arg-type]
        final = events.get_final_message()
    assert [b.name for b in final.content if b.type == "tool_use"] == ["abacus"]
    assert [t.parse for t in h.gw.session(sid).turns] == [ParseStatus.BAD_JSON, ParseStatus.CALLS, ParseStatus.UNKNOWN_TOOL]
