"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1, for tests.

A fake at the network edge: it stands in for a hosted model or an LLM judge we
cannot reach from the test machine. ``reply(body) -> str | (status, text)`` decides
each answer (after ``delay_s``); every request body is kept in ``requests``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

Reply = Callable[[dict[str, Any]], "str | tuple[int, str]"]


class ScriptedOpenAI:
    """``with ScriptedOpenAI(reply) as server: server.base_url`` serves ``/v1/chat/completions``."""

    def __init__(self, reply: Reply, *, delay_s: float = 0.0) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        """Most requests being answered at once (each takes ``delay_s``)."""

        async def chat(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            self.auth.append(request.headers.get("authorization", ""))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(delay_s)
            finally:
                self.in_flight -= 1
            answer = self.reply(body)
            # One request per connection: no keep-alive socket outlives the server's loop.
            close = {"connection": "close"}
            if isinstance(answer, tuple):
                return PlainTextResponse(answer[1], status_code=answer[0], headers=close)
            return JSONResponse(
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
                headers=close,
            )

        self.app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted endpoint did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
