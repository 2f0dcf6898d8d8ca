"""A small inference server for the local model that speaks vLLM's and SGLang's token-id APIs.

``python -m tracerl_local.serve`` serves the local backend's model (the offline
``tiny`` one by default, or a Hugging Face model) so the gateway can be
pointed at it exactly as at a vLLM or SGLang fleet, and so tracerl's HTTP
samplers are tested against real tokens and logprobs.

Routes (one server, both protocols):

- ``POST /inference/v1/generate``: vLLM tokens in/out (``token_ids``, ``sampling_params``).
- ``POST /v1/completions``: vLLM completions with token-id prompts and ``return_token_ids``.
- ``POST /generate``: SGLang (``input_ids``, ``sampling_params``, ``return_logprob``,
  ``meta_info.output_token_logprobs``, ``meta_info.weight_version``).
- ``POST /abort_request`` (SGLang, ``{"rid"}``) and ``POST /abort_requests`` (vLLM
  ``--tokens-only``, ``{"request_ids"}``): cancel requests in flight.
- ``GET /health``, ``GET /health_generate``, ``GET /v1/models``, ``GET /get_model_info``.
- Weight updates from disk, as the engines take them (``core.samplers.weights``):
  SGLang ``POST /update_weights_from_disk`` (``{"model_path", "weight_version"}``)
  and ``GET /get_weight_version``; vLLM (dev mode) ``POST /collective_rpc`` with
  ``update_config`` (``{"model_config": {"model": dir}}``) then ``reload_weights``,
  and ``POST /reset_prefix_cache``. A directory that does not fit the model is
  refused and the served weights stay as they were. Requests running during an
  update finish on the weights they started with, as the engines' updates wait
  for them; with SGLang's ``abort_all_requests: true`` they are aborted instead
  and answer the tokens generated so far with finish reason ``abort`` (the
  client may send prompt plus those tokens again: a partial rollout).
- ``GET /tracerl/stats``: requests, aborts and client disconnects (for tests).

A client that disconnects cancels its request, as vLLM does. Sampling is the
``LocalSampler``'s (dynamic batching, per-request seeds), so a request with a
seed gets the same tokens and logprobs as the sampler called in process.

Defines ``build_serve_app``, ``InferenceServer``, ``ServeStats`` and ``main``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.errors import RuntimeStartError, SamplerError
from core.types import FinishReason, SampleResult, SamplingParams
from tracerl_local.serve_protocol import (
    AbortRequest,
    CollectiveRpcRequest,
    CompletionRequest,
    SglangGenerateRequest,
    UpdateWeightsFromDiskRequest,
    VllmGenerateRequest,
)
from tracerl_local.weights_io import WeightsLoadError, load_weights, read_version

__all__ = ["InferenceServer", "ServeStats", "build_serve_app", "main"]


@dataclass
class ServeStats:
    """Counters the tests read through ``GET /tracerl/stats``."""

    requests: int = 0
    """Generation requests received."""
    abort_calls: int = 0
    """Request ids named by abort calls (in flight or not)."""
    aborted: int = 0
    """Requests in flight that an abort call cancelled."""
    disconnected: int = 0
    """Requests cancelled because the client closed the connection."""


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )


async def _body(request: Request, model: type[BaseModel]) -> Any:
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise _HTTPError(400, f"invalid request: {where}: {first['msg']}") from exc


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _Service:
    """The routes' shared state: the sampler, the tokenizer and the requests in flight."""

    def __init__(
        self, sampler: Any, tokenizer: Any, model_name: str, max_positions: int, model: Any = None
    ) -> None:
        self.sampler = sampler
        self.model = model
        self.reload_path = ""
        self.load_lock = asyncio.Lock()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_positions = max_positions
        self.stats = ServeStats()
        self.in_flight: dict[str, asyncio.Task[SampleResult]] = {}
        self.aborting: set[str] = set()

    def params(self, prompt_len: int, max_tokens: int | None, **kw: Any) -> SamplingParams:
        if max_tokens is None:  # the engines' default: whatever room the context leaves
            max_tokens = max(1, self.max_positions - prompt_len)
        top_k = kw.pop("top_k")
        try:
            return SamplingParams(
                max_tokens=max_tokens, top_k=-1 if top_k in (0, None) else top_k, **kw
            )
        except ValueError as exc:
            raise _HTTPError(400, f"invalid sampling parameters: {exc}") from exc

    async def generate(
        self, request: Request, rid: str, prompt: list[int], params: SamplingParams
    ) -> SampleResult | None:
        """Sample; None when an abort call or a client disconnect cancelled the request."""
        if not prompt:
            raise _HTTPError(400, "the prompt is empty; send at least one token id")
        self.stats.requests += 1
        task = asyncio.ensure_future(self.sampler.sample(prompt, params, session_id=rid))
        self.in_flight[rid] = task
        watch = asyncio.ensure_future(_until_disconnected(request))
        done: set[asyncio.Future[Any]] = set()
        try:
            done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            self.in_flight.pop(rid, None)
            if not task.done():  # the client went away (or the server is stopping)
                task.cancel()
                self.stats.disconnected += 1
        if task not in done or task.cancelled():
            self.aborting.discard(rid)
            return None
        try:
            return task.result()
        except SamplerError as exc:
            raise _HTTPError(400, str(exc)) from exc

    def abort(self, rids: Sequence[str]) -> None:
        for rid in rids:
            self.stats.abort_calls += 1
            task = self.in_flight.get(rid)
            if task is not None and not task.done():
                self.aborting.add(rid)
                self.stats.aborted += 1
                task.cancel()

    async def load(self, path: str, version: int | None, *, abort_running: bool = False) -> int:
        """Load the weights in ``path`` and serve them as ``version`` (the file's, else +1).

        Requests running meanwhile finish on the weights they started with, as an engine's
        update waits for them; ``abort_running`` (SGLang's ``abort_all_requests``) ends them
        instead, answering the tokens they have with finish reason ``abort``.
        """
        if self.model is None:
            raise WeightsLoadError("this server was built without a model to load weights into")
        async with self.load_lock:
            await asyncio.to_thread(load_weights, self.model, path)
            if version is None:
                version = read_version(path)
            if version is None:
                version = int(self.sampler.weight_version) + 1
            mode = "abort" if abort_running else "finish"
            await asyncio.to_thread(self.sampler.publish, self.model, version, on_update=mode)
            return version

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [str(t) for t in self.tokenizer.convert_ids_to_tokens(list(ids))]

    def text(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


def _route(service: _Service, handler: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(service, request)  # type: ignore[no-any-return]
        except _HTTPError as exc:
            return _error(exc.status, str(exc))
        except Exception as exc:  # an unexpected failure still answers in the envelope
            return _error(500, f"{type(exc).__name__}: {exc}")

    return endpoint


async def _vllm_generate(svc: _Service, request: Request) -> Response:
    req = await _body(request, VllmGenerateRequest)
    sp = req.sampling_params
    if req.stream or sp.n != 1:
        raise _HTTPError(400, "the local inference server supports stream=false and n=1 only")
    rid = req.request_id or secrets.token_hex(8)
    params = svc.params(
        len(req.token_ids),
        sp.max_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        stop=_stops(sp.stop),
        stop_token_ids=tuple(sp.stop_token_ids or ()),
        seed=sp.seed,
    )
    out = await svc.generate(request, rid, req.token_ids, params)
    ids, lps, finish = (
        (out.token_ids, out.logprobs, out.finish_reason.value) if out else ([], [], "abort")
    )
    logprobs = None
    if sp.logprobs is not None:
        logprobs = {
            "content": [
                {"token": p, "logprob": lp, "bytes": None, "top_logprobs": []}
                for p, lp in zip(svc.pieces(ids), lps, strict=True)
            ]
        }
    choice = {"index": 0, "token_ids": ids, "logprobs": logprobs, "finish_reason": finish}
    return JSONResponse(
        {
            "request_id": rid,
            "choices": [choice],
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


async def _completions(svc: _Service, request: Request) -> Response:
    req = await _body(request, CompletionRequest)
    if req.stream or req.n != 1:
        raise _HTTPError(400, "the local inference server supports stream=false and n=1 only")
    prompt = (
        req.prompt
        if isinstance(req.prompt, list)
        else svc.tokenizer.encode(req.prompt, add_special_tokens=False)
    )
    rid = req.request_id or secrets.token_hex(8)
    params = svc.params(
        len(prompt),
        req.max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k,
        stop=_stops(req.stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        seed=req.seed,
    )
    out = await svc.generate(request, rid, list(prompt), params)
    ids, lps, finish = (
        (out.token_ids, out.logprobs, out.finish_reason.value) if out else ([], [], "abort")
    )
    choice: dict[str, Any] = {
        "index": 0,
        "text": svc.text(ids),
        "finish_reason": finish,
        "logprobs": None,
    }
    if req.logprobs is not None:
        choice["logprobs"] = {
            "tokens": svc.pieces(ids),
            "token_logprobs": lps,
            "top_logprobs": None,
            "text_offset": None,
        }
    if req.return_token_ids:
        choice["token_ids"] = ids
        choice["prompt_token_ids"] = list(prompt)
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
    }
    return JSONResponse(
        {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": svc.model_name,
            "choices": [choice],
            "usage": usage,
        }
    )


async def _sglang_generate(svc: _Service, request: Request) -> Response:
    req = await _body(request, SglangGenerateRequest)
    sp = req.sampling_params
    if req.stream or sp.n != 1:
        raise _HTTPError(400, "the local inference server supports stream=false and n=1 only")
    if req.input_ids is None and req.text is None:
        raise _HTTPError(400, "invalid request: give input_ids (or text)")
    prompt = (
        req.input_ids
        if req.input_ids is not None
        else svc.tokenizer.encode(req.text, add_special_tokens=False)
    )
    rid = req.rid or secrets.token_hex(8)
    params = svc.params(
        len(prompt),
        sp.max_new_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        stop=_stops(sp.stop),
        stop_token_ids=tuple(sp.stop_token_ids or ()),
        seed=sp.sampling_seed,
    )
    out = await svc.generate(request, rid, list(prompt), params)
    if out is None:
        ids, lps, version = [], [], svc.sampler.weight_version
        finish: dict[str, Any] = {"type": "abort", "message": "Abort before prefill"}
    else:
        ids, lps, version = out.token_ids, out.logprobs, out.weight_version
        if out.finish_reason is FinishReason.STOP:
            finish = {"type": "stop", "matched": ids[-1] if ids else None}
        elif out.finish_reason is FinishReason.ABORT:  # a weight update aborted it mid-way
            finish = {"type": "abort", "message": "Abort by a weight update (abort_all_requests)"}
        else:
            finish = {"type": out.finish_reason.value, "length": len(ids)}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": str(version),
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]
    return JSONResponse({"text": svc.text(ids), "output_ids": ids, "meta_info": meta})


async def _abort_request(svc: _Service, request: Request) -> Response:
    req = await _body(request, AbortRequest)
    svc.abort([req.rid])
    return Response(status_code=200)


async def _abort_requests(svc: _Service, request: Request) -> Response:
    try:
        ids = json.loads(await request.body())["request_ids"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _HTTPError(400, "Missing 'request_ids' in request body") from exc
    svc.abort([str(i) for i in ids])
    return Response(status_code=200)


async def _health(svc: _Service, request: Request) -> Response:
    return Response(status_code=200)


async def _health_generate(svc: _Service, request: Request) -> Response:
    await svc.sampler.sample(
        [int(svc.tokenizer.eos_token_id)], SamplingParams(max_tokens=1), session_id="health"
    )
    return Response(status_code=200)


async def _models(svc: _Service, request: Request) -> Response:
    card = {
        "id": svc.model_name,
        "object": "model",
        "owned_by": "tracerl",
        "max_model_len": svc.max_positions,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def _model_info(svc: _Service, request: Request) -> Response:
    return JSONResponse(
        {
            "model_path": svc.model_name,
            "is_generation": True,
            "weight_version": str(svc.sampler.weight_version),
        }
    )


async def _update_weights_from_disk(svc: _Service, request: Request) -> Response:
    req = await _body(request, UpdateWeightsFromDiskRequest)
    version: int | None = None
    if req.weight_version is not None:
        try:
            version = int(req.weight_version)
        except ValueError as exc:
            raise _HTTPError(
                400, f"weight_version={req.weight_version!r}: this server keeps integer versions"
            ) from exc
    try:
        await svc.load(req.model_path, version, abort_running=req.abort_all_requests)
    except WeightsLoadError as exc:
        return JSONResponse(
            {
                "success": False,
                "message": f"Failed to update weights: {exc}. Rolling back to original weights.",
                "num_paused_requests": 0,
            },
            status_code=400,
        )
    message = "Succeeded to update model weights."
    if req.weight_version is not None:
        message += f" Weight version updated to {req.weight_version}."
    return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})


async def _weight_version(svc: _Service, request: Request) -> Response:
    return JSONResponse({"weight_version": str(svc.sampler.weight_version)})


async def _collective_rpc(svc: _Service, request: Request) -> Response:
    req = await _body(request, CollectiveRpcRequest)
    if req.method == "update_config":
        overrides = req.args[0] if req.args else req.kwargs.get("overrides")
        model = overrides.get("model_config", {}).get("model") if isinstance(overrides, dict) else None
        if not isinstance(model, str) or not model:
            raise _HTTPError(
                400, "update_config: give args=[{'model_config': {'model': '<weights dir>'}}]"
            )
        svc.reload_path = model
        return JSONResponse({"results": [None]})
    if req.method == "reload_weights":
        if not svc.reload_path:
            raise _HTTPError(
                400, "reload_weights: call update_config with model_config.model first"
            )
        try:
            await svc.load(svc.reload_path, None)
        except WeightsLoadError as exc:
            raise _HTTPError(500, f"reload_weights failed: {exc}") from exc
        return JSONResponse({"results": [None]})
    raise _HTTPError(
        400,
        f"collective_rpc method {req.method!r} is not served here; "
        "the local inference server serves update_config and reload_weights",
    )


async def _reset_prefix_cache(svc: _Service, request: Request) -> Response:
    return Response(status_code=200)  # no prefix cache: nothing computed with old weights to drop


async def _stats(svc: _Service, request: Request) -> Response:
    return JSONResponse(
        {
            **asdict(svc.stats),
            "in_flight": len(svc.in_flight),
            "weight_version": svc.sampler.weight_version,
        }
    )


def build_serve_app(
    sampler: Any, tokenizer: Any, *, model_name: str, max_positions: int, model: Any = None
) -> Starlette:
    """The Starlette app serving ``sampler`` (a ``LocalSampler``) over both protocols.

    ``model`` (same architecture as the sampler's) is where weight updates from
    disk are loaded before the sampler publishes them; without it they are refused.
    """
    svc = _Service(sampler, tokenizer, model_name, max_positions, model)
    table = [
        ("/inference/v1/generate", _vllm_generate, "POST"),
        ("/v1/completions", _completions, "POST"),
        ("/generate", _sglang_generate, "POST"),
        ("/abort_request", _abort_request, "POST"),
        ("/abort_requests", _abort_requests, "POST"),
        ("/health", _health, "GET"),
        ("/health_generate", _health_generate, "GET"),
        ("/v1/models", _models, "GET"),
        ("/get_model_info", _model_info, "GET"),
        ("/get_weight_version", _weight_version, "GET"),
        ("/update_weights_from_disk", _update_weights_from_disk, "POST"),
        ("/collective_rpc", _collective_rpc, "POST"),
        ("/reset_prefix_cache", _reset_prefix_cache, "POST"),
        ("/tracerl/stats", _stats, "GET"),
    ]
    app = Starlette(routes=[Route(p, _route(svc, h), methods=[m]) for p, h, m in table])
    app.state.service = svc
    return app


class InferenceServer:
    """uvicorn serving ``build_serve_app`` inside the running event loop."""

    def __init__(
        self, backend: Any, *, host: str = "127.0.0.1", port: int = 0, model_name: str = ""
    ) -> None:
        """Serve ``backend.sampler`` (a ``LocalBackend``'s); nothing binds until ``start``."""
        self.backend = backend
        self.host = host
        self.port = port
        self.model_name = model_name or backend.model_id()
        max_positions = int(backend.model.config.max_position_embeddings)
        self.app = build_serve_app(
            backend.sampler,
            backend.get_tokenizer(),
            model_name=self.model_name,
            max_positions=max_positions,
            model=backend.model,
        )
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://host:port``: what ``sampler.urls`` takes."""
        return f"http://{self.host}:{self.port}"

    async def start(self, timeout_s: float = 30.0) -> None:
        """Bind and serve in the background; returns once listening.

        Raises:
            RuntimeStartError: the port could not be bound or startup timed out.
        """
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # type: ignore[no-untyped-def]
                yield  # the host process owns Ctrl-C

        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._server.started:
            if self._task.done() or loop.time() > deadline:
                exc = self._task.exception() if self._task.done() else None
                await self.stop()
                raise RuntimeStartError(
                    f"inference server could not start on {self.host}:{self.port}: "
                    f"{exc or 'startup timed out'}; pick another --port"
                )
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task
        self._server = self._task = None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tracerl_local.serve", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--model",
        default="tiny",
        help="'tiny' (offline, built from --seed) or a Hugging Face name/path",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the tiny model's weights and of sampling"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    p.add_argument("--served-model-name", default="", help="name in /v1/models (default: --model)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    p.add_argument(
        "--task",
        default="",
        help="with --model tiny: shape the tokenizer as a training run of this task does "
        "(e.g. succ_digit), so python -m core.train task=... sampler=sglang can push to it",
    )
    return p


def _task_node(name: str) -> Any:
    """``core/conf/task/<name>.yaml`` (only its tokenizer settings are read)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    import core.conf

    file = Path(core.conf.__file__).parent / "task" / f"{name}.yaml"
    if not file.is_file():
        known = sorted(p.stem for p in file.parent.glob("*.yaml"))
        raise RuntimeStartError(f"--task {name!r} is not a task config; known: {known}")
    return OmegaConf.load(file)


async def _serve(args: argparse.Namespace) -> None:
    from tracerl_local.backend import LocalBackend
    from tracerl_local.config import LocalBackendConfig

    config = LocalBackendConfig(
        model=args.model, device=args.device, dtype=args.dtype, batch_wait_ms=args.batch_wait_ms
    )
    if args.task:
        from omegaconf import OmegaConf

        run = OmegaConf.create({"seed": args.seed, "task": _task_node(args.task)})
        backend = LocalBackend.from_config(run, node=config)
    else:
        backend = LocalBackend(config, seed=args.seed)
    server = InferenceServer(
        backend, host=args.host, port=args.port, model_name=args.served_model_name
    )
    try:
        await server.start()
        print(
            json.dumps(
                {"url": server.url, "model": server.model_name, "protocols": ["vllm", "sglang"]}
            ),
            flush=True,
        )
        await asyncio.Event().wait()
    finally:
        await server.stop()
        await backend.aclose()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tracerl_local.serve``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args))
    except RuntimeStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
