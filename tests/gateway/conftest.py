"""Fixtures: a real gateway on uvicorn (127.0.0.1, free port) in a background loop.

The server runs in its own thread and event loop so tests can drive it with
the synchronous SDK clients as well as the async ones (``asyncio.run``).
Samplers are scripted: the model is the only thing faked, because a real
model's output cannot be scripted; everything else is the real stack.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.gateway import Gateway, GatewayConfig, GatewayServer
from core.samplers import ScriptedSampler, encode_reply
from core.types import SamplingParams


@dataclass
class Harness:
    """A served gateway plus helpers."""

    gw: Gateway
    sampler: ScriptedSampler
    server: GatewayServer
    tok: Any
    loop: asyncio.AbstractEventLoop
    closers: list[Callable[[], None]] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)

    def session(self, **kw: Any) -> str:
        kw.setdefault("sampling", SamplingParams(max_tokens=64))
        return self.call(self.gw.create_session, **kw)

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run a gateway method on the server's loop (the gateway is single-threaded)."""

        async def run() -> Any:
            return fn(*args, **kw)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def reply(self, text: str, *, eos: bool = True) -> list[int]:
        return encode_reply(self.tok, text, eos=eos)

    def push(self, *texts: str) -> None:
        self.sampler.push(*(self.reply(t) for t in texts))

    def openai(self, sid: str, **kw: Any) -> Any:
        import openai

        kw.setdefault("max_retries", 0)
        kw.setdefault("base_url", self.server.base_url)
        client = openai.OpenAI(api_key=sid, **kw)
        self.clients.append(client)
        return client

    def anthropic(self, sid: str, base_url: str | None = None, **kw: Any) -> Any:
        import anthropic

        kw.setdefault("max_retries", 0)
        client = anthropic.Anthropic(base_url=base_url or self.server.root_url, api_key=sid, **kw)
        self.clients.append(client)
        return client


def _serve(gw: Gateway) -> tuple[GatewayServer, asyncio.AbstractEventLoop, Callable[[], None]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = GatewayServer(gw, host="127.0.0.1", port=0)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)

    def close() -> None:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return server, loop, close


@pytest.fixture
def make_harness(byte_tokenizer: Any) -> Iterator[Callable[..., Harness]]:
    """Factory: ``make_harness(config=GatewayConfig(...), tokenizer=..., sampler=...)``."""
    made: list[Harness] = []

    def make(
        config: GatewayConfig | None = None,
        tokenizer: Any = None,
        sampler: ScriptedSampler | None = None,
        generation_config: Any = None,
    ) -> Harness:
        tok = tokenizer or byte_tokenizer
        sampler = sampler or ScriptedSampler(tokenizer=tok)
        gw = Gateway(
            tokenizer=tok, sampler=sampler, config=config or GatewayConfig(), model_id="tiny",
            generation_config=generation_config,
        )
        server, loop, close = _serve(gw)
        h = Harness(gw, sampler, server, tok, loop, [close])
        made.append(h)
        return h

    yield make
    for h in made:
        for client in h.clients:
            client.close()
        for close in h.closers:
            close()


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """A linear-mode gateway with the byte-level tiny tokenizer."""
    return make_harness()


CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
