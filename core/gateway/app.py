"""The ASGI app: routes, session identity, body limits and the one error mapping.

Defines ``build_app(gateway)``, a Starlette application serving

- ``POST /v1/chat/completions`` (OpenAI, streaming and not),
- ``POST /v1/messages``, ``POST /v1/messages/count_tokens`` (Anthropic),
- ``GET /v1/models``, ``GET /health``, and the admin routes (``core.gateway.admin``),

each agent route also under ``/sessions/{sid}/v1/...``; the Anthropic routes
also under ``/v1/v1/...`` because the anthropic SDK appends ``/v1/messages`` to
a base URL that may already end in ``/v1``. The turn routes are dispatched by
``core.gateway.fastpath.HotRoutes`` in front of Starlette (same endpoints, no
middleware stack); everything else goes through Starlette's router.

Session identity, first match wins: the ``{sid}`` path segment, the bearer
token, the ``x-api-key`` header. A missing or unknown id is 401, a finished
session 409; nothing is ever recorded under a default session.

A client that disconnects while its turn is being sampled cancels the turn: the
sampler call is cancelled and nothing is recorded (the agent never saw it). A
client already gone when its turn would start gets no turn at all. The watch is
``fastpath.DisconnectWatch`` (no task per turn).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from core.gateway.admin import admin_routes
from core.gateway.anthropic_api import (
    messages_response,
    messages_stream_events,
    parse_count_request,
    parse_messages_request,
)
from core.gateway.errors import (
    GatewayError,
    anthropic_envelope,
    bad_request,
    not_found,
    openai_envelope,
    too_large,
    unauthorized,
)
from core.gateway.fastpath import ClientGone, DisconnectWatch, HotRoutes, TooLarge, read_body
from core.gateway.openai_api import chat_response, chat_stream_events, parse_chat_request

if TYPE_CHECKING:
    from core.gateway.service import Gateway, TurnResult

__all__ = ["build_app"]

log = logging.getLogger("core.gateway")

Endpoint = Callable[[Request], Awaitable[Response]]


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, ensure_ascii=False).encode(), status_code=status, media_type="application/json")


def _session_id(request: Request) -> str:
    sid = request.path_params.get("sid")
    if sid:
        return str(sid)
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = request.headers.get("x-api-key")
    if key and key.strip():
        return key.strip()
    raise unauthorized(
        "no session id: pass the session id the trainer created as the API key "
        "(Authorization: Bearer <id> or x-api-key), or use the /sessions/<id>/v1 base URL"
    )


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise too_large(limit)
    try:
        raw = await read_body(request.receive, limit)
    except TooLarge:
        raise too_large(limit) from None
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


async def _guarded(request: Request, turn: Coroutine[Any, Any, TurnResult]) -> TurnResult:
    """Await ``turn``, cancelling it if the client disconnects meanwhile.

    Raises:
        ClientGone: the client disconnected (before the turn started, or during it).
    """
    task = asyncio.current_task()
    gone = started = False

    def on_gone() -> None:
        nonlocal gone
        gone = True
        if started and task is not None:
            task.cancel()

    watch = DisconnectWatch(request.receive, on_gone)
    try:
        if gone:  # already disconnected: nobody will read this turn, so never start it
            turn.close()
            raise ClientGone()
        started = True
        return await turn
    except asyncio.CancelledError:
        if gone and task is not None:
            task.uncancel()
            raise ClientGone() from None
        raise
    finally:
        watch.close()


def _endpoint(fn: Endpoint, *, anthropic: bool) -> Endpoint:
    envelope = anthropic_envelope if anthropic else openai_envelope

    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except GatewayError as err:
            return _json(envelope(err), err.status)
        except ClientGone:
            return Response(status_code=499)
        except Exception as exc:  # the one place unexpected errors become a response
            log.exception("gateway error on %s", request.url.path)
            internal = GatewayError(
                f"internal gateway error: {type(exc).__name__}: {exc}", status=500, type="server_error"
            )
            return _json(envelope(internal), 500)

    return endpoint


async def _frames(frames: list[bytes]) -> AsyncIterator[bytes]:
    for f in frames:
        yield f


def _sse(frames: list[bytes]) -> StreamingResponse:
    return StreamingResponse(
        _frames(frames), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


def build_app(gateway: Gateway) -> HotRoutes:
    """The ASGI app serving ``gateway``: the turn routes on the lean path, the rest on Starlette."""
    limit = gateway.config.max_body_bytes

    async def chat(request: Request) -> Response:
        sid = _session_id(request)
        gateway.open_session(sid)
        body = await _read_json(request, limit)
        req, stream, include_usage = parse_chat_request(body)
        result = await _guarded(request, gateway.run_turn(sid, req))
        if stream:
            return _sse(chat_stream_events(result, gateway.model_id, include_usage))
        return _json(chat_response(result, gateway.model_id))

    async def messages(request: Request) -> Response:
        sid = _session_id(request)
        gateway.open_session(sid)
        body = await _read_json(request, limit)
        req, stream = parse_messages_request(body)
        result = await _guarded(request, gateway.run_turn(sid, req))
        if stream:
            return _sse(messages_stream_events(result, gateway.model_id))
        return _json(messages_response(result, gateway.model_id))

    async def count_tokens(request: Request) -> Response:
        gateway.open_session(_session_id(request))
        units, tools = parse_count_request(await _read_json(request, limit))
        return _json({"input_tokens": gateway.count_tokens(units, tools)})

    async def models(request: Request) -> Response:
        return _json(
            {"object": "list", "data": [{"id": gateway.model_id, "object": "model", "created": 0, "owned_by": "tracerl"}]}
        )

    async def health(request: Request) -> Response:
        return _json({"status": "ok", "sessions": len(gateway.sessions())})

    openai_chat = _endpoint(chat, anthropic=False)
    anth_messages = _endpoint(messages, anthropic=True)
    anth_count = _endpoint(count_tokens, anthropic=True)
    list_models = _endpoint(models, anthropic=False)
    routes = [Route("/health", _endpoint(health, anthropic=False), methods=["GET"])]
    for prefix in ("", "/sessions/{sid}"):
        routes += [
            Route(prefix + "/v1/chat/completions", openai_chat, methods=["POST"]),
            Route(prefix + "/v1/models", list_models, methods=["GET"]),
        ]
        for v in ("/v1", "/v1/v1"):
            routes += [
                Route(prefix + v + "/messages", anth_messages, methods=["POST"]),
                Route(prefix + v + "/messages/count_tokens", anth_count, methods=["POST"]),
            ]
    routes += admin_routes(gateway)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        anthropic = "/messages" in request.url.path
        if exc.status_code == 404:
            err = not_found(f"no route {request.method} {request.url.path}; see docs/gateway.md for the routes")
        else:
            err = GatewayError(f"{exc.detail} for {request.method} {request.url.path}", status=exc.status_code)
        return _json((anthropic_envelope if anthropic else openai_envelope)(err), err.status)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    hot = {
        "/v1/chat/completions": openai_chat,
        "/v1/messages": anth_messages,
        "/v1/v1/messages": anth_messages,
    }
    return HotRoutes(app, hot)
