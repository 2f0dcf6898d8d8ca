"""Real agent frameworks in a tool loop against the real gateway (uvicorn on 127.0.0.1).

LangChain (``langchain-openai``, ``langchain-anthropic``), pydantic-ai (OpenAI chat and
Anthropic models) and LiteLLM (``openai/`` and ``anthropic/`` providers), each as a user
would configure it: a base URL and the session id as the API key. Only the model is
scripted (``ScriptedSampler``). Each session must give one row that extends the served
tokens turn after turn (no fork: what the framework sends back renders as what the
model generated), trained exactly on the scripted replies; the fields each framework
sends must all be honoured or harmless (an unknown one would be a 400).

Marker ``frameworks`` (importing the frameworks costs seconds of CPU):
``python -m pytest -m frameworks``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from typing import Any

import pytest

from core.types import SamplingParams
from tests.gateway.conftest import Harness

pytestmark = pytest.mark.frameworks

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
FINAL = "2 + 3 = 5."
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Seen:
    """The top-level fields of every turn request the gateway parsed (wraps the route's parsers)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import core.gateway.app as app

        self.bodies: list[dict[str, Any]] = []
        for name in ("parse_chat_request", "parse_messages_request"):
            real = getattr(app, name)

            def spy(body: dict[str, Any], *a: Any, _real: Any = real) -> Any:
                self.bodies.append({k: v for k, v in body.items() if k != "messages"})
                return _real(body, *a)

            monkeypatch.setattr(app, name, spy)

    def keys(self) -> set[str]:
        return {k for b in self.bodies for k in b}


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    return Seen(monkeypatch)


def _one_row(h: Harness, sid: str, replies: list[str]) -> Any:
    """The session's rows: one, extending the served tokens, trained on ``replies`` exactly."""
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 1, [r.metadata for r in rows]
    row = rows[0]
    row.validate()
    assert row.metadata["forks"] == 0 and row.metadata["nonlinear_resets"] == 0
    assert row.metadata["ill_formed_tool_calls"] == 0
    assert [row.token_ids[t.start : t.end] for t in row.turns] == [h.reply(r) for r in replies]
    generated = {i for t in row.turns for i in range(t.start, t.end)}
    assert [i for i, m in enumerate(row.loss_mask) if m] == sorted(generated)
    return row


def _session(h: Harness) -> str:
    return h.session(sampling=SamplingParams(max_tokens=256))


# ---------------------------------------------------------------- LangChain


def test_langchain_openai_tool_loop_and_stream(harness: Harness, seen: Seen) -> None:
    from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    h = harness
    sid = _session(h)
    model = ChatOpenAI(model="tiny", base_url=h.server.base_url, api_key=sid, max_retries=0)  # type: ignore[arg-type]
    h.clients.append(model.root_client)  # closed at teardown (its connections would leak into later tests)
    h.push(CALL, FINAL)
    with_tools = model.bind_tools([add])
    messages: list[BaseMessage] = [HumanMessage("What is 2 + 3?")]
    ai = with_tools.invoke(messages)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("add", {"a": 2, "b": 3})]  # type: ignore[attr-defined]
    messages.append(ai)
    for call in ai.tool_calls:  # type: ignore[attr-defined]
        messages.append(ToolMessage(str(add(**call["args"])), tool_call_id=call["id"]))
    assert with_tools.invoke(messages).content == FINAL
    _one_row(h, sid, [CALL, FINAL])

    # Streaming with usage, sampling options, a forced tool and one call at a time.
    sid = _session(h)
    model = ChatOpenAI(model="tiny", base_url=h.server.base_url, api_key=sid, max_retries=0,  # type: ignore[arg-type]
                       temperature=0.5, max_tokens=250, seed=3, stream_usage=True)  # type: ignore[call-arg]
    h.clients.append(model.root_client)
    h.push("Hello there.")
    chunks = list(model.stream("hi"))
    assert "".join(str(c.content) for c in chunks) == "Hello there."
    assert any(c.usage_metadata for c in chunks)  # type: ignore[attr-defined]
    h.push(CALL + "\n" + CALL)
    forced = model.bind_tools([add], tool_choice="add", parallel_tool_calls=False).invoke("2+3?")
    assert len(forced.tool_calls) == 1  # type: ignore[attr-defined]
    assert {"stream_options", "tool_choice", "parallel_tool_calls", "seed", "max_completion_tokens"} <= seen.keys()
    sent = [b for b in seen.bodies if "tool_choice" in b][-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert sent["parallel_tool_calls"] is False
    assert h.call(h.gw.finish_session, sid)[-1].metadata["tool_calls_dropped"] == 1


def test_langchain_structured_output(harness: Harness) -> None:
    """The default (json_schema ``response_format``) is refused naming the field and the way
    out; the function-calling method works through the forced tool."""
    import openai
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Answer(BaseModel):
        n: int

    h = harness
    sid = _session(h)
    model = ChatOpenAI(model="tiny", base_url=h.server.base_url, api_key=sid, max_retries=0)  # type: ignore[arg-type]
    h.clients.append(model.root_client)
    with pytest.raises(openai.BadRequestError) as exc:
        model.with_structured_output(Answer).invoke("n?")
    err = exc.value.response.json()["error"]
    assert err["param"] == "response_format" and "method='function_calling'" in err["message"]
    h.push('<tool_call>\n{"name": "Answer", "arguments": {"n": 7}}\n</tool_call>')
    out = model.with_structured_output(Answer, method="function_calling").invoke("n?")
    assert out == Answer(n=7)
    assert h.sampler.calls and len(h.sampler.calls) == 1


def test_langchain_anthropic_tool_loop_and_stream(harness: Harness, seen: Seen) -> None:
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

    h = harness
    sid = _session(h)
    model = ChatAnthropic(model="tiny", base_url=h.server.root_url, api_key=sid, max_retries=0,  # type: ignore[call-arg,arg-type]
                          max_tokens=200)  # type: ignore[call-arg]
    h.clients.append(model._client)
    h.push(CALL, FINAL)
    with_tools = model.bind_tools([add])
    messages: list[BaseMessage] = [HumanMessage("What is 2 + 3?")]
    ai = with_tools.invoke(messages)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("add", {"a": 2, "b": 3})]  # type: ignore[attr-defined]
    messages.append(ai)
    for call in ai.tool_calls:  # type: ignore[attr-defined]
        messages.append(ToolMessage(str(add(**call["args"])), tool_call_id=call["id"]))
    final = with_tools.invoke(messages)
    assert final.text == FINAL if isinstance(final.text, str) else final.text() == FINAL  # type: ignore[operator]
    _one_row(h, sid, [CALL, FINAL])
    sid = _session(h)
    model = ChatAnthropic(model="tiny", base_url=h.server.root_url, api_key=sid, max_retries=0)  # type: ignore[call-arg,arg-type]
    h.clients.append(model._client)
    h.push("Hello there.")
    assert "".join(str(c.content if isinstance(c.content, str) else "".join(
        p.get("text", "") for p in c.content if isinstance(p, dict))) for c in model.stream("hi")) == "Hello there."
    assert {"max_tokens", "model"} <= seen.keys() and "stream" in seen.keys()


# ---------------------------------------------------------------- pydantic-ai


def test_pydantic_ai_openai_tool_loop_stream_and_tool_output(harness: Harness, seen: Seen) -> None:
    import openai
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    h = harness

    class Answer(BaseModel):
        n: int

    async def run(sid: str, prompt: str, *, stream: bool = False, **kw: Any) -> Any:
        # The client is the test's, closed in the loop that used it.
        async with openai.AsyncOpenAI(base_url=h.server.base_url, api_key=sid, max_retries=0) as client:
            agent = Agent(OpenAIChatModel("tiny", provider=OpenAIProvider(openai_client=client)), **kw)
            if not stream:
                return (await agent.run(prompt)).output
            async with agent.run_stream(prompt) as streamed:
                return await streamed.get_output()

    sid = _session(h)
    h.push(CALL, FINAL)
    assert asyncio.run(run(sid, "What is 2 + 3?", tools=[add])) == FINAL
    _one_row(h, sid, [CALL, FINAL])

    sid = _session(h)
    h.push(CALL, FINAL)
    assert asyncio.run(run(sid, "What is 2 + 3?", stream=True, tools=[add])) == FINAL
    _one_row(h, sid, [CALL, FINAL])

    sid = _session(h)
    h.push('<tool_call>\n{"name": "final_result", "arguments": {"n": 5}}\n</tool_call>')
    assert asyncio.run(run(sid, "n?", output_type=Answer)) == Answer(n=5)
    assert [b.get("tool_choice") for b in seen.bodies][-1] == "required"
    assert {"stream_options", "tool_choice"} <= seen.keys()
    assert all(t["function"].get("strict") is True for t in seen.bodies[0]["tools"])


def test_pydantic_ai_anthropic_tool_loop(harness: Harness) -> None:
    import anthropic
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    h = harness
    sid = _session(h)
    h.push(CALL, FINAL)

    async def run() -> Any:
        async with anthropic.AsyncAnthropic(base_url=h.server.root_url, api_key=sid, max_retries=0) as client:
            model = AnthropicModel("tiny", provider=AnthropicProvider(anthropic_client=client))
            return (await Agent(model, tools=[add]).run("What is 2 + 3?")).output

    assert asyncio.run(run()) == FINAL
    _one_row(h, sid, [CALL, FINAL])


# ---------------------------------------------------------------- LiteLLM


@pytest.fixture
def litellm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Without it LiteLLM fetches its model price list from GitHub on import.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm as lib

    lib.suppress_debug_info = True
    yield lib
    # LiteLLM caches the HTTP clients it made; close the synchronous ones (their connections
    # would otherwise be collected later, in another test, as unclosed-socket warnings).
    cache = getattr(lib, "in_memory_llm_clients_cache", None)
    for client in list(getattr(cache, "cache_dict", {}).values()):
        close = getattr(client, "close", None)
        if callable(close) and not inspect.iscoroutinefunction(close):
            close()


def _litellm_loop(lib: Any, h: Harness, sid: str, model: str, base: str) -> None:
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                               "parameters": ADD_SCHEMA}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    first = lib.completion(model=model, api_base=base, api_key=sid, messages=messages, tools=tools)
    message = first.choices[0].message
    (call,) = message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    second = lib.completion(model=model, api_base=base, api_key=sid, messages=messages, tools=tools)
    assert second.choices[0].message.content == FINAL


def test_litellm_openai_and_anthropic_providers(harness: Harness, litellm: Any, seen: Seen) -> None:
    h = harness
    sid = _session(h)
    h.push(CALL, FINAL)
    _litellm_loop(litellm, h, sid, "openai/tiny", h.server.base_url)
    _one_row(h, sid, [CALL, FINAL])
    h.push("Hello there.")
    chunks = list(litellm.completion(model="openai/tiny", api_base=h.server.base_url, api_key=_session(h),
                                     messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello there."
    sid = _session(h)
    h.push(CALL, FINAL)
    _litellm_loop(litellm, h, sid, "anthropic/tiny", h.server.root_url)
    _one_row(h, sid, [CALL, FINAL])
    assert "max_tokens" in seen.keys()
