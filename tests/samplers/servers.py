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

  For the weight path it behaves as the engines do, as read in their sources:
  vLLM's ``POST /collective_rpc`` (``update_config``, ``reload_weights``) and
  ``POST /reset_prefix_cache``, which refuses with 409 while running requests
  hold KV blocks unless ``?reset_running_requests=true`` preempts them (or, as
  vLLM builds before that check did, answers 200 without resetting); SGLang's
  ``POST /update_weights_from_disk`` and ``GET /get_weight_version``, and
  ``meta_info.weight_version`` as a string, ``"default"`` for its launch
  weights; and ``restart()``, after which it serves its launch weights again.
  Each generate request records the weights it was served with.

  vLLM's RL pause API (dev mode, ``vllm/entrypoints/serve/dev/rlhf/api_router.py``
  and docs/training/async_rl.md in vLLM): ``POST /pause?mode=abort|wait|keep&clear_cache=``
  answers ``{"status": "paused"}`` once ``abort`` ended the running requests, which
  answer their tokens so far with finish reason ``abort``; requests arriving while
  paused are not scheduled until ``POST /resume`` (``{"status": "resumed"}``). Mode
  ``decode`` generates like an engine for that: one token per ``tick_s``, each id and
  logprob a function of the weights served and the token's position in the sequence,
  so a generation continued after an abort shows which weights sampled each token.

  Sleep mode, as the engines serve it: vLLM's ``POST /sleep?level=N``, ``POST /wake_up``
  and ``GET /is_sleeping`` (dev mode, ``vllm/entrypoints/serve/dev/sleep/api_router.py``:
  200 with no body, ``{"is_sleeping": bool}``); SGLang's ``POST /release_memory_occupation``
  and ``POST /resume_memory_occupation`` (``http_server.py``). ``sleep_mode`` says how it
  behaves: ``ok``, ``off`` (started without ``--enable-sleep-mode``: the sleep answers 500),
  ``no_wake`` (the wake answers 500 and the engine stays asleep). While asleep a generate
  request answers 503, as vLLM's protected routes do, and is recorded in ``asleep_hits``.

  With ``upstream`` (a real local inference server) and ``raw_logprobs_from`` (the
  backend behind it) it stands in for vLLM in its default ``raw_logprobs`` mode:
  tokens sampled upstream at the requested settings, logprobs reported as the
  raw model's (temperature 1, no top-k/top-p) for those tokens.
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
    """ok | http500 | malformed | no_logprobs | hang | hold | abort_finish | decode. ``hold``: a
    generate request runs (holding KV blocks) until ``release`` is set; ``decode``: see
    the module docstring."""
    health_status: int = 200
    tokens: list[int] = field(default_factory=lambda: [5, 6, 7])
    weight_version: Any = None
    routed_experts: Any = None
    hits: list[Hit] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    """Set when a generate request arrives (thread-safe: tests wait from another loop)."""
    release: threading.Event = field(default_factory=threading.Event)
    """Ends the requests ``hold`` keeps running."""
    reset: str = "checked"
    """How ``/reset_prefix_cache`` answers while requests run: ``checked`` (409 unless
    ``reset_running_requests=true``, as vLLM does now), ``silent`` (200 without resetting,
    as older vLLM did) or ``broken`` (409 always)."""
    weights: str = "launch"
    """What it serves: ``launch`` or the last directory loaded."""
    running: int = 0
    """Generate requests in progress (they hold KV blocks)."""
    resets: list[str] = field(default_factory=list)
    """Query of each prefix-cache reset that happened."""
    preempted: int = 0
    """Running requests preempted by ``reset_running_requests=true``."""
    served_with: list[str] = field(default_factory=list)
    """``weights`` each generate request was answered with."""
    upstream: str = ""
    """Forward vLLM generate requests to this server (see the module docstring)."""
    raw_logprobs_from: Any = None
    """The backend that scores the upstream's tokens as the raw model (its ``forward``);
    None: the upstream's own logprobs pass through."""
    tick_s: float = 0.01
    """``decode``: seconds per generated token."""
    paused: bool = False
    """Between ``POST /pause`` and ``POST /resume``: nothing new is scheduled."""
    pause_api: bool = True
    """False: a vLLM without the pause API (``/pause`` and ``/resume`` answer 404)."""
    pauses: list[str] = field(default_factory=list)
    """Query of each ``POST /pause``."""
    paused_hits: list[str] = field(default_factory=list)
    """Paths of generate requests that arrived while paused (a held sampler sends none)."""
    reload_s: float = 0.0
    """Seconds ``reload_weights`` takes (a real reload takes seconds to minutes)."""
    reload_gate: threading.Event | None = None
    """If given, ``reload_weights`` waits until it is set: a test holds the push (and the
    pause around it) open for as long as it needs, not for a guessed time."""
    sleep_mode: str = "ok"
    """ok | off | no_wake (see the module docstring)."""
    sleeping: bool = False
    """Between a sleep (or memory release) and a wake that worked."""
    asleep_hits: list[str] = field(default_factory=list)
    """Paths of generate requests that arrived while asleep (each answered 503)."""
    events: list[str] | None = None
    """A log shared with the test (``"<name>:<path>"`` per request) to check the order of calls."""
    _aborts: int = 0
    """Bumped by ``/pause?mode=abort``: running ``decode`` requests end at their next token."""
    _reload_path: str = ""

    @staticmethod
    def decoded(weights: str, position: int) -> tuple[int, float]:
        """The token and logprob ``decode`` samples at ``position`` under ``weights``."""
        launch = weights == "launch"
        return (100 if launch else 200) + position % 50, (-0.25 if launch else -0.75)

    def restart(self) -> None:
        """What a restarted engine does: its launch weights, and version ``"default"``."""
        self.weights = "launch"
        self._reload_path = ""
        if self.weight_version is not None:
            self.weight_version = "default"

    def log(self, path: str) -> None:
        if self.events is not None:
            self.events.append(f"{self.name}:{path}")

    def generate_hits(self) -> list[Hit]:
        return [
            h
            for h in self.hits
            if h.path in ("/generate", "/inference/v1/generate", "/v1/completions")
        ]

    async def _raw_logprobs(self, path: str, body: dict[str, Any]) -> Response:
        import httpx

        from core.types import Datum

        async with httpx.AsyncClient(timeout=60) as client:
            answer = (await client.post(self.upstream + path, json=body)).json()
        choice = answer["choices"][0]
        prompt, ids = list(body["token_ids"]), list(choice["token_ids"])
        if ids and self.raw_logprobs_from is not None:  # None: the upstream's own logprobs
            seq = prompt + ids
            datum = Datum(model_input=seq[:-1], target_tokens=seq[1:], logprobs=[0.0] * (len(seq) - 1),
                          advantages=[0.0] * (len(seq) - 1), weights=[1.0] * (len(seq) - 1))
            scored = await self.raw_logprobs_from.forward([datum], "importance_sampling", {"temperature": 1.0})
            raw = scored.logprobs[0][-len(ids) :]
            choice["logprobs"] = {"content": [{"logprob": lp} for lp in raw]}
        return JSONResponse(answer)

    def app(self) -> Starlette:
        async def generate(request: Request) -> Response:
            body = await request.json()
            self.hits.append(Hit(request.url.path, dict(request.headers), body))
            self.log(request.url.path)
            if self.paused:
                self.paused_hits.append(request.url.path)
            if self.sleeping:
                self.asleep_hits.append(request.url.path)
                return JSONResponse({"error": {"message": "model is sleeping"}}, status_code=503)
            self.started.set()
            if self.mode == "decode":
                return await decode(body)
            self.running += 1
            try:
                if self.mode == "hang":
                    await asyncio.sleep(5)  # longer than any test waits; ends on its own
                while self.mode == "hold" and not self.release.is_set():
                    await asyncio.sleep(0.01)
            finally:
                self.running -= 1
            self.served_with.append(self.weights)
            if self.upstream:
                return await self._raw_logprobs(request.url.path, body)
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

        async def decode(body: dict[str, Any]) -> Response:
            while self.paused:  # not scheduled until /resume
                await asyncio.sleep(0.002)
            sampling = body.get("sampling_params") or body
            prompt = body.get("token_ids") or body.get("prompt") or []
            aborts, ids, lps, finish = self._aborts, [], [], "length"
            self.running += 1
            try:
                while len(ids) < int(sampling["max_tokens"]):
                    await asyncio.sleep(self.tick_s)  # one decode step
                    if self._aborts != aborts:
                        finish = "abort"
                        break
                    token, logprob = self.decoded(self.weights, len(prompt) + len(ids))
                    ids.append(token)
                    lps.append(logprob)
            finally:
                self.running -= 1
            self.served_with.append(self.weights)
            choice = {"index": 0, "token_ids": ids, "finish_reason": finish,
                      "logprobs": {"content": [{"logprob": lp} for lp in lps]}}
            if self.routed_experts is not None:  # opaque: says which weights and how many tokens
                choice["routed_experts"] = f"{self.routed_experts}:{self.weights}:{len(ids)}"
            return JSONResponse({"request_id": body.get("request_id"), "choices": [choice]})

        async def pause(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {"query": request.url.query}))
            if not self.pause_api:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            self.pauses.append(request.url.query)
            self.paused = True
            if request.query_params.get("mode", "abort") == "abort":
                self._aborts += 1
                while self.running:  # vLLM answers once the aborted requests have ended
                    await asyncio.sleep(0.002)
            return JSONResponse({"status": "paused"})

        async def resume(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {}))
            if not self.pause_api:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            self.paused = False
            return JSONResponse({"status": "resumed"})

        async def abort(request: Request) -> Response:
            body = await request.json()
            self.hits.append(Hit(request.url.path, dict(request.headers), body))
            self.aborted.append(body["rid"])
            return Response(status_code=200)

        async def health(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {}))
            return Response(status_code=self.health_status)

        async def collective_rpc(request: Request) -> Response:
            body = await request.json()
            self.hits.append(Hit(request.url.path, dict(request.headers), body))
            self.log(request.url.path)
            if body.get("method") == "update_config":
                self._reload_path = body["args"][0]["model_config"]["model"]
            elif body.get("method") == "reload_weights" and self._reload_path:
                await asyncio.sleep(self.reload_s)
                while self.reload_gate is not None and not self.reload_gate.is_set():
                    await asyncio.sleep(0.002)
                self.weights = self._reload_path
            else:
                return JSONResponse({"error": f"bad call {body!r}"}, status_code=400)
            return JSONResponse({"results": [None]})

        async def reset_prefix_cache(request: Request) -> Response:
            query = request.url.query
            self.hits.append(Hit(request.url.path, dict(request.headers), {"query": query}))
            preempt = request.query_params.get("reset_running_requests") == "true"
            if self.reset == "broken" or (self.running and not preempt):
                if self.reset == "silent":
                    return Response(status_code=200)  # older vLLM: the refusal was not reported
                return JSONResponse({"detail": "Prefix cache reset failed."}, status_code=409)
            if preempt:
                self.preempted += self.running
            self.resets.append(query)
            return Response(status_code=200)

        async def update_weights_from_disk(request: Request) -> Response:
            body = await request.json()
            self.hits.append(Hit(request.url.path, dict(request.headers), body))
            self.log(request.url.path)
            self.weights = body["model_path"]
            self.weight_version = body.get("weight_version")
            return JSONResponse({"success": True, "message": "ok", "num_paused_requests": 0})

        async def get_weight_version(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {}))
            return JSONResponse({"weight_version": self.weight_version})

        async def sleep(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {"query": request.url.query}))
            self.log(request.url.path)
            if self.sleep_mode == "off":
                return JSONResponse({"error": "Sleep mode is not enabled"}, status_code=500)
            self.sleeping = True
            return Response(status_code=200)

        async def wake(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {"query": request.url.query}))
            self.log(request.url.path)
            if self.sleep_mode == "no_wake":
                return JSONResponse({"error": "CUDA out of memory"}, status_code=500)
            self.sleeping = False
            return Response(status_code=200)

        async def is_sleeping(request: Request) -> Response:
            self.hits.append(Hit(request.url.path, dict(request.headers), {}))
            return JSONResponse({"is_sleeping": self.sleeping})

        return Starlette(
            routes=[
                Route("/sleep", sleep, methods=["POST"]),
                Route("/wake_up", wake, methods=["POST"]),
                Route("/is_sleeping", is_sleeping, methods=["GET"]),
                Route("/release_memory_occupation", sleep, methods=["POST"]),
                Route("/resume_memory_occupation", wake, methods=["POST"]),
                Route("/generate", generate, methods=["POST"]),
                Route("/inference/v1/generate", generate, methods=["POST"]),
                Route("/abort_request", abort, methods=["POST"]),
                Route("/health", health, methods=["GET"]),
                Route("/collective_rpc", collective_rpc, methods=["POST"]),
                Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
                Route("/pause", pause, methods=["POST"]),
                Route("/resume", resume, methods=["POST"]),
                Route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"]),
                Route("/get_weight_version", get_weight_version, methods=["GET"]),
            ]
        )
