"""A stand-in of SGLang's native ``POST /generate`` (behind sgl-router) for the HTTP tier.

SGLang needs a GPU and slime's patched build, a network edge these machines
cannot reach. This starlette app speaks the same shapes (research notes
verl-slime.md section 3): ``{"rid", "input_ids", "sampling_params":
{"max_new_tokens", "stop_token_ids", ...}, "return_logprob": true}`` in,
``{"text", "meta_info": {"id", "finish_reason": {"type"}, "prompt_tokens",
"completion_tokens", "output_token_logprobs": [[logprob, id, null], ...],
"weight_version"}}`` out, plus ``/health`` and ``/abort_request``. The
"model" is a rule over the decoded prompt (``policy``), and every request is
recorded so tests can check that what was served is what was trained.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass
class Served:
    """One /generate call as the server saw and answered it."""

    input_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    routing_key: str | None
    sampling_params: dict[str, Any]


@dataclass
class StandIn:
    tokenizer: Any
    policy: Callable[[str, int], str]
    """(decoded prompt, request number) -> reply text (EOS appended)."""
    served: list[Served] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        async def generate(request: Request) -> JSONResponse:
            body = await request.json()
            ids = [int(t) for t in body["input_ids"]]
            sp = dict(body.get("sampling_params") or {})
            n = len(self.served)
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            out = list(self.tokenizer.encode(self.policy(text, n), add_special_tokens=False))
            out.append(int(self.tokenizer.eos_token_id))
            stops = {
                int(self.tokenizer.eos_token_id),
                *(int(t) for t in sp.get("stop_token_ids") or []),
            }
            finish = "length"
            for i, t in enumerate(out):
                if t in stops:
                    out, finish = out[: i + 1], "stop"
                    break
            limit = int(sp.get("max_new_tokens", len(out)))
            if len(out) > limit:
                out, finish = out[:limit], "length"
            lps = [-((t * 13 + i * 7 + n) % 89 + 1) / 50.0 for i, t in enumerate(out)]
            self.served.append(Served(ids, out, lps, request.headers.get("x-smg-routing-key"), sp))
            await asyncio.sleep(0)
            return JSONResponse(
                {
                    "text": self.tokenizer.decode(out),
                    "meta_info": {
                        "id": body.get("rid", f"r{n}"),
                        "finish_reason": {"type": finish},
                        "prompt_tokens": len(ids),
                        "completion_tokens": len(out),
                        "cached_tokens": 0,
                        "output_token_logprobs": [
                            [lp, t, None] for lp, t in zip(lps, out, strict=True)
                        ],
                        "weight_version": "3",
                    },
                }
            )

        async def health(_: Request) -> JSONResponse:
            return JSONResponse({})

        async def abort(request: Request) -> JSONResponse:
            self.aborted.append(str((await request.json()).get("rid")))
            return JSONResponse({})

        return Starlette(
            routes=[
                Route("/generate", generate, methods=["POST"]),
                Route("/health", health, methods=["GET"]),
                Route("/abort_request", abort, methods=["POST"]),
            ]
        )


@contextmanager
def serve(standin: StandIn) -> Iterator[int]:
    """Run the stand-in on 127.0.0.1 in a thread; yields its port."""
    config = uvicorn.Config(
        standin.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "SGLang stand-in did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield int(port)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
