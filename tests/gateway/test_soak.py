"""Soak: sessions from three real client libraries interleaved on one gateway end in exactly
the rows each gets alone (issue #29, "One session changes another's trace").

The clients are the real ``openai`` SDK (chat completions), the real ``anthropic`` SDK
(messages) and LangChain's ``ChatOpenAI`` (``langchain-openai``, which shapes tools its
own way: ``properties`` before ``type``), all async, against one real gateway (uvicorn on
127.0.0.1). Each plays the same conversations: several turns, the whole history resent
each turn, tool calls (one and two at once) answered with tool results, a system prompt
or none. First each (client, conversation) runs alone on a fresh gateway; then hundreds of
sessions of all of them run at once, shuffled, on one gateway, and every session must end
in the same rows (count, token ids, loss mask, logprobs, turn spans) as its alone run.
Shared render state (the anchor cache matched by ``==`` let one client's tool JSON fork
another client's session into two rows) fails this test.

Only the model is scripted (``ScriptedSampler``, per session): a real model's output
cannot be scripted, and a fast deterministic reply keeps hundreds of sessions in seconds.
1,000 sessions take about 20 s of CPU, imports aside (the gateway and the clients share
one process), so the soak is part of the default run.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from core.samplers import ScriptedSampler
from core.types import SamplingParams
from tests.gateway.conftest import Harness


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS: dict[str, Callable[[int, int], int]] = {"add": add, "mul": mul}
_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
           "required": ["a", "b"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "description": f.__doc__, "parameters": _SCHEMA}}
                for n, f in TOOLS.items()]
ANTHROPIC_TOOLS = [{"name": n, "description": f.__doc__, "input_schema": _SCHEMA} for n, f in TOOLS.items()]


def _call(name: str, a: int, b: int) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


@dataclass(frozen=True)
class Conversation:
    """A conversation every client plays: its user turns and the model's scripted replies."""

    name: str
    """Names the conversation in failure messages."""
    system: str | None
    """The system prompt, if any."""
    users: tuple[str, ...]
    """The user messages; after each, the client calls tools until the model answers in text."""
    replies: tuple[str, ...]
    """What the model says, turn by turn (tool calls and answers)."""


CONVERSATIONS = (
    Conversation("two questions, a tool each", None, ("What is 2 + 3?", "And 4 times 5?"),
                 (_call("add", 2, 3), "2 + 3 = 5.", _call("mul", 4, 5), "4 times 5 is 20.")),
    Conversation("two calls at once", "You are a calculator.", ("Add 1 and 2, and multiply 3 by 4.",),
                 (_call("add", 1, 2) + "\n" + _call("mul", 3, 4), "3 and 12.")),
    Conversation("chat with tools offered", "Be brief.", ("Hi.", "What can you do?", "Then add 7 and 8."),
                 ("Hello.", "I can add and multiply.", _call("add", 7, 8), "15.")),
)


class Clients:
    """One async client per library for the whole test, as an agent fleet would hold them
    (each session its own key, each gateway its own base URL; one connection pool each)."""

    def __init__(self) -> None:
        self.h: Harness | None = None
        self.openai = openai.AsyncOpenAI(api_key="-", max_retries=0)
        self.anthropic = anthropic.AsyncAnthropic(api_key="-", max_retries=0)
        self.langchain_http = httpx.AsyncClient(timeout=60)

    def serve(self, h: Harness) -> None:
        """Send the next sessions to ``h``'s gateway."""
        self.h = h

    async def aclose(self) -> None:
        await self.openai.close()
        await self.anthropic.close()
        await self.langchain_http.aclose()

    async def play_openai(self, sid: str, conv: Conversation) -> None:
        assert self.h is not None
        client = self.openai.with_options(base_url=self.h.server.base_url, api_key=sid)
        messages: list[dict[str, Any]] = [{"role": "system", "content": conv.system}] if conv.system else []
        for user in conv.users:
            messages.append({"role": "user", "content": user})
            while True:
                out = await client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                                           tools=OPENAI_TOOLS)  # type: ignore[arg-type]
                message = out.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    result = TOOLS[call.function.name](**json.loads(call.function.arguments))  # type: ignore[union-attr]
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})

    async def play_anthropic(self, sid: str, conv: Conversation) -> None:
        assert self.h is not None
        client = self.anthropic.with_options(base_url=self.h.server.root_url, api_key=sid)
        system: dict[str, Any] = {"system": conv.system} if conv.system else {}
        messages: list[dict[str, Any]] = []
        for user in conv.users:
            messages.append({"role": "user", "content": user})
            while True:
                out = await client.messages.create(model="tiny", max_tokens=200, messages=messages,  # type: ignore[arg-type]
                                                   tools=ANTHROPIC_TOOLS, **system)  # type: ignore[arg-type]
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]})
                uses = [b for b in out.content if b.type == "tool_use"]
                if not uses:
                    break
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": str(TOOLS[u.name](**u.input))}  # type: ignore[arg-type]
                    for u in uses]})

    async def play_langchain(self, sid: str, conv: Conversation) -> None:
        from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
        from langchain_openai import ChatOpenAI

        assert self.h is not None
        model = ChatOpenAI(model="tiny", base_url=self.h.server.base_url, api_key=sid,  # type: ignore[arg-type]
                           max_retries=0, http_async_client=self.langchain_http).bind_tools([add, mul])
        messages: list[BaseMessage] = [SystemMessage(conv.system)] if conv.system else []
        for user in conv.users:
            messages.append(HumanMessage(user))
            while True:
                ai = await model.ainvoke(messages)
                messages.append(ai)
                calls = ai.tool_calls  # type: ignore[attr-defined]
                if not calls:
                    break
                messages.extend(ToolMessage(str(TOOLS[c["name"]](**c["args"])), tool_call_id=c["id"]) for c in calls)


LIBRARIES = ("openai", "anthropic", "langchain")
Job = tuple[str, Conversation]


def _play(clients: Clients, job: Job, sid: str) -> Coroutine[Any, Any, None]:
    library, conv = job
    play = getattr(clients, f"play_{library}")
    return play(sid, conv)  # type: ignore[no-any-return]


def _start(h: Harness, conv: Conversation) -> str:
    sid = h.session(sampling=SamplingParams(max_tokens=200))
    h.sampler.push(*(h.reply(r) for r in conv.replies), session_id=sid)
    return sid


def _rows(h: Harness, sid: str) -> list[tuple[Any, ...]]:
    """What a session trains: each row's tokens, mask, logprobs and turn spans."""
    return [(r.token_ids, r.loss_mask, r.logprobs, r.prompt_length, [(t.start, t.end) for t in r.turns])
            for r in h.call(h.gw.finish_session, sid)]


async def _run(clients: Clients, jobs: list[Job], sids: list[str], concurrency: int) -> int:
    """Play ``jobs`` at most ``concurrency`` at once; the most sessions of all three
    libraries that were in flight together (0 if the three never overlapped)."""
    gate = asyncio.Semaphore(concurrency)
    in_flight = dict.fromkeys(LIBRARIES, 0)
    overlap = 0

    async def one(job: Job, sid: str) -> None:
        nonlocal overlap
        async with gate:
            in_flight[job[0]] += 1
            if all(in_flight.values()):
                overlap = max(overlap, sum(in_flight.values()))
            try:
                await _play(clients, job, sid)
            finally:
                in_flight[job[0]] -= 1

    await asyncio.gather(*(one(j, s) for j, s in zip(jobs, sids, strict=True)))
    return overlap


async def _alone(clients: Clients, h: Harness, job: Job) -> list[tuple[Any, ...]]:
    """The rows ``job`` gets alone on ``h``, a fresh gateway: one row, trained exactly on the replies."""
    clients.serve(h)
    sid = _start(h, job[1])
    await _run(clients, [job], [sid], 1)
    rows = _rows(h, sid)
    assert len(rows) == 1, (job[0], job[1].name, len(rows))
    tokens, mask, _, _, spans = rows[0]
    assert [tokens[s:e] for s, e in spans] == [h.reply(r) for r in job[1].replies], (job[0], job[1].name)
    assert [i for i, m in enumerate(mask) if m] == [i for s, e in spans for i in range(s, e)]
    return rows


async def _soak(make_harness: Callable[..., Harness], tokenizer: Any, sessions: int) -> None:
    clients = Clients()
    try:
        kinds: list[Job] = [(lib, conv) for conv in CONVERSATIONS for lib in LIBRARIES]
        expected = {(lib, conv.name): await _alone(clients, make_harness(), (lib, conv)) for lib, conv in kinds}
        jobs = [kinds[i % len(kinds)] for i in range(sessions)]
        random.Random(29).shuffle(jobs)
        h = make_harness(sampler=ScriptedSampler(tokenizer=tokenizer, record_calls=False))
        clients.serve(h)
        sids = [_start(h, conv) for _, conv in jobs]
        overlap = await _run(clients, jobs, sids, concurrency=64)
    finally:
        await clients.aclose()
    assert overlap >= 32, f"the three clients' sessions barely overlapped (at most {overlap} at once)"
    differ = [(lib, conv.name) for (lib, conv), sid in zip(jobs, sids, strict=True)
              if _rows(h, sid) != expected[(lib, conv.name)]]
    assert not differ, f"{len(differ)} of {sessions} sessions differ from their alone rows: {sorted(set(differ))}"


def soak(make_harness: Callable[..., Harness], tokenizer: Any, sessions: int) -> None:
    """Run ``sessions`` interleaved sessions on one gateway; each must match its alone rows."""
    asyncio.run(_soak(make_harness, tokenizer, sessions))


@pytest.mark.slow
def test_1000_sessions_of_three_clients_interleaved_match_their_alone_rows(
    make_harness: Any, byte_tokenizer: Any
) -> None:
    soak(make_harness, byte_tokenizer, 1000)
