"""Serve agentcore-rl-toolkit's ``RolloutGateway`` (the peer) on its own, for ``benchmarks/gateway_peer.py``.

    python benchmarks/peer_gateway.py --reply "Hello" --history-mode linear   # Qwen3's tokenizer, ChatML template
    python benchmarks/peer_gateway.py --tokenizer DIR --history-mode tree

Prints one JSON line (``root_url``, ``base_url``, ``port``, ``pid``) once it serves, and
serves until killed. Agents reach it as the peer's trainers do: OpenAI
``/v1/chat/completions`` on one fixed ``base_url``, the session id in the api-key
slot (``Authorization: Bearer <sid>``); an unknown sid is created on its first turn.

The sampling backend is ``ZeroLatencyBackend``: a stand-in at the sampler edge, the
network edge a real deployment crosses to vLLM/SGLang/Tinker and the one we replace,
as tracerl's scripted sampler (``python -m core.gateway``'s default) is on tracerl's
side. It answers every turn at once with the same reply tokens the scripted sampler
serves (``core.samplers.scripted.encode_reply``: the reply's ids and the end-of-turn
token) and the same deterministic logprobs (``fake_logprob``). Everything between
the HTTP request and that edge (parsing the body, rendering with the chat template,
tokenizing, healing in linear mode, recording the trajectory) is the peer's own code,
as installed (``agentcore-rl-toolkit`` 0.2.0, ``RolloutGateway`` served by
``ThreadedGatewayServer`` on its own thread and event loop).

One adjustment, ``--parse stages`` (the default): the peer's renderer parses replies
with a vendored response schema through ``tokenizer.parse_response``, and the
installed transformers (5.24) no longer accepts those schemas (it requires
``prefix=`` and rejects the schema's keys), so every turn degrades to raw text with
``ill_formed`` set and the end-of-turn token left in the reply's content, which then
never matches the history the client resends. ``stages`` injects a reasoning parser
(the peer's documented seam, which turns schema detection off) that drops a trailing
end-of-turn token and splits ``</think>`` as the peer's default does: what the schema
yields for a plain-text reply. ``--parse schema`` keeps the peer's schema path as
installed.

Routes added for the benchmark (on the same app and loop, outside any measured turn):
``POST /bench/sessions/{sid}`` (``create_session``) and
``POST /bench/sessions/{sid}/finish`` (``finish_session`` then ``drop_session``; answers
one summary per trace row: its token count and trained tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentcore_rl_toolkit.rollout_gateway import (  # noqa: E402
    HfTemplateRenderer,
    RolloutGateway,
    ThreadedGatewayServer,
    TurnRecord,
)
from agentcore_rl_toolkit.rollout_gateway.parsing import split_reasoning  # noqa: E402
from aiohttp import web  # noqa: E402

from benchmarks.gateway import TOKENIZERS, load_tokenizer, tokenizer_source  # noqa: E402
from core.samplers.scripted import encode_reply, fake_logprob  # noqa: E402


class ZeroLatencyBackend:
    """The peer's ``SamplingBackend`` protocol, answering every turn at once with ``reply_ids``.

    A stand-in at the sampler edge (the network edge we replace), as tracerl's scripted
    sampler is: no sleep, no I/O. Honours ``max_new_tokens`` (cutting the reply, finish
    ``length``) as a real backend would; the peer's default is 4096, far above a reply.
    """

    def __init__(self, reply_ids: list[int]) -> None:
        self.reply_ids = list(reply_ids)
        self.logprobs = [fake_logprob(t, i) for i, t in enumerate(self.reply_ids)]
        self.calls = 0

    async def generate(
        self,
        *,
        prompt_ids: list[int],
        sampling_params: dict,
        session_id: str | None = None,
        image_data: Any = None,
        video_data: Any = None,
    ) -> TurnRecord:
        self.calls += 1
        n = len(self.reply_ids)
        cap = sampling_params.get("max_new_tokens")
        if cap is not None:
            n = min(n, int(cap))
        return TurnRecord(
            prompt_ids=list(prompt_ids),  # as the peer's own backends build it
            output_ids=self.reply_ids[:n],
            finish_reason="stop" if n == len(self.reply_ids) else "length",
            output_log_probs=self.logprobs[:n],
        )


def stages_reasoning_parser(eos_text: str) -> Any:
    """A reasoning parser for ``HfTemplateRenderer``: drop a trailing ``eos_text``, then the
    peer's default ``</think>`` split (what the peer's schema path yields for plain text)."""

    def parse(raw: str) -> tuple[str, str]:
        return split_reasoning(raw.removesuffix(eos_text) if eos_text else raw)

    return parse


def build_gateway(tokenizer_dir: str, reply: str, history_mode: str, parse: str) -> RolloutGateway:
    """The peer's gateway on ``tokenizer_dir``'s tokenizer and chat template."""
    tok = load_tokenizer(tokenizer_dir)
    if parse == "stages":
        renderer = HfTemplateRenderer(tok, reasoning_parser=stages_reasoning_parser(str(tok.eos_token or "")))
    else:
        renderer = HfTemplateRenderer(tok)
    backend = ZeroLatencyBackend(encode_reply(tok, reply))
    gateway = RolloutGateway(backend=backend, renderer=renderer, tokenizer=tok, adapters=["openai"],
                             history_mode=history_mode)
    add_bench_routes(gateway)
    return gateway


def add_bench_routes(gateway: RolloutGateway) -> None:
    """Session create/finish over HTTP (the peer has only a Python API for them)."""

    async def create(request: web.Request) -> web.Response:
        gateway.create_session(request.match_info["sid"])
        return web.json_response({"ok": True})

    async def finish(request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        records = await gateway.finish_session(sid)
        await gateway.drop_session(sid)
        rows = [{"tokens": len(r.token_ids), "trained_tokens": sum(r.loss_mask)} for r in records]
        return web.json_response({"rows": rows})

    gateway.app.router.add_post("/bench/sessions/{sid}", create)
    gateway.app.router.add_post("/bench/sessions/{sid}/finish", finish)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="qwen3",
                    help=f"a tokenizer folder, or one of {TOKENIZERS[:2]} (benchmarks/gateway.py's tokenizer_source)")
    ap.add_argument("--reply", default="Hello from the scripted sampler.", help="text the backend answers every turn")
    ap.add_argument("--history-mode", choices=["linear", "tree"], default="tree")
    ap.add_argument("--parse", choices=["stages", "schema"], default="stages",
                    help="stages: inject a reasoning parser (see the module docstring); schema: as installed")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                    help="the server thread's event loop (the peer ships asyncio's)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="peer_gateway %(levelname)s %(name)s: %(message)s")
    workdir = None
    source = args.tokenizer
    if source in TOKENIZERS:
        workdir = tempfile.TemporaryDirectory(prefix="peer-gateway-tokenizer-")
        source = tokenizer_source(source, Path(workdir.name))
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # ThreadedGatewayServer calls new_event_loop()
    gateway = build_gateway(source, args.reply, args.history_mode, args.parse)
    server = ThreadedGatewayServer(gateway, host=args.host, port=args.port)
    server.start()
    print(json.dumps({"root_url": f"http://{args.host}:{server.port}", "base_url": server.base_url,
                      "port": server.port, "pid": os.getpid(), "history_mode": args.history_mode,
                      "parse": args.parse, "loop": args.loop}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # terminate(): clean up as Ctrl-C does
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop as SIGTERM does
            threading.Event().wait()
    finally:
        server.shutdown()
        if workdir is not None:
            workdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
