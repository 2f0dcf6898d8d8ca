"""``POST /v1/responses`` with the real openai SDK and the real OpenAI Agents SDK over HTTP.

The gateway runs on uvicorn (127.0.0.1); only the model is scripted
(``ScriptedSampler``). Rows are checked as the chat tests check them: the token
ids equal the template's rendering of the conversation, the mask is 1 exactly
on the generated tokens.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.types import FinishReason, SamplingParams
from tests.gateway.conftest import CALC_TOOL, Harness
from tests.gateway.test_openai_sdk import _check_mask_on_generated, _render_ids

CALC_FLAT = {"type": "function", **CALC_TOOL["function"]}
"""``CALC_TOOL`` as a Responses (flat) tool definition."""
SYSTEM = "You are a calculator."


def _call(expr: str) -> str:
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
    return f"<tool_call>\n{payload}\n</tool_call>"


def _check_row(h: Harness, sid: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               replies: list[list[int]]) -> Any:
    """The session's one row: the template's rendering of ``messages``, trained on ``replies``."""
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 1
    row = rows[0]
    full = _render_ids(h.tok, messages, tools)
    assert row.token_ids == full[: len(row.token_ids)]
    assert h.tok.decode(full[len(row.token_ids) :]) == "\n"
    _check_mask_on_generated(h, row, replies)
    assert row.metadata["forks"] == 0 and row.metadata["ill_formed_tool_calls"] == 0
    return row


def _assistant_call(call_id: str, expr: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": {"expression": expr}}}]}


def test_tool_loop_full_history_resent(harness: Harness) -> None:
    """The client resends the whole conversation (its own output items included) each turn."""
    h = harness
    replies = [h.reply(_call("12 * 7")), h.reply("The answer is 84.")]
    h.sampler.push(*replies)
    sid = h.session(metadata={"rollout_id": "r1"})
    client = h.openai(sid)
    first = client.responses.create(model="tiny", instructions=SYSTEM, input="What is 12 * 7?", tools=[CALC_FLAT])
    assert first.status == "completed" and first.object == "response"
    (fc,) = first.output
    assert fc.type == "function_call" and fc.name == "calculator"
    assert json.loads(fc.arguments) == {"expression": "12 * 7"}
    assert first.usage is not None and first.usage.output_tokens == len(replies[0])
    items: list[Any] = [{"role": "user", "content": "What is 12 * 7?"}]
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "84"})
    second = client.responses.create(model="tiny", instructions=SYSTEM, input=items, tools=[CALC_FLAT])
    assert second.output_text == "The answer is 84."
    assert [o.type for o in second.output] == ["message"]
    # Both responses are stored; the second shares the first's copy of the resent history.
    kept_first, kept_second = h.gw.session(sid).responses.values()
    assert kept_second.groups[0] is kept_first.groups[0]
    assert kept_second.response["tools"] is kept_first.response["tools"]

    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 12 * 7?"},
        _assistant_call(fc.call_id, "12 * 7"),
        {"role": "tool", "tool_call_id": fc.call_id, "content": "84"},
        {"role": "assistant", "content": "The answer is 84."},
    ]
    row = _check_row(h, sid, messages, [CALC_TOOL], replies)
    assert row.rollout_id == "r1" and row.metadata["full_renders"] == 1
    # The second turn was fed the first turn's served tokens verbatim.
    assert list(h.sampler.calls[1].prompt_token_ids[: row.turns[0].end]) == row.token_ids[: row.turns[0].end]


def test_streaming_with_previous_response_id(harness: Harness) -> None:
    """Streamed turns; the follow-ups send only the new items and ``previous_response_id``."""
    h = harness
    replies = [h.reply(_call("2 + 3")), h.reply("Done: " + "5" * 100)]
    h.sampler.push(*replies)
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    kinds: list[str] = []
    final = None
    for event in client.responses.create(
        model="tiny", instructions=SYSTEM, input=[{"role": "user", "content": [{"type": "input_text", "text": "2+3?"}]}],
        tools=[CALC_FLAT], stream=True,
    ):
        kinds.append(event.type)
        if event.type == "response.completed":
            final = event.response
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    assert final is not None
    (fc,) = final.output
    assert fc.type == "function_call"
    # The SDK's own stream helper accumulates the events into the final response.
    with client.responses.stream(
        model="tiny", instructions=SYSTEM, previous_response_id=final.id, tools=[CALC_FLAT],
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "5"}],
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        second = stream.get_final_response()
    assert len(deltas) == 2 and "".join(deltas) == second.output_text == "Done: " + "5" * 100
    assert second.previous_response_id == final.id

    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "2+3?"},
        _assistant_call(fc.call_id, "2 + 3"),
        {"role": "tool", "tool_call_id": fc.call_id, "content": "5"},
        {"role": "assistant", "content": "Done: " + "5" * 100},
    ]
    row = _check_row(h, sid, messages, [CALC_TOOL], replies)
    assert row.metadata["full_renders"] == 1 and row.metadata["nonlinear_resets"] == 0


def test_store_retrieve_delete_and_store_false(harness: Harness) -> None:
    h = harness
    h.push("one", "two", "three")
    sid, other = h.session(), h.session()
    client = h.openai(sid)
    kept = client.responses.create(model="tiny", input="hi")
    assert kept.store is True
    assert client.responses.retrieve(kept.id).output_text == "one"
    by_path = h.openai("ignored", base_url=f"{h.server.root_url}/sessions/{sid}/v1")  # the session in the path
    assert by_path.responses.retrieve(kept.id).id == kept.id
    cont = by_path.responses.create(model="tiny", input="more", previous_response_id=kept.id, store=False)
    assert cont.output_text == "two" and cont.store is False
    import openai

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(cont.id)
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input="x", previous_response_id=cont.id)
    assert exc.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert "store=false" in str(exc.value)
    # Another session cannot see this session's responses.
    with pytest.raises(openai.BadRequestError):
        h.openai(other).responses.create(model="tiny", input="x", previous_response_id=kept.id)
    # input_tokens counts the prompt the same request would be fed.
    counted = client.responses.input_tokens.count(model="tiny", input="again", previous_response_id=kept.id)
    h.push("four")
    assert counted.input_tokens == client.responses.create(
        model="tiny", input="again", previous_response_id=kept.id).usage.input_tokens  # type: ignore[union-attr]
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    assert len(h.gw.session(sid).turns) == 3  # store=false turns are still recorded for training


def test_branches_from_one_response_are_rows_sharing_its_prefix(harness: Harness) -> None:
    """Two continuations of one stored response (tree mode): two rows, the shared turn trained once."""
    h = harness
    replies = [h.reply("root"), h.reply("left"), h.reply("right")]
    h.sampler.push(*replies)
    sid = h.session(history_mode="tree")
    client = h.openai(sid)
    root = client.responses.create(model="tiny", instructions=SYSTEM, input="start")
    left = client.responses.create(model="tiny", instructions=SYSTEM, input="go left", previous_response_id=root.id)
    right = client.responses.create(model="tiny", instructions=SYSTEM, input="go right", previous_response_id=root.id)
    assert (left.output_text, right.output_text) == ("left", "right")
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 2 and rows[0].metadata["full_renders"] == 1
    for row, side in zip(rows, ("left", "right"), strict=True):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "start"},
                    {"role": "assistant", "content": "root"}, {"role": "user", "content": f"go {side}"},
                    {"role": "assistant", "content": side}]
        full = _render_ids(h.tok, messages, None)
        assert row.token_ids == full[: len(row.token_ids)]
    s0, e0 = rows[0].turns[0].start, rows[0].turns[0].end
    assert rows[0].loss_mask[s0:e0] == [1] * (e0 - s0) and rows[1].loss_mask[s0:e0] == [0] * (e0 - s0)


def test_max_output_tokens_gives_incomplete(harness: Harness) -> None:
    h = harness
    h.push("a long answer that will not fit")
    sid = h.session()
    events = list(h.openai(sid).responses.create(model="tiny", input="x", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"
    resp = events[-1].response
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    row = h.call(h.gw.finish_session, sid)[0]
    assert row.num_generated == 3 and row.turns[0].finish_reason is FinishReason.LENGTH


def test_tool_choice_and_parallel_tool_calls_are_honoured(harness: Harness) -> None:
    h = harness
    two = _call("1 + 1") + "\n" + _call("2 + 2")
    h.push(two, _call("3 + 3"))
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    one = client.responses.create(model="tiny", input="x", tools=[CALC_FLAT], parallel_tool_calls=False)
    assert [o.type for o in one.output] == ["function_call"] and one.parallel_tool_calls is False
    assert json.loads(one.output[0].arguments) == {"expression": "1 + 1"}
    raw = client.responses.with_raw_response.create(model="tiny", input="y", tools=[CALC_FLAT], tool_choice="none")
    assert raw.headers["x-tracerl-tool-choice"] == "violated"
    refused = raw.parse()
    assert [o.type for o in refused.output] == ["message"] and "<tool_call>" in refused.output_text
    assert refused.tool_choice == "none"
    counters = h.gw.session(sid).counters
    assert counters["tool_calls_dropped"] == 2 and counters["tool_choice_violations"] == 1


THINKING = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and m.reasoning_content %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}{{- m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)
"""A minimal template that renders past reasoning as generated and has Qwen3's thinking switch
(written here, not copied from a model)."""
NO_THINK = "<think>\n\n</think>\n\n"


def test_logprobs_on_request_and_reasoning_effort_drives_the_template(make_harness: Any) -> None:
    from core.gateway import GatewayConfig
    from core.samplers.scripted import fake_logprob
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320, chat_template=THINKING)
    h = make_harness(tokenizer=tok, config=GatewayConfig(tool_parser="none"))
    text = "Four, I think."
    h.sampler.default = h.reply(text)
    client = h.openai(h.session(sampling=SamplingParams(max_tokens=256)))
    include: Any = ["message.output_text.logprobs"]
    resp = client.responses.create(model="tiny", input="hi", include=include, reasoning={"effort": "none"})
    ids = h.reply(text)[:-1]  # the end-of-turn token closes the turn; it is not content
    (part,) = resp.output[0].content  # type: ignore[union-attr]
    assert [e.logprob for e in part.logprobs] == [fake_logprob(t, i) for i, t in enumerate(ids)]
    assert "".join(e.token for e in part.logprobs) == text and resp.reasoning.effort == "none"
    done = [e for e in client.responses.create(model="tiny", input="hi", include=include, stream=True)
            if e.type == "response.output_text.done"]
    assert [(e.token, e.logprob) for e in done[0].logprobs] == [(e.token, e.logprob) for e in part.logprobs]
    assert client.responses.create(model="tiny", input="hi").output[0].content[0].logprobs == []  # type: ignore[union-attr]
    prompts = [h.tok.decode(c.prompt_token_ids) for c in h.sampler.calls]
    assert [p.endswith(NO_THINK) for p in prompts] == [True, False, False]
    import openai

    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input="hi", reasoning={"effort": "high"})
    assert exc.value.body["param"] == "reasoning" and "'reasoning.effort'" in str(exc.value)  # type: ignore[index]




def test_reasoning_items_out_and_back(make_harness: Any) -> None:
    """Reasoning comes out as a reasoning item; sent back, it renders as generated: one exact row."""
    from core.gateway import GatewayConfig
    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320, chat_template=THINKING)
    h = make_harness(tokenizer=tok, config=GatewayConfig(tool_parser="none"))
    replies = [h.reply("<think>\nplan A\n</think>\n\nanswer A"), h.reply("<think>\nplan B\n</think>\n\nanswer B")]
    h.sampler.push(*replies)
    sid = h.session(sampling=SamplingParams(max_tokens=256))
    client = h.openai(sid)
    events = list(client.responses.create(model="tiny", input="q1", stream=True))
    kinds = [e.type for e in events]
    assert kinds[2:7] == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                          "response.reasoning_text.done", "response.content_part.done"]
    first = events[-1].response
    assert [o.type for o in first.output] == ["reasoning", "message"]
    assert first.output[0].content[0].text == "plan A" and first.output_text == "answer A"
    items: list[Any] = [{"role": "user", "content": "q1"}, *(o.model_dump(exclude_none=True) for o in first.output)]
    second = client.responses.create(model="tiny", input=[*items, {"role": "user", "content": "q2"}])
    assert second.output[0].content[0].text == "plan B"  # type: ignore[union-attr]
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "answer A", "reasoning_content": "plan A"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "answer B", "reasoning_content": "plan B"},
    ]
    row = _check_row(h, sid, messages, [], replies)
    assert row.metadata["full_renders"] == 1 and row.metadata["reasoning_parser"] == "think"


_BAD: list[tuple[dict[str, Any], str, str]] = [
    ({}, "input", "required"),
    ({"input": 3}, "input", "string or a list"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input", "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "input[0].content[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input", "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f", "call_id": 3, "arguments": "{}"}]}, "input", "input[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "function tools only"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "offers no tools"),
    ({"input": "x", "tools": [CALC_FLAT], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "'nope'"),
    ({"input": "x", "parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}}, "text", "JSON schema"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning", "cannot be honoured"),
    ({"input": "x", "truncation": "auto"}, "truncation", "disabled"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": "x", "background": True}, "background", "false"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include", "cannot return"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs", "only the sampled token"),
    ({"input": "x", "reasoning": {"summary": "detailed"}}, "reasoning", "no summaries"),
    ({"input": "x", "frobnicate": 1}, "frobnicate", "not supported"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id", "not stored"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({"input": "x", "temperature": 5}, "temperature", "[0.0, 2.0]"),
    ({"input": "\ud800"}, "input", "surrogate"),
]


def test_deep_values_are_400_naming_the_field(harness: Harness) -> None:
    """A value nested just under the JSON parser's limit, in any field or item, is a 400
    naming where it is (never the repr of the whole, which recursed into a 500)."""
    h = harness
    sid = h.session()
    deep = "[" * 990 + "]" * 990
    deep_obj = '{"a": ' * 990 + "1" + "}" * 990
    cases = [(f'{{"input": "x", "{f}": {deep}}}', f) for f in (
        "metadata", "user", "tool_choice", "reasoning", "include", "text", "truncation", "store", "instructions",
        "previous_response_id", "parallel_tool_calls", "max_output_tokens", "stream_options", "frobnicate")]
    cases += [
        ('{"input": "x", "metadata": {"k": ' + deep_obj + "}}", "metadata"),
        ('{"input": "x", "tools": [' + json.dumps(CALC_FLAT) + '], "tool_choice": {"type": "function", '
         '"name": "calculator", "x": ' + deep + "}}", None),
        ('{"input": [{"role": ' + deep + ', "content": "x"}]}', "input[0].role"),
        ('{"input": [{"type": ' + deep + "}]}", "input[0].type"),
        ('{"input": [{"role": "user", "content": [{"type": ' + deep + "}]}]}", "input[0].content[0]"),
        ('{"input": "x", "tools": [{"type": ' + deep + "}]}", "tools[0].type"),
        ('{"input": "x", "tools": [{"type": "function", "name": "f", "strict": ' + deep + "}]}", "tools[0].strict"),
        ('{"input": "x", "reasoning": {"summary": ' + deep + "}}", "reasoning"),
    ]
    with httpx.Client(base_url=h.server.base_url, headers={"authorization": f"Bearer {sid}"}) as http:
        for raw, where in cases:
            h.push("ok")
            r = http.post("/responses", content=raw.encode(), headers={"content-type": "application/json"})
            if where is None:  # a valid request with an extra key deep down: served, echoed without it
                assert r.status_code == 200 and r.json()["tool_choice"] == {"type": "function", "name": "calculator"}
                continue
            assert r.status_code == 400, (where, r.text[:200])
            assert where in r.json()["error"]["message"], (where, r.json())


def test_bad_requests_are_400_in_the_openai_envelope(harness: Harness) -> None:
    h = harness
    sid = h.session()
    with httpx.Client(base_url=h.server.base_url, headers={"authorization": f"Bearer {sid}"}) as http:
        for body, param, words in _BAD:
            raw = json.dumps(body).encode()
            r = http.post("/responses", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
            assert words in err["message"], (body, err["message"])
        assert http.post("/responses", json={"input": "x"}, headers={"authorization": "Bearer nope"}).status_code == 401
    assert h.gw.session(sid).turns == [] and h.sampler.calls == []


def _call_ids(h: Harness, sid: str) -> list[str]:
    """The ids of the tool calls the gateway answered in ``sid`` (its recorded conversation)."""
    ids: list[str] = []
    node = h.gw.session(sid).root
    while node.children:
        node = node.children[-1]
        for m in node.canon:
            ids += [c["id"] for c in m.get("tool_calls", ())]
    return ids


def test_openai_agents_sdk_default_model_and_settings_are_served(harness: Harness) -> None:
    """An Agent with no model: the Agents SDK 0.24 default (a gpt-5 model) sends
    ``text: {"verbosity": "low"}`` and ``reasoning: {"effort": "none"}``, which were a 400 on the
    first call (issue #29). Verbosity is a hint no template expresses and that constrains
    nothing the sampler may produce: accepted and counted (``hints_ignored``); effort ``none``
    is what a template that never reasons does anyway."""
    from agents import Agent, RunConfig, Runner
    from agents.models import get_default_model_settings
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI

    defaults = get_default_model_settings()
    assert defaults.verbosity == "low" and defaults.reasoning is not None and defaults.reasoning.effort == "none"
    h = harness
    h.push("Hello.", "Again.")
    sid = h.session()
    agent = Agent(name="plain", instructions=SYSTEM)  # the SDK's default model and settings

    async def run() -> list[str]:
        client = AsyncOpenAI(base_url=h.server.base_url, api_key=sid, max_retries=0)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
        try:
            first = await Runner.run(agent, "hi", run_config=config)
            second = await Runner.run(agent, first.to_input_list() + [{"role": "user", "content": "more"}],
                                      run_config=config)
            return [str(first.final_output), str(second.final_output)]
        finally:
            await client.close()

    assert asyncio.run(run()) == ["Hello.", "Again."]
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 1 and len(rows[0].turns) == 2
    assert rows[0].metadata["hints_ignored"] == 2 and rows[0].metadata["full_renders"] == 1


def test_a_verbosity_hint_is_counted_and_a_bad_one_refused(harness: Harness) -> None:
    h = harness
    h.push("a", "b", "c")
    sid = h.session()
    client = h.openai(sid)
    client.responses.create(model="tiny", input="x", text={"verbosity": "medium"})
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], verbosity="high")
    assert h.gw.session(sid).counters["hints_ignored"] == 1
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input="x", text={"verbosity": "loud"})  # type: ignore[typeddict-item]
    assert exc.value.body["param"] == "text" and "'text.verbosity' must be one of" in str(exc.value)  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], verbosity="loud")  # type: ignore[arg-type]
    assert exc.value.body["param"] == "verbosity"  # type: ignore[index]


def test_openai_agents_sdk_default_model_runs_a_tool_loop(harness: Harness) -> None:
    """An Agent with one function tool on the Agents SDK's default (Responses) model."""
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    h = harness
    seen: list[str] = []

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        seen.append(expression)
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - the test's own inputs

    replies = [h.reply(_call("12 * 7")), h.reply(_call("84 + 1")), h.reply("It is 85.")]
    h.sampler.push(*replies)
    sid = h.session()
    agent = Agent(name="calc", instructions=SYSTEM, tools=[calculator], model="tiny")

    async def run(streamed: bool) -> str:
        client = AsyncOpenAI(base_url=h.server.base_url, api_key=sid, max_retries=0)
        provider = OpenAIProvider(openai_client=client)
        assert isinstance(provider.get_model("tiny"), OpenAIResponsesModel)
        config = RunConfig(model_provider=provider, tracing_disabled=True)
        try:
            if streamed:
                # Server-side state: each call sends previous_response_id and only the new items.
                result = Runner.run_streamed(
                    agent, "What is 12 * 7 + 1?", run_config=config, auto_previous_response_id=True
                )
                events = [event async for event in result.stream_events()]
                assert events, "the streamed run produced no events"
            else:
                result = await Runner.run(agent, "What is 12 * 7 + 1?", run_config=config)
            return str(result.final_output)
        finally:
            await client.close()

    assert asyncio.run(run(streamed=False)) == "It is 85."
    assert seen == ["12 * 7", "84 + 1"]
    ids = _call_ids(h, sid)
    tool = {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": calculator.params_json_schema}}
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 12 * 7 + 1?"},
        _assistant_call(ids[0], "12 * 7"),
        {"role": "tool", "tool_call_id": ids[0], "content": "84"},
        _assistant_call(ids[1], "84 + 1"),
        {"role": "tool", "tool_call_id": ids[1], "content": "85"},
        {"role": "assistant", "content": "It is 85."},
    ]
    row = _check_row(h, sid, messages, [tool], replies)
    assert len(row.turns) == 3 and row.metadata["full_renders"] == 1

    # Streamed, with previous_response_id: the same conversation, the same row.
    h.sampler.push(*replies)
    sid = h.session()
    seen.clear()
    assert asyncio.run(run(streamed=True)) == "It is 85."
    assert seen == ["12 * 7", "84 + 1"]
    stored = list(h.gw.session(sid).responses.values())
    assert [r.response["previous_response_id"] for r in stored] == [None, stored[0].response["id"], stored[1].response["id"]]
    assert [len(r.groups) for r in stored] == [2, 2, 2]  # each call sent one new item; plus its output
    ids = _call_ids(h, sid)
    messages[2], messages[3] = _assistant_call(ids[0], "12 * 7"), {"role": "tool", "tool_call_id": ids[0], "content": "84"}
    messages[4], messages[5] = _assistant_call(ids[1], "84 + 1"), {"role": "tool", "tool_call_id": ids[1], "content": "85"}
    row = _check_row(h, sid, messages, [tool], replies)
    assert row.metadata["full_renders"] == 1 and row.metadata["nonlinear_resets"] == 0


_leaf = st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=12)
_any = st.recursive(
    _leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "refusal", "reasoning_text", "input_image", 3])},
    optional={"text": _any | st.text(max_size=10), "refusal": _any},
)
_item = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning",
                                 "item_reference", "x", None, 3]),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", None, 1]),
        "content": st.lists(_part, max_size=2) | _any,
        "call_id": _any, "name": _any, "arguments": _any | st.just('{"a": 1}'),
        "output": _any, "summary": _any,
    },
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "input": st.lists(_item, max_size=4) | _any,
        "instructions": _any, "tools": st.lists(st.just(CALC_FLAT) | _any, max_size=2) | _any,
        "tool_choice": _any | st.sampled_from(["auto", "none", "required"]),
        "parallel_tool_calls": _any, "max_output_tokens": _any, "temperature": _any,
        "previous_response_id": _any, "store": _any, "stream": st.booleans(), "include": _any,
        "text": _any, "reasoning": _any, "truncation": _any, "metadata": _any,
    },
)


def test_fuzzed_bodies_never_get_a_500(harness: Harness) -> None:
    """Whatever the body, /v1/responses answers 2xx or a 4xx in the OpenAI envelope."""
    h = harness
    h.sampler.default = h.reply("ok")
    sid = h.session(max_context_tokens=0)
    client = httpx.Client(timeout=10)

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=_body)
    def check(body: dict[str, Any]) -> None:
        r = client.post(h.server.base_url + "/responses", json=body, headers={"authorization": f"Bearer {sid}"})
        assert r.status_code < 500, (body, r.text)
        if r.status_code >= 400:
            assert r.json()["error"]["message"], body

    try:
        check()
    finally:
        client.close()
