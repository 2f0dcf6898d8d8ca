"""The ASGI app: routes, session identity, body limits and the one error mapping.

Defines ``build_app(gateway)``, a Starlette application serving

- ``POST /v1/chat/completions`` (OpenAI, streaming and not),
- ``POST /v1/responses`` (OpenAI Responses, streaming and not), ``GET`` and
  ``DELETE /v1/responses/{id}`` (the session's stored responses),
  ``POST /v1/responses/input_tokens`` (the prompt's token count),
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

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from core.gateway import safejson
from core.gateway.admin import admin_routes
from core.gateway.anthropic_api import (
    messages_response,
    messages_stream_events,
    parse_count_request,
    parse_messages_request,
)
from core.gateway.errors import (
    SURROGATE_HINT,
    GatewayError,
    anthropic_envelope,
    bad_request,
    not_found,
    openai_envelope,
    unauthorized,
)
from core.gateway.fastpath import ClientGone, DisconnectWatch, HotRoutes, read_raw
from core.gateway.fields import drop_ignored
from core.gateway.openai_api import chat_response, chat_stream_events, parse_chat_request
from core.gateway.resent import parse_turn_body
from core.gateway.responses_api import (
    finish_response,
    input_error,
    parse_responses_request,
    response_stream_events,
)

if TYPE_CHECKING:
    from core.gateway.service import Gateway
    from core.gateway.session import Session
    from core.gateway.turn import TurnResult

__all__ = ["build_app"]

log = logging.getLogger("core.gateway")

Endpoint = Callable[[Request], Awaitable[Response]]


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, ensure_ascii=False).encode(), status_code=status, media_type="application/json")


def _reply_json(data: dict[str, Any]) -> Response:
    """A turn's reply object as a 200 JSON response, written by orjson (compact, UTF-8).

    Why: a turn's reply is serialized every turn; orjson takes a microsecond where
    ``json.dumps`` takes about ten. Only for objects whose floats are finite (a
    turn's logprobs are checked finite in ``Gateway._sample``): orjson writes NaN
    and infinities as ``null`` where ``json`` writes ``NaN``/``Infinity``. What
    orjson refuses (integers past 64 bits, lone surrogates, non-string keys) is
    written by ``_json``, as before.
    """
    try:
        body = orjson.dumps(data)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _json(data)
    return Response(body, media_type="application/json")


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


_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
"""Maps every digit to ``0`` and every other byte to a space (``_loads``' big-integer check)."""
_BIG_INT = b"0" * 19
"""Nineteen digits in a row: the shortest integer orjson may turn into a float (below -2**63)."""


def _loads(raw: bytes) -> Any:
    """``json.loads(raw)``, parsed by orjson when that gives the same objects.

    Why: parsing the body is the one step of a turn whose cost grows with the
    context (agents resend the whole history). On a 47 kB chat body orjson
    takes about 45 us against json's 85 us, and the digit scan below 26 us,
    so the net gain is small (about 15 us) but grows no worse with the body.
    orjson differs from ``json`` in what it refuses (NaN, lone surrogates, a
    BOM, UTF-16, nesting past 1024, infinities) and in integers beyond 64 bits,
    which it makes floats; refused bodies go to ``json`` (same answer and same
    errors as before), and a body with a run of 19 digits anywhere (a C-speed
    scan) too, so no integer changes.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)
    if _BIG_INT in raw.translate(_DIGITS):
        return json.loads(raw)
    return body


def parse_body(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object: 400 for bad JSON or nesting beyond the parser.

    Deep nesting that does parse is not walked here (a walk costs about as much
    as the parse on every long conversation): the steps that recurse into client
    data later either compare it with data already accepted (history matching,
    the anchor cache: bounded by that data) or run inside the template render,
    whose failures, ``RecursionError`` included, are a 400. Lone surrogates are
    found where they would fail, when the rendered prompt is tokenized (400
    naming the field, see ``Gateway._render``), not by scanning every body.
    """
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = _loads(raw)
    except RecursionError:
        raise bad_request(
            "the request body is not valid JSON for the gateway: it nests arrays/objects deeper than "
            "Python's parser allows (about 1000 levels); no chat request needs that"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _check_stops(stop: tuple[str, ...], param: str, cap: int) -> None:
    if len(stop) > cap:
        raise bad_request(
            f"'{param}' holds {len(stop)} stop strings; this gateway accepts at most {cap} per request "
            "(gateway.max_stop_strings)",
            param=param,
        )
    for i, st in enumerate(stop):
        if not safejson.valid_unicode(st):
            raise bad_request(f"{param}[{i}] {SURROGATE_HINT}", param=param)


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
            response = _json(envelope(err), err.status)
            if err.status == 408:  # the rest of a stalled body must not be read as a new request
                response.headers["connection"] = "close"
            return response
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


TOOL_CHOICE_HEADER = "x-tracerl-tool-choice"
"""Response header set to ``violated`` when the model did not follow the request's ``tool_choice``."""


def _flagged(response: Response, result: TurnResult) -> Response:
    """Mark a reply that did not follow its ``tool_choice`` (the body stays in the dialect's shape)."""
    if result.tool_choice_violated:
        response.headers[TOOL_CHOICE_HEADER] = "violated"
    return response


def build_app(gateway: Gateway) -> HotRoutes:
    """The ASGI app serving ``gateway``: the turn routes on the lean path, the rest on Starlette."""
    cfg = gateway.config
    limit = cfg.max_body_bytes
    timeout = cfg.body_read_timeout_s or None
    ignore = frozenset(cfg.ignore_request_fields)

    def read_body(raw: bytes) -> dict[str, Any]:
        return drop_ignored(parse_body(raw), ignore)

    def read_turn_body(raw: bytes, s: Session) -> dict[str, Any]:
        """A turn's body, parsed past the bytes it resends of the session's last one."""
        body, kept = parse_turn_body(raw, s.resent, parse_body, _loads)
        if not s.closed:  # a session finished meanwhile keeps nothing
            s.resent = kept
        return drop_ignored(body, ignore)

    async def chat(request: Request) -> Response:
        sid = _session_id(request)
        s = gateway.open_session(sid)
        raw = await read_raw(request, limit, timeout)
        req, stream, include_usage = parse_chat_request(read_turn_body(raw, s), gateway.reasoning_switches)
        _check_stops(req.stop, "stop", cfg.max_stop_strings)
        req.size = len(raw)
        result = await _guarded(request, gateway.run_turn(sid, req))
        if stream:
            return _flagged(_sse(chat_stream_events(result, gateway.model_id, include_usage)), result)
        return _flagged(_reply_json(chat_response(result, gateway.model_id)), result)

    async def messages(request: Request) -> Response:
        sid = _session_id(request)
        s = gateway.open_session(sid)
        raw = await read_raw(request, limit, timeout)
        req, stream = parse_messages_request(read_turn_body(raw, s), gateway.reasoning_switches)
        _check_stops(req.stop, "stop_sequences", cfg.max_stop_strings)
        req.size = len(raw)
        result = await _guarded(request, gateway.run_turn(sid, req))
        if stream:
            return _flagged(_sse(messages_stream_events(result, gateway.model_id)), result)
        # A tool_use block's input is the model's JSON as parsed, which may hold an infinity.
        reply = messages_response(result, gateway.model_id)
        return _flagged(_json(reply) if result.tool_calls else _reply_json(reply), result)

    async def responses(request: Request) -> Response:
        sid = _session_id(request)
        s = gateway.open_session(sid)
        raw = await read_raw(request, limit, timeout)
        body = read_body(raw)
        call = parse_responses_request(body, s.responses, gateway.reasoning_switches)
        call.req.size = len(raw) + (call.previous.size if call.previous is not None else 0)
        try:
            result = await _guarded(request, gateway.run_turn(sid, call.req))
        except GatewayError as err:
            raise input_error(err, body) from None
        response = finish_response(s, call, result, gateway.model_id)
        if call.stream:
            return _flagged(_sse(response_stream_events(response)), result)
        return _flagged(_json(response), result)

    async def responses_input_tokens(request: Request) -> Response:
        sid = _session_id(request)
        s = gateway.open_session(sid)
        raw = await read_raw(request, limit, timeout)
        body = read_body(raw)
        call = parse_responses_request(body, s.responses, gateway.reasoning_switches)
        size = len(raw) + (call.previous.size if call.previous is not None else 0)
        try:
            n = await gateway.count_prompt(
                sid, call.req.units, call.req.tools, size=size, template_kwargs=call.req.template_kwargs
            )
        except GatewayError as err:
            raise input_error(err, body) from None
        return _json({"object": "response.input_tokens", "input_tokens": n})

    def _stored(request: Request) -> tuple[dict[str, Any], str]:
        s = gateway.open_session(_session_id(request))
        rid = str(request.path_params["rid"])
        if rid not in s.responses:
            raise not_found(
                f"no stored response {rid[:40]!r} in this session (responses are kept per session, "
                "and not at all when created with store=false)"
            )
        return s.responses, rid

    async def get_response(request: Request) -> Response:
        stored, rid = _stored(request)
        return _json(stored[rid].full())

    async def delete_response(request: Request) -> Response:
        stored, rid = _stored(request)
        del stored[rid]
        return _json({"id": rid, "object": "response.deleted", "deleted": True})

    async def count_tokens(request: Request) -> Response:
        sid = _session_id(request)
        gateway.open_session(sid)
        raw = await read_raw(request, limit, timeout)
        units, tools, kwargs = parse_count_request(read_body(raw), gateway.reasoning_switches)
        n = await gateway.count_prompt(sid, units, tools, size=len(raw), template_kwargs=kwargs)
        return _json({"input_tokens": n})

    async def models(request: Request) -> Response:
        names = gateway.policies.model_names(gateway.model_id)
        return _json(
            {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "tracerl"} for n in names]}
        )

    async def health(request: Request) -> Response:
        return _json({"status": "ok", "sessions": len(gateway.sessions())})

    openai_chat = _endpoint(chat, anthropic=False)
    openai_responses = _endpoint(responses, anthropic=False)
    anth_messages = _endpoint(messages, anthropic=True)
    anth_count = _endpoint(count_tokens, anthropic=True)
    list_models = _endpoint(models, anthropic=False)
    routes = [Route("/health", _endpoint(health, anthropic=False), methods=["GET"])]
    for prefix in ("", "/sessions/{sid}"):
        routes += [
            Route(prefix + "/v1/chat/completions", openai_chat, methods=["POST"]),
            Route(prefix + "/v1/models", list_models, methods=["GET"]),
            Route(prefix + "/v1/responses", openai_responses, methods=["POST"]),
            Route(prefix + "/v1/responses/input_tokens", _endpoint(responses_input_tokens, anthropic=False),
                  methods=["POST"]),
            Route(prefix + "/v1/responses/{rid}", _endpoint(get_response, anthropic=False), methods=["GET"]),
            Route(prefix + "/v1/responses/{rid}", _endpoint(delete_response, anthropic=False), methods=["DELETE"]),
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
        "/v1/responses": openai_responses,
        "/v1/messages": anth_messages,
        "/v1/v1/messages": anth_messages,
    }
    return HotRoutes(app, hot)
