"""The lean dispatch of the turn routes and the task-free disconnect watch.

Requests go through ``httpx.ASGITransport`` into the real app, except where a
client disconnect must be staged at an exact moment: there the ASGI
``receive`` channel (the network edge) is hand-written, as the tests say.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from core.gateway import Gateway, GatewayConfig, build_app
from core.gateway.fastpath import DisconnectWatch
from core.samplers import ScriptedSampler, encode_reply
from core.types import SamplingParams

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _gateway(tok: Any, config: GatewayConfig | None = None) -> tuple[Gateway, ScriptedSampler]:
    sampler = ScriptedSampler(default=encode_reply(tok, "hello"), tokenizer=tok)
    return Gateway(
        tokenizer=tok, sampler=sampler, config=config or GatewayConfig(), model_id="tiny"
    ), sampler


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(gw)), base_url="http://gw")


def test_turn_routes_on_the_lean_path_match_starlette_routing(byte_tokenizer: Any) -> None:
    """Session in the path or the key, both dialects, /v1/v1; malformed prefixes are 404, GET is 405."""
    gw, _ = _gateway(byte_tokenizer)

    async def main() -> None:
        sid = gw.create_session(sampling=SamplingParams(max_tokens=16))
        async with _client(gw) as c:
            r = await c.post(f"/sessions/{sid}/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello"
            r = await c.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {sid}"}
            )
            assert r.status_code == 200
            body = {**CHAT, "max_tokens": 16}
            for path in ("/v1/messages", "/v1/v1/messages", f"/sessions/{sid}/v1/messages"):
                r = await c.post(path, json=body, headers={"x-api-key": sid})
                assert r.status_code == 200 and r.json()["content"][0]["text"] == "hello", path
            for path in (
                "/sessions//v1/chat/completions",
                f"/sessions/{sid}/x/v1/chat/completions",
            ):
                r = await c.post(path, json=CHAT, headers={"authorization": f"Bearer {sid}"})
                assert r.status_code == 404 and "no route" in r.json()["error"]["message"], path
            r = await c.get("/v1/chat/completions", headers={"authorization": f"Bearer {sid}"})
            assert r.status_code == 405 and "error" in r.json()
            r = await c.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer nope"}
            )
            assert r.status_code == 401
        # Each request restarted the conversation: five one-turn rows, all recorded.
        assert [len(row.turns) for row in gw.finish_session(sid)] == [1] * 5

    asyncio.run(main())


def test_streamed_oversized_body_without_length_is_413(byte_tokenizer: Any) -> None:
    """No content-length (chunked upload): the limit is enforced while reading."""
    gw, sampler = _gateway(byte_tokenizer, GatewayConfig(max_body_bytes=1000))

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b" " * 100

    async def main() -> None:
        sid = gw.create_session()
        async with _client(gw) as c:
            r = await c.post(
                "/v1/chat/completions", content=chunks(), headers={"authorization": f"Bearer {sid}"}
            )
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]
        assert sampler.calls == []

    asyncio.run(main())


async def _raw_turn(app: Any, sid: str, receive: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {sid}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    await app(scope, receive, send)
    return sent


def test_client_gone_before_the_turn_starts_gets_no_turn(byte_tokenizer: Any) -> None:
    """Fake edge: the client's disconnect is already queued behind its body, so no sampler call is made."""
    gw, sampler = _gateway(byte_tokenizer)
    messages = [{"type": "http.request", "body": json.dumps(CHAT).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def main() -> None:
        sid = gw.create_session()
        sent = await _raw_turn(build_app(gw), sid, receive)
        assert sent[0]["status"] == 499
        assert sampler.calls == [] and gw.session(sid).turns == []
        assert gw.session(sid).counters["disconnected_turns"] == 0  # nothing was started

    asyncio.run(main())


def test_disconnect_mid_sampling_cancels_and_a_normal_turn_leaves_no_watcher(
    byte_tokenizer: Any,
) -> None:
    """Fake edge: the disconnect arrives while the sampler is busy; then a turn whose client stays."""
    gw, sampler = _gateway(byte_tokenizer)
    sampler.delay_s = 5.0
    gone = asyncio.Event()
    waiting: list[asyncio.Event] = []

    def receiver(disconnect: asyncio.Event) -> Any:
        messages = [{"type": "http.request", "body": json.dumps(CHAT).encode(), "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            waiting.append(disconnect)
            await disconnect.wait()
            return {"type": "http.disconnect"}

        return receive

    async def main() -> None:
        app = build_app(gw)
        sid = gw.create_session()
        turn = asyncio.create_task(_raw_turn(app, sid, receiver(gone)))
        while not sampler.calls:
            await asyncio.sleep(0.01)
        gone.set()
        sent = await asyncio.wait_for(turn, 2.0)  # well before the 5 s sampler delay
        assert sent[0]["status"] == 499
        assert gw.session(sid).counters["disconnected_turns"] == 1 and gw.session(sid).turns == []
        sampler.delay_s = 0.0
        stays = asyncio.Event()
        sent = await _raw_turn(app, sid, receiver(stays))
        assert sent[0]["status"] == 200 and len(gw.session(sid).turns) == 1
        # The watch let go of the channel: nobody waits on the second client's event any more.
        assert not stays._waiters  # type: ignore[attr-defined]

    asyncio.run(main())


@pytest.mark.parametrize("bare_yield", [False, True])
def test_disconnect_watch_calls_back_once_and_close_stops_it(bare_yield: bool) -> None:
    """The hand-driven receive(): future-based and bare-yield (sleep(0)) channels both work."""

    async def main() -> None:
        calls: list[str] = []
        event = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if bare_yield:
                while not event.is_set():
                    await asyncio.sleep(0)
            else:
                await event.wait()
            return {"type": "http.disconnect"}

        watch = DisconnectWatch(receive, lambda: calls.append("gone"))
        await asyncio.sleep(0.01)
        assert calls == []
        event.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == ["gone"]
        watch.close()

        closed = asyncio.Event()
        watch = DisconnectWatch(lambda: closed.wait(), lambda: calls.append("late"))  # type: ignore[arg-type,return-value]
        watch.close()
        closed.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == ["gone"] and not closed._waiters  # type: ignore[attr-defined]

    asyncio.run(main())


def test_disconnect_watch_accepts_a_receive_returning_a_plain_future() -> None:
    """Some ASGI servers hand back a future from ``receive()`` rather than a coroutine."""

    async def main() -> None:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        calls: list[str] = []
        watch = DisconnectWatch(lambda: future, lambda: calls.append("gone"))
        await asyncio.sleep(0)
        assert calls == []
        future.set_result({"type": "http.disconnect"})
        for _ in range(3):
            await asyncio.sleep(0)
        assert calls == ["gone"]
        watch.close()

    asyncio.run(main())
