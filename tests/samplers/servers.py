"""Servers the sampler tests talk to, each on 127.0.0.1 in a background thread.

- ``BackgroundLoop``: an event loop in a thread; servers live there so a test's
  own ``asyncio.run`` drives the samplers over real sockets.
- ``StandIn``: a small starlette app that stands in for the inference
  engine's HTTP edge (vLLM's ``/inference/v1/generate`` and SGLang's
  ``/generate``) and can be told to misbehave: answer 500, malformed JSON,
  no logprobs, hang, or fail its health check. It is a fake at a network edge
  we cannot reach in CI (no vLLM or SGLang install, no GPU), and it records
  every request so tests can check headers, request ids and aborts. Happy-path
  tests use the real local inference server (``tracerl_local.serve``) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

T = TypeVar("T")


class BackgroundLoop:
    """An asyncio loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def drain() -> None:  # e.g. a stand-in still "hanging": cancel, don't orphan
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(drain(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class UvicornApp:
    """uvicorn serving an ASGI app on a free 127.0.0.1 port (call from the loop's thread)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # type: ignore[no-untyped-def]
                yield

        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                raise RuntimeError(f"stand-in server failed: {self._task.exception()!r}")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task


def dead_url() -> str:
    """A 127.0.0.1 URL on which nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class Hit:
    """One request the stand-in received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class StandIn:
    """Behaviour and records of one stand-in engine (see the module docstring)."""

    name: str = "standin"
    mode: str = "ok"
    """ok | http500 | malformed | no_logprobs | hang | abort_finish."""
    health_status: int = 200
    tokens: list[int] = field(default_factory=lambda: [5, 6, 7])
    weight_version: Any = None
    routed_experts: Any = None
    hits: list[Hit] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    """Set when a generate request arrives (thread-safe: tests wait from another loop)."""

    def generate_hits(self) -> list[Hit]:
        return [
            h
            for h in self.hits
            if h.path in ("/generate", "/inference/v1/generate", "/v1/completions")
        ]

    def app(self) -> Starlette:
        async def generate(request: Request) -> Response:
            body = await request.json()
            self.hits.append(Hit(request.url.path, dict(request.headers), body))
            self.started.set()
            if self.mode == "hang":
                await asyncio.sleep(5)  # longer than any test waits; ends on its own
            if self.mode == "http500":
                return JSONResponse(
                    {"error": {"message": "CUDA error: device-side assert"}}, status_code=500
                )
            if self.mode == "malformed":
                return Response('{"meta_info": {"output_token_', media_type="application/json")
            ids = list(self.tokens)
            lps = [-0.5 - i for i in range(len(ids))]
            finish = "abort" if self.mode == "abort_finish" else "length"
            if request.url.path == "/generate":
                meta: dict[str, Any] = {"id": body.get("rid"), "finish_reason": {"type": finish}}
                if self.mode != "no_logprobs":
                    meta["output_token_logprobs"] = [
                        [lp, t, None] for lp, t in zip(lps, ids, strict=True)
                    ]
                if self.weight_version is not None:
                    meta["weight_version"] = self.weight_version
                if self.routed_experts is not None:
                    meta["routed_experts"] = self.routed_experts
                return JSONResponse({"text": self.name, "meta_info": meta})
            choice: dict[str, Any] = {"index": 0, "token_ids": ids, "finish_reason": finish}
            if self.mode != "no_logprobs":
                choice["logprobs"] = {"content": [{"logprob": lp} for lp in lps]}
            if self.routed_experts is not None:
                choice["routed_experts"] = self.routed_experts
            return JSONResponse({"request_id": body.get("request_id"), "choices": [choice]})

        async def abort(request: Request) -> Response:
            body = await request.json()
            self.hits.append(Hit(request.url.path, dict(request.headers), body))
            self.aborted.append(body["rid"])
            return Response(status_code=200)

        async def health(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {}))
            return Response(status_code=self.health_status)

        return Starlette(
            routes=[
                Route("/generate", generate, methods=["POST"]),
                Route("/inference/v1/generate", generate, methods=["POST"]),
                Route("/abort_request", abort, methods=["POST"]),
                Route("/health", health, methods=["GET"]),
            ]
        )
