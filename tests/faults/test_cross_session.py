"""Render state shared between sessions never changes a session's rows (issue #29).

After a LangGraph (``ChatOpenAI``) session, an Anthropic SDK session with the same
conversation ended in two rows (``full_renders`` 2, ``tail_fallbacks`` 1) instead of the one
it gets alone: the renderer's anchor cache matched tools by ``==``, which ignores key order,
and handed the second session the anchor rendered from the first session's tools, whose
JSON the template writes in the other order. Real ``openai`` and ``anthropic`` clients, one
gateway.
"""

from __future__ import annotations

from typing import Any

from core.types import SamplingParams
from tests.gateway.conftest import Harness

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
FINAL = "2 + 3 = 5."
# The same tool as each client shapes it: LangChain's ``convert_to_openai_tool`` writes
# ``properties`` first, an Anthropic user writes ``type`` first.
LANGCHAIN_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
                   "type": "object"}}}
ANTHROPIC_TOOL = {"name": "add", "description": "Add two integers.", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}


def _openai_session(h: Harness) -> tuple[str, dict[str, Any]]:
    h.push(CALL, FINAL)
    sid = h.session(sampling=SamplingParams(max_tokens=200))
    client = h.openai(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[LANGCHAIN_TOOL])  # type: ignore[list-item]
    (call,) = first.choices[0].message.tool_calls or []
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    second = client.chat.completions.create(model="tiny", messages=messages, tools=[LANGCHAIN_TOOL])  # type: ignore[list-item]
    assert second.choices[0].message.content == FINAL
    return sid, dict(h.gw.session(sid).counters)


def _anthropic_session(h: Harness) -> tuple[str, dict[str, Any]]:
    h.push(CALL, FINAL)
    sid = h.session(sampling=SamplingParams(max_tokens=200))
    client = h.anthropic(sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    first = client.messages.create(model="tiny", max_tokens=200, messages=messages, tools=[ANTHROPIC_TOOL])  # type: ignore[arg-type,list-item]
    (use,) = [b for b in first.content if b.type == "tool_use"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]})
    second = client.messages.create(model="tiny", max_tokens=200, messages=messages, tools=[ANTHROPIC_TOOL])  # type: ignore[arg-type,list-item]
    assert [b.text for b in second.content if b.type == "text"] == [FINAL]
    return sid, dict(h.gw.session(sid).counters)


def _rows(h: Harness, sid: str) -> list[tuple[list[int], list[int]]]:
    return [(r.token_ids, r.loss_mask) for r in h.call(h.gw.finish_session, sid)]


def test_an_earlier_session_never_changes_a_later_session_s_rows(make_harness: Any) -> None:
    alone = make_harness()
    sid, alone_counters = _anthropic_session(alone)
    expected = _rows(alone, sid)
    assert len(expected) == 1 and alone_counters["full_renders"] == 1 and alone_counters["tail_fallbacks"] == 0

    shared = make_harness()
    first, _ = _openai_session(shared)
    assert len(_rows(shared, first)) == 1
    sid, counters = _anthropic_session(shared)
    assert (counters["full_renders"], counters["tail_fallbacks"]) == (1, 0), counters
    assert _rows(shared, sid) == expected

    # and the other way round
    back = make_harness()
    sid, _ = _openai_session(back)
    alone_openai = _rows(back, sid)
    sid, _ = _anthropic_session(back)
    sid, counters = _openai_session(back)
    assert (counters["full_renders"], counters["tail_fallbacks"]) == (1, 0), counters
    assert _rows(back, sid) == alone_openai
