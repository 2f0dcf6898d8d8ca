"""``python -m core.gateway``: serve the gateway on its own, to try an agent before training.

Prints one JSON line (``base_url``, ``admin_token``, any pre-created
``sessions``) and serves until interrupted. Create more sessions and read their
traces over the admin routes, e.g.::

    python -m core.gateway --reply "Hello!"                 # scripted model, tiny tokenizer
    python -m core.gateway --sampler backend:local          # the local backend's model
    python -m core.gateway --sampler sglang --server-url http://127.0.0.1:30000   # an inference fleet
    curl -XPOST -H "authorization: Bearer $ADMIN" $ROOT/admin/sessions
    curl -H "authorization: Bearer $ADMIN" $ROOT/admin/sessions/$SID/trace

``python -m core.gateway certify MODEL`` certifies a model's chat template instead
(``core.gateway.certify.cli``). ``python -m core.gateway shard SPEC [--port N]`` serves one
gateway shard of a training run (``core.rollout.shards``, started by the trainer with
``gateway.shards`` above 1): it prints one JSON line and serves until its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from core.gateway.config import GatewayConfig
from core.types import SamplingParams


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.gateway", description=__doc__.splitlines()[0])
    p.add_argument("--sampler", default="scripted",
                   help="'scripted' (answers --reply every turn), 'backend:<name>' (a driven backend's sampler), "
                        "or 'vllm' / 'sglang' (inference servers at --server-url)")
    p.add_argument("--server-url", action="append", default=[],
                   help="vLLM/SGLang server or router URL (repeat for several; sessions stick to one)")
    p.add_argument("--vllm-endpoint", default="generate", choices=["generate", "completions"],
                   help="vLLM API: /inference/v1/generate or /v1/completions with token-id prompts")
    p.add_argument("--served-model", default="", help="model name sent to vLLM (default: the server's only model)")
    p.add_argument("--reply", default="Hello from the scripted sampler.", help="text the scripted sampler answers")
    p.add_argument("--sampler-delay", default="0", metavar="S or LOW:HIGH",
                   help="seconds the scripted sampler sleeps per turn; LOW:HIGH spreads it log-uniformly "
                        "by prompt length (core.samplers.scripted.spread_delay)")
    p.add_argument("--tokenizer", default="tiny",
                   help="'tiny' (offline) or a Hugging Face name/path (loaded in a child process, so this one "
                        "never imports torch; see core.tokenizer_export)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--history-mode", default="linear", choices=["linear", "tree"])
    p.add_argument("--tool-parser", default="auto")
    p.add_argument("--max-context-tokens", type=int, default=4096, help="0 = unlimited")
    p.add_argument("--max-tokens", type=int, default=256, help="session default max_tokens")
    p.add_argument("--sessions", type=int, default=1, help="sessions to create at start")
    p.add_argument("--admin-token", default="")
    p.add_argument("--allow-sampling-overrides", action="store_true")
    p.add_argument("--max-connections", type=int, default=2048, help="gateway.max_connections (0 = no cap)")
    p.add_argument("--max-pending-headers-per-client", type=int, default=64,
                   help="gateway.max_pending_headers_per_client (0 = no cap; thousands of agents on one host)")
    p.add_argument("--ignore-request-field", action="append", default=[], metavar="NAME",
                   help="top-level request field to drop before a request is read (repeatable; "
                        "gateway.ignore_request_fields, docs/gateway.md Request fields)")
    return p


LOOP_ENV = "TRACERL_GATEWAY_LOOP"
"""Environment variable choosing the event loop of a ``python -m core.gateway`` process:
``auto`` (uvloop when installed, the default) or ``asyncio`` (the standard library's)."""


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (and ``TRACERL_GATEWAY_LOOP`` is not ``asyncio``), else None.

    Why: the event loop's own work per turn (reading the request off the socket, the
    callbacks that wake each turn's task, writing the response) is a fifth of the
    gateway's CPU on the asyncio loop written in Python; uvloop does it in C
    (docs/performance.md, "gateway_agent"). Without uvloop the gateway runs on asyncio.
    """
    choice = os.environ.get(LOOP_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "asyncio"):
        raise SystemExit(f"{LOOP_ENV} must be 'auto' or 'asyncio', got {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _loop_name() -> str:
    """``uvloop`` or ``asyncio``: the running event loop's kind (the startup line reports it)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


def _run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)`` on ``_loop_factory()``'s loop; Ctrl-C ends it quietly."""
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main)


def _delay(text: str) -> float | tuple[float, float]:
    """``--sampler-delay``: ``S`` or ``LOW:HIGH`` seconds."""
    try:
        low, sep, high = text.partition(":")
        return (float(low), float(high)) if sep else float(low)
    except ValueError:
        raise SystemExit(f"--sampler-delay must be seconds (0.5) or LOW:HIGH (0.2:5), got {text!r}") from None


def _backend_sampler(name: str) -> tuple[Any, Any, str]:
    """(sampler, tokenizer, model id) of a driven backend built with its default config."""
    from omegaconf import OmegaConf

    from core.plugins import load_plugins

    spec = load_plugins().backend(name)
    node = spec.config
    conf = OmegaConf.structured(node) if not isinstance(node, dict) else OmegaConf.create(node)
    backend = spec.factory(OmegaConf.create({"backend": conf, "seed": 0}))
    return backend.sampler, backend.get_tokenizer(), backend.model_id()


async def _serve(args: argparse.Namespace) -> None:
    from core.gateway import Gateway, GatewayServer
    from core.samplers import ScriptedSampler, encode_reply

    if args.sampler == "scripted":
        from core.tokenizer_export import load_tokenizer_without_torch

        tok = load_tokenizer_without_torch(args.tokenizer)
        sampler: Any = ScriptedSampler(default=encode_reply(tok, args.reply), tokenizer=tok, record_calls=False,
                                       delay_s=_delay(args.sampler_delay))
        model_id = "scripted"
    elif args.sampler.startswith("backend:"):
        sampler, tok, model_id = _backend_sampler(args.sampler.split(":", 1)[1])
    elif args.sampler in ("vllm", "sglang"):
        from core.errors import ConfigError
        from core.samplers import HttpSamplerConfig, build_http_sampler
        from core.tokenizer_export import load_tokenizer_without_torch

        try:
            sampler = build_http_sampler(HttpSamplerConfig(
                kind=args.sampler, urls=args.server_url, vllm_endpoint=args.vllm_endpoint, model=args.served_model,
            ))
        except ConfigError as exc:
            raise SystemExit(f"{exc} (pass --server-url URL)") from exc
        tok = load_tokenizer_without_torch(args.tokenizer)
        model_id = args.served_model or args.sampler
    else:
        raise SystemExit(f"--sampler must be 'scripted', 'backend:<name>', 'vllm' or 'sglang', got {args.sampler!r}")
    config = GatewayConfig(
        host=args.host, port=args.port, history_mode=args.history_mode, tool_parser=args.tool_parser,
        max_context_tokens=args.max_context_tokens, admin_token=args.admin_token,
        allow_sampling_overrides=args.allow_sampling_overrides, ignore_request_fields=args.ignore_request_field,
        max_connections=args.max_connections, max_pending_headers_per_client=args.max_pending_headers_per_client,
    )
    gw = Gateway(tokenizer=tok, sampler=sampler, config=config, model_id=model_id)
    server = GatewayServer(gw, host=args.host, port=args.port)
    await server.start()
    # GatewayServer.start() applied core.gateway.server.tune_gc() (frozen heap, higher GC threshold).
    sids = [gw.create_session(sampling=SamplingParams(max_tokens=args.max_tokens)) for _ in range(args.sessions)]
    print(json.dumps({"base_url": server.base_url, "root_url": server.root_url,
                      "admin_token": server.admin_token, "sessions": sids, "model": model_id,
                      "loop": _loop_name()}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
        if hasattr(sampler, "aclose"):
            await sampler.aclose()


async def _serve_shard(spec_path: str, port: int) -> None:
    """One gateway shard: built from the trainer's spec, served until stdin closes (the
    trainer stopping it, or dying)."""
    import os
    import threading

    from core.gateway import GatewayServer
    from core.rollout.shards import build_shard_gateway, read_spec

    spec = read_spec(spec_path)
    gw = build_shard_gateway(spec)
    server = GatewayServer(gw, host=str(spec.gateway.get("host", "127.0.0.1")), port=port, public_host=spec.public_host)
    await server.start()
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()

    def watch_stdin() -> None:
        sys.stdin.buffer.read()  # returns at EOF: the trainer closed the pipe or exited
        loop.call_soon_threadsafe(closed.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    # "tokenizer": the directory its tokenizer came from (the split copy, or the whole save it fell back to)
    print(json.dumps({"root_url": server.root_url, "base_url": server.base_url, "pid": os.getpid(),
                      "tokenizer": str(getattr(gw.renderer.tokenizer, "name_or_path", ""))}), flush=True)
    try:
        await closed.wait()
    finally:
        await server.stop()
        if hasattr(gw.sampler, "aclose"):
            await gw.sampler.aclose()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["certify"]:
        from core.gateway.certify.cli import main as certify_main

        return certify_main(argv[1:])
    if argv[:1] == ["shard"]:
        p = argparse.ArgumentParser(prog="python -m core.gateway shard")
        p.add_argument("spec", help="the shard spec the trainer wrote (core.rollout.shards.ShardSpec)")
        p.add_argument("--port", type=int, default=0)
        shard = p.parse_args(argv[1:])
        _run(_serve_shard(shard.spec, shard.port))
        return 0
    args = _parser().parse_args(argv)
    _run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
