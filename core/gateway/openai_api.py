"""OpenAI chat-completions dialect: request parsing and response/SSE formatting.

Defines ``parse_chat_request``, ``chat_response`` and ``chat_stream_events``.
Streaming is replayed from the finished turn (samplers return whole turns):
a role chunk, content chunks, one chunk per tool call, the finish chunk, an
optional usage chunk, then ``[DONE]``; the SDKs assemble it exactly as a live stream.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from core.gateway.errors import bad_request
from core.gateway.fields import (
    CHAT_FIELDS,
    check_fields,
    key_list,
    opt_bool,
    opt_int,
    opt_number,
    opt_stop,
    verbosity_hint,
)
from core.gateway.messages import openai_tools, openai_units
from core.gateway.reasoning_switches import (
    AS_IS,
    ReasoningSwitches,
    openai_reasoning,
    template_kwargs,
)
from core.gateway.strict import strict_schemas
from core.gateway.tokentext import TokenLogprob
from core.gateway.toolchoice import openai_tool_choice
from core.gateway.turn import TurnRequest, TurnResult
from core.types import FinishReason

__all__ = ["chat_response", "chat_stream_events", "parse_chat_request"]

_CHUNK_CHARS = 64


_STREAM_OPTIONS = {"include_usage", "include_obfuscation"}
"""Known ``stream_options`` keys (obfuscation pads chunks against side channels; nothing to pad here)."""

_MAX_SEED = 2**63


def parse_chat_request(body: dict[str, Any], reasoning: ReasoningSwitches = AS_IS) -> tuple[TurnRequest, bool, bool]:
    """(turn request, stream, include_usage) from a ``/v1/chat/completions`` body.

    ``reasoning``: what the model's template offers (``Gateway.reasoning``), which
    decides whether ``reasoning_effort`` can be honoured.
    """
    if "messages" not in body:
        raise bad_request("'messages' is required: a non-empty list of chat messages", param="messages")
    check_fields(body, CHAT_FIELDS)
    n = opt_int(body, "n")
    if n not in (None, 1):
        raise bad_request(f"'n' must be 1 (one completion per turn), got {n}", param="n")
    max_tokens = opt_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_tokens", minimum=1)
    stream = opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request("'stream_options' must be an object", param="stream_options")
        unknown = sorted(set(options) - _STREAM_OPTIONS)
        if unknown:
            raise bad_request(
                f"'stream_options' has unknown keys {key_list(unknown)}; known: {sorted(_STREAM_OPTIONS)}", param="stream_options"
            )
        for key in _STREAM_OPTIONS & options.keys():
            if not isinstance(options[key], bool | None):
                raise bad_request(f"'stream_options.{key}' must be true or false", param="stream_options")
        include_usage = options.get("include_usage") is True
    seed = opt_int(body, "seed")
    if seed is not None and not -_MAX_SEED <= seed < _MAX_SEED:
        raise bad_request(f"'seed' must be a 64-bit integer, got {seed}", param="seed")
    logprobs = opt_bool(body, "logprobs")
    top = opt_int(body, "top_logprobs", minimum=0)
    if top is not None:
        if top > 20:
            raise bad_request(f"'top_logprobs' must be in [0, 20], got {top}", param="top_logprobs")
        if not logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if top > 0:
            raise bad_request(
                f"'top_logprobs' is {top}, but the gateway's samplers return only the sampled token's logprob, "
                "not alternatives; send 0 or drop it",
                param="top_logprobs",
            )
    kwargs = {**template_kwargs(body), **openai_reasoning(body, reasoning)}
    top_k = opt_int(body, "top_k")
    if top_k is not None and (top_k == 0 or top_k < -1):
        raise bad_request(f"'top_k' must be -1 or >= 1, got {top_k}", param="top_k")
    tools = openai_tools(body.get("tools"))
    req = TurnRequest(
        units=openai_units(body["messages"]),
        tools=tools,
        tool_choice=openai_tool_choice(body, tools),
        max_tokens=max_tokens,
        temperature=opt_number(body, "temperature", low=0.0, high=2.0),
        top_p=opt_number(body, "top_p", low=0.0, high=1.0, low_open=True),
        top_k=top_k,
        stop=opt_stop(body, "stop"),
        seed=seed,
        logprobs=logprobs,
        template_kwargs=kwargs or None,
        strict=strict_schemas(tools),
        hints_ignored=verbosity_hint(body.get("verbosity"), "verbosity"),
        model=body.get("model"),
    )
    return req, stream, include_usage


def _finish(result: TurnResult) -> str:
    if result.finish_reason is FinishReason.LENGTH:
        return "length"
    return "tool_calls" if result.tool_calls else "stop"


def _wire_calls(result: TurnResult) -> list[dict[str, Any]]:
    out = []
    for call in result.tool_calls:
        fn = call["function"]
        args = fn["arguments"]
        out.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                },
            }
        )
    return out


def _usage(result: TurnResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _logprobs(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """OpenAI's ``choices[].logprobs`` (no alternatives: ``top_logprobs`` is always empty)."""
    if entries is None:
        return None
    return {
        "content": [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": []} for e in entries],
        "refusal": None,
    }


def chat_response(result: TurnResult, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object for a finished turn."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = _wire_calls(result)
        if not result.content:
            message["content"] = None
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(result),
                     "logprobs": _logprobs(result.logprobs)}],
        "usage": _usage(result),
    }


def chat_stream_events(result: TurnResult, model: str, include_usage: bool) -> list[bytes]:
    """The SSE frames of a streamed ``chat.completion.chunk`` sequence."""
    base = {"id": "chatcmpl-" + secrets.token_hex(12), "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}).encode() + b"\n\n"

    frames = [frame([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    thought = result.reasoning
    for i in range(0, len(thought), _CHUNK_CHARS):
        delta = {"reasoning_content": thought[i : i + _CHUNK_CHARS]}
        frames.append(frame([{"index": 0, "delta": delta, "finish_reason": None}]))
    text = result.content
    for i in range(0, len(text), _CHUNK_CHARS):
        frames.append(frame([{"index": 0, "delta": {"content": text[i : i + _CHUNK_CHARS]}, "finish_reason": None}]))
    for i, call in enumerate(_wire_calls(result)):
        frames.append(frame([{"index": 0, "delta": {"tool_calls": [{"index": i, **call}]}, "finish_reason": None}]))
    # All logprobs ride on the finish chunk (the content chunks are cut by characters,
    # not tokens); the SDKs concatenate a choice's logprobs across chunks.
    finish: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": _finish(result)}
    if result.logprobs is not None:
        finish["logprobs"] = _logprobs(result.logprobs)
    frames.append(frame([finish]))
    if include_usage:
        frames.append(frame([], usage=_usage(result)))
    frames.append(b"data: [DONE]\n\n")
    return frames
