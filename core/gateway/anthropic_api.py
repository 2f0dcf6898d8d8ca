"""Anthropic messages dialect: request parsing and response/SSE formatting.

Defines ``parse_messages_request``, ``parse_count_request``,
``messages_response`` and ``messages_stream_events``. Streaming is replayed
from the finished turn with Anthropic's event sequence: ``message_start``, a
start/delta/stop triple per content block (``text_delta`` or
``input_json_delta``), ``message_delta`` with the stop reason, ``message_stop``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from core.gateway.errors import bad_request
from core.gateway.fields import (
    ANTHROPIC_FIELDS,
    check_fields,
    opt_bool,
    opt_int,
    opt_number,
    opt_stop,
)
from core.gateway.messages import Units, anthropic_tools, anthropic_units
from core.gateway.reasoning_switches import AS_IS, ReasoningSwitches, anthropic_thinking
from core.gateway.strict import strict_schemas
from core.gateway.toolchoice import anthropic_tool_choice
from core.gateway.turn import TurnRequest, TurnResult
from core.types import FinishReason

__all__ = ["messages_response", "messages_stream_events", "parse_count_request", "parse_messages_request"]


def parse_count_request(
    body: dict[str, Any], reasoning: ReasoningSwitches = AS_IS
) -> tuple[Units, list[dict[str, Any]] | None, dict[str, Any] | None]:
    """(units, tools, template variables) of a ``/v1/messages/count_tokens`` body.

    ``reasoning``: what the model's template offers (``Gateway.reasoning``), which
    decides whether ``thinking`` can be honoured.
    """
    if "messages" not in body:
        raise bad_request("'messages' is required: a non-empty list of messages", param="messages")
    check_fields(body, ANTHROPIC_FIELDS)
    tools = anthropic_tools(body.get("tools"))
    anthropic_tool_choice(body, tools)  # checked here too: count_tokens takes the same fields
    kwargs = anthropic_thinking(body, reasoning, None)
    return anthropic_units(body.get("system"), body["messages"]), tools, kwargs or None


def parse_messages_request(body: dict[str, Any], reasoning: ReasoningSwitches = AS_IS) -> tuple[TurnRequest, bool]:
    """(turn request, stream) from a ``/v1/messages`` body."""
    if "messages" not in body:
        raise bad_request("'messages' is required: a non-empty list of messages", param="messages")
    max_tokens = opt_int(body, "max_tokens", minimum=1)
    if max_tokens is None:
        raise bad_request("'max_tokens' is required (an integer >= 1)", param="max_tokens")
    check_fields(body, ANTHROPIC_FIELDS)
    units, tools = anthropic_units(body.get("system"), body["messages"]), anthropic_tools(body.get("tools"))
    kwargs = anthropic_thinking(body, reasoning, max_tokens)
    top_k = opt_int(body, "top_k", minimum=1)
    req = TurnRequest(
        units=units,
        tools=tools,
        tool_choice=anthropic_tool_choice(body, tools),
        max_tokens=max_tokens,
        temperature=opt_number(body, "temperature", low=0.0, high=1.0),
        top_p=opt_number(body, "top_p", low=0.0, high=1.0, low_open=True),
        top_k=top_k,
        stop=opt_stop(body, "stop_sequences"),
        template_kwargs=kwargs or None,
        strict=strict_schemas(body.get("tools"), flat=True),
        model=body.get("model"),
    )
    return req, opt_bool(body, "stream")


def _stop_reason(result: TurnResult) -> str:
    if result.finish_reason is FinishReason.LENGTH:
        return "max_tokens"
    if result.tool_calls:
        return "tool_use"
    return "stop_sequence" if result.stop_string is not None else "end_turn"


def _blocks(result: TurnResult) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if result.reasoning:
        # No signature: the gateway's reasoning is plain text it gets back as is.
        blocks.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if result.content or not result.tool_calls:
        blocks.append({"type": "text", "text": result.content})
    for call in result.tool_calls:
        fn = call["function"]
        args = fn["arguments"]
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"],
             "input": args if isinstance(args, dict) else {"_raw_arguments": args}}
        )
    return blocks


def messages_response(result: TurnResult, model: str) -> dict[str, Any]:
    """The ``message`` object for a finished turn."""
    return {
        "id": "msg_" + secrets.token_hex(12),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(result),
        "stop_reason": _stop_reason(result),
        "stop_sequence": result.stop_string,
        "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens},
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps({"type": kind, **data}).encode() + b"\n\n"


def messages_stream_events(result: TurnResult, model: str) -> list[bytes]:
    """The SSE frames of a streamed message."""
    msg = messages_response(result, model)
    start = {**msg, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": result.prompt_tokens, "output_tokens": 0}}
    frames = [_event("message_start", {"message": start})]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "thinking":
            frames.append(
                _event("content_block_start",
                       {"index": i, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
            )
            frames.append(
                _event("content_block_delta",
                       {"index": i, "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})
            )
        elif block["type"] == "text":
            frames.append(_event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            if block["text"]:
                frames.append(
                    _event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}})
                )
        else:
            frames.append(
                _event("content_block_start",
                       {"index": i, "content_block": {**block, "input": {}}})
            )
            frames.append(
                _event("content_block_delta",
                       {"index": i, "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            )
        frames.append(_event("content_block_stop", {"index": i}))
    frames.append(
        _event("message_delta",
               {"delta": {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]},
                "usage": {"output_tokens": result.completion_tokens}})
    )
    frames.append(_event("message_stop", {}))
    return frames
