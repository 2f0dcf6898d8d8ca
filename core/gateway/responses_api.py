"""OpenAI Responses dialect: request parsing, the session's stored responses, response/SSE formatting.

Defines:

- ``parse_responses_request``: a ``/v1/responses`` body as a ``ResponsesCall``
  (the ``TurnRequest`` the service runs, plus what the response echoes).
- ``StoredResponse`` and ``finish_response``: the response object of a finished
  turn, kept in the session (``Session.responses``) unless ``store`` is false, so
  a follow-up with ``previous_response_id`` and only its new items renders the
  whole conversation.
- ``response_stream_events``: the SSE frames of a streamed response, replayed
  from the finished turn (``response.created`` ... ``response.completed``).
- ``input_error``: a service error re-pointed at the Responses field it is about.

Every top-level field is either used (``model`` picks the turn's policy), accepted because
it cannot change what the model produces (``metadata``, ``user``, prompt-cache hints ...), or
refused with a 400 naming it: the gateway never accepts and ignores a field
that would change the output (docs/gateway.md, "Responses API").
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

from core.gateway.errors import SURROGATE_HINT, GatewayError, bad_request
from core.gateway.fields import opt_bool, opt_int, opt_number, short_repr, verbosity_hint
from core.gateway.messages import raws_of
from core.gateway.reasoning_switches import AS_IS, ReasoningSwitches, openai_reasoning
from core.gateway.responses_items import group_items, item_units, responses_tools
from core.gateway.safejson import lone_surrogate
from core.gateway.session import Session
from core.gateway.strict import strict_schemas
from core.gateway.tokentext import TokenLogprob
from core.gateway.toolchoice import ToolChoice, openai_tool_choice
from core.gateway.turn import TurnRequest, TurnResult
from core.types import FinishReason

__all__ = [
    "ResponsesCall",
    "StoredResponse",
    "finish_response",
    "input_error",
    "parse_responses_request",
    "response_stream_events",
]

_CHUNK_CHARS = 64

_USED = frozenset({
    "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "top_k", "stream", "stream_options", "previous_response_id", "store",
    "include", "text", "truncation", "reasoning", "top_logprobs", "background", "model",
})
"""Fields read below (each refused when it asks for what the gateway cannot do)."""
_NO_EFFECT = frozenset({
    "metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "service_tier", "max_tool_calls",
})
"""Fields that cannot change what the model produces here: accepted (``max_tool_calls``
limits built-in tools, which this gateway does not offer)."""
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
"""OpenAI's limits on a response's ``metadata``, enforced: every stored response keeps its
copy for the session's life, outside the token budget (60 requests with 4 MB each took the
gateway from 94 to 337 MB; the bound was about 8 GB per session). Within them a session's
stored metadata is at most ``max_turns_per_session`` x 9 KB."""
USER_CHARS = METADATA_VALUE_CHARS
"""Longest ``user`` string: stored with each response like ``metadata`` (and echoed), so
bounded as one metadata value is; before, only the body size bounded it."""
_LOGPROBS = "message.output_text.logprobs"
_INCLUDE_OK = frozenset({"reasoning.encrypted_content", _LOGPROBS})
"""``include`` values honoured: reasoning items always carry their text in ``content``;
``message.output_text.logprobs`` returns each sampled token's logprob."""


@dataclass(eq=False)
class StoredResponse:
    """A response kept in its session for ``previous_response_id`` and ``GET /v1/responses/{id}``."""

    parent: StoredResponse | None
    """The response it continued (``previous_response_id``), None for a fresh conversation."""
    groups: list[Any]
    """The unit raws it added: its request's input groups, then its output turn (a list of items)."""
    response: dict[str, Any]
    """The response object as returned."""
    size: int
    """Rough bytes of the whole conversation (sizes a full render, see ``TurnRequest.size``)."""
    logprobs: list[TokenLogprob] | None = None
    """The message's sampled-token logprobs when they were asked for. Kept as the turn's
    ``TokenLogprob`` objects (slotted; their strings and byte lists shared with the gateway's
    ``TokenText`` cache), not as the per-token dicts the response carried (several times the
    memory, for the session's life): ``response`` and ``groups`` hold the message with
    ``logprobs: []``, and ``full`` puts them back."""

    def full(self) -> dict[str, Any]:
        """The response object as it was returned (``GET /v1/responses/{id}``)."""
        if self.logprobs is None:
            return self.response
        wire = _wire_logprobs(self.logprobs)
        output = [_with_logprobs(item, wire) if item["type"] == "message" else item for item in self.response["output"]]
        return {**self.response, "output": output}

    def conversation(self) -> list[Any]:
        """Every unit raw of the conversation up to and including this response's output."""
        chain: list[StoredResponse] = []
        node: StoredResponse | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        return [g for r in reversed(chain) for g in r.groups]


@dataclass
class ResponsesCall:
    """A parsed ``/v1/responses`` request."""

    req: TurnRequest
    """What the service runs."""
    stream: bool
    """Answer as server-sent events."""
    store: bool
    """Keep the response in the session (``previous_response_id``, ``GET``)."""
    previous: StoredResponse | None
    """The response ``previous_response_id`` names."""
    first_new: int
    """Index in ``req.units`` of this request's first input group (after the instructions
    and the stored conversation)."""
    echo: dict[str, Any]
    """Request fields the response object repeats."""


def _str_or_none(body: dict[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"'{key}' must be a string, got {type(v).__name__}", param=key)
    return v


def _refuse(key: str, why: str) -> GatewayError:
    return bad_request(f"'{key}' {why}", param=key)


def _check_fields(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key in _USED or key in _NO_EFFECT or value is None:
            continue
        if key == "conversation":
            raise _refuse(key, "is not supported: continue a conversation with previous_response_id")
        raise bad_request(
            f"'{key[:60]}' is not supported by this gateway (docs/gateway.md lists the Responses fields it serves)",
            param=key[:60],
        )
    if opt_bool(body, "background"):
        raise _refuse("background", "must be false: responses are answered in the request")
    if body.get("truncation") not in (None, "disabled"):
        raise _refuse("truncation", "must be 'disabled': the gateway never drops input (an overlong prompt is a 400)")
    top = opt_int(body, "top_logprobs", minimum=0)
    if top is not None and top > 20:
        raise _refuse("top_logprobs", f"must be in [0, 20], got {top}")
    if top:
        raise _refuse(
            "top_logprobs",
            f"is {top}, but the gateway's samplers return only the sampled token's logprob, not alternatives; "
            f"send 0 or drop it (include {_LOGPROBS!r} returns the sampled tokens' logprobs)",
        )
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
            raise _refuse("include", "must be a list of strings")
        for v in include:
            if v not in _INCLUDE_OK:
                raise _refuse("include", f"holds {short_repr(v)}, which this gateway cannot return (it returns {sorted(_INCLUDE_OK)})")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (fmt is not None and fmt != {"type": "text"}):
            raise bad_request(
                "'text.format' must be {'type': 'text'}: the gateway does not constrain decoding to a JSON schema",
                param="text",
            )
        verbosity_hint(text.get("verbosity"), "text.verbosity")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _refuse("stream_options", "must be an object")


def _reasoning(body: dict[str, Any], offered: ReasoningSwitches) -> dict[str, Any]:
    """Template variables for ``reasoning.effort`` (as chat's ``reasoning_effort``, ``reasoning_switches.py``)."""
    v = body.get("reasoning")
    if v is None:
        return {}
    if not isinstance(v, dict) or set(v) - {"effort", "summary", "generate_summary"}:
        raise _refuse("reasoning", "must be an object with 'effort' and 'summary'")
    for key in ("summary", "generate_summary"):
        if v.get(key) not in (None, "auto"):
            raise _refuse(
                "reasoning",
                f"has {key} {short_repr(v[key], 20)}: the model writes no summaries; the reasoning item carries its "
                "reasoning text (send 'auto' or drop it)",
            )
    try:
        return openai_reasoning({"reasoning_effort": v.get("effort")}, offered)
    except GatewayError as err:
        raise bad_request(err.message.replace("'reasoning_effort'", "'reasoning.effort'"), param="reasoning") from None


def parse_responses_request(
    body: dict[str, Any], stored: dict[str, StoredResponse], reasoning: ReasoningSwitches = AS_IS
) -> ResponsesCall:
    """A ``/v1/responses`` body as a ``ResponsesCall``.

    Args:
        body: The request JSON object.
        stored: The session's stored responses (``Session.responses``).
        reasoning: What the model's template offers (``Gateway.reasoning``), which decides
            whether ``reasoning.effort`` can be honoured.

    Raises:
        GatewayError: 400 naming the field that is malformed or cannot be honoured.
    """
    _check_fields(body)
    if "input" not in body or body["input"] in ("", []):
        raise bad_request("'input' is required: a string or a non-empty list of input items", param="input")
    instructions = _str_or_none(body, "instructions")
    prev_id = _str_or_none(body, "previous_response_id")
    previous = None
    if prev_id is not None:
        previous = stored.get(prev_id)
        if previous is None:
            raise bad_request(
                f"previous response {prev_id[:40]!r} is not stored in this session: responses are kept per "
                "session while it is open, and not at all when created with store=false; send the whole "
                "conversation as input instead",
                param="previous_response_id",
            )
    new_groups = group_items(body["input"])
    past = previous.conversation() if previous is not None else []
    first_new = len(past) + (1 if instructions else 0)
    tools = responses_tools(body.get("tools"))
    choice = openai_tool_choice(body, tools)
    kwargs = _reasoning(body, reasoning)
    req = TurnRequest(
        units=item_units(instructions, past, new_groups),
        tools=tools,
        tool_choice=choice,
        max_tokens=opt_int(body, "max_output_tokens", minimum=1),
        temperature=opt_number(body, "temperature", low=0.0, high=2.0),
        top_p=opt_number(body, "top_p", low=0.0, high=1.0, low_open=True),
        top_k=opt_int(body, "top_k"),
        logprobs=_LOGPROBS in (body.get("include") or ()),
        template_kwargs=kwargs or None,
        strict=strict_schemas(body.get("tools"), flat=True),
        hints_ignored=verbosity_hint((body.get("text") or {}).get("verbosity"), "text.verbosity"),
        model=body.get("model"),
    )
    if req.top_k is not None and (req.top_k == 0 or req.top_k < -1):
        raise bad_request(f"'top_k' must be -1 or >= 1, got {req.top_k}", param="top_k")
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise _refuse("store", f"must be true or false, got {type(store).__name__}")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise _refuse("metadata", "must be an object of string keys and string values")
    if metadata and (
        len(metadata) > METADATA_PAIRS
        or any(len(k) > METADATA_KEY_CHARS or len(v) > METADATA_VALUE_CHARS for k, v in metadata.items())
    ):
        raise _refuse(
            "metadata",
            f"holds at most {METADATA_PAIRS} pairs, keys of at most {METADATA_KEY_CHARS} characters and "
            f"values of at most {METADATA_VALUE_CHARS} (OpenAI's limits; stored responses keep it "
            f"for the session's life), got {len(metadata)} pairs, longest value "
            f"{max(len(v) for v in metadata.values())} characters",
        )
    user = _str_or_none(body, "user")
    if user is not None and len(user) > USER_CHARS:
        raise _refuse(
            "user",
            f"holds at most {USER_CHARS} characters (stored responses keep it for the session's life, "
            f"as they keep metadata), got {len(user)}; send a short stable id for the end user",
        )
    echo = {
        "instructions": instructions,
        "max_output_tokens": req.max_tokens,
        "metadata": metadata or {},
        "parallel_tool_calls": choice.parallel,
        "previous_response_id": prev_id,
        "temperature": req.temperature,
        "tool_choice": _choice_wire(choice, body.get("tool_choice")),
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "tools": [_flat(t) for t in tools or ()],
        "top_p": req.top_p,
        "user": user,
    }
    return ResponsesCall(req, opt_bool(body, "stream"), store is not False, previous, first_new, echo)


def _choice_wire(choice: ToolChoice, sent: Any) -> Any:
    """``tool_choice`` as the response object repeats it: rebuilt from what was parsed,
    so nothing unvalidated from the request is echoed."""
    if choice.names is None:
        return choice.mode
    tools = [{"type": "function", "name": n} for n in choice.names]
    if isinstance(sent, dict) and sent.get("type") == "function":
        return tools[0]
    return {"type": "allowed_tools", "mode": choice.mode, "tools": tools}


def _flat(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat-form tool as the Responses flat tool the response object lists."""
    return {"type": "function", **tool["function"]}


def input_error(err: GatewayError, body: dict[str, Any]) -> GatewayError:
    """``err`` from the service, pointed at the Responses field (``input``, not ``messages``)."""
    if err.param != "messages":
        return err
    if SURROGATE_HINT in err.message:
        for key in ("instructions", "input", "tools"):
            where = lone_surrogate(body.get(key))
            if where is not None:
                return bad_request(f"{key}{where} {SURROGATE_HINT}", param=key)
    return GatewayError(err.message, status=err.status, type=err.type, code=err.code, param="input")


def _wire_args(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _output_items(result: TurnResult) -> list[dict[str, Any]]:
    """The output items of a turn: reasoning, then the message, then one item per tool call."""
    items: list[dict[str, Any]] = []
    reasoning = result.reasoning  # split off by the gateway's reasoning parser (core.gateway.reasoning_parsers)
    if reasoning:
        items.append({
            "type": "reasoning", "id": "rs_" + secrets.token_hex(16), "summary": [],
            "content": [{"type": "reasoning_text", "text": reasoning}], "encrypted_content": None,
            "status": "completed",
        })
    done = "incomplete" if result.finish_reason is FinishReason.LENGTH else "completed"
    logprobs = _wire_logprobs(result.logprobs or ())
    if result.content or not result.tool_calls or result.logprobs is not None:
        # Asked-for logprobs ride on the message, so a turn of only tool calls gets an empty
        # one; sent back, it changes nothing (an empty message merges into the calls' turn).
        items.append({
            "type": "message", "id": "msg_" + secrets.token_hex(16), "role": "assistant", "status": done,
            "content": [{"type": "output_text", "text": result.content, "annotations": [], "logprobs": logprobs}],
        })
    for call in result.tool_calls:
        fn = call["function"]
        items.append({
            "type": "function_call", "id": "fc_" + secrets.token_hex(16), "call_id": call["id"],
            "name": fn["name"], "arguments": _wire_args(fn["arguments"]), "status": "completed",
        })
    return items


def _wire_logprobs(entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": []} for e in entries]


def _with_logprobs(item: dict[str, Any], logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A message item (copied) whose ``output_text`` carries ``logprobs``."""
    return {**item, "content": [{**item["content"][0], "logprobs": logprobs}]}


def finish_response(session: Session, call: ResponsesCall, result: TurnResult, model: str) -> dict[str, Any]:
    """The ``response`` object of a finished turn, kept in ``session.responses`` when ``call.store``.

    Call it right after ``Gateway.run_turn`` returned, with no ``await`` in between: the
    session's ``matched`` is then this turn's (or None).
    """
    output = _output_items(result)
    truncated = result.finish_reason is FinishReason.LENGTH
    now = int(time.time())
    response: dict[str, Any] = {
        "id": "resp_" + secrets.token_hex(24),
        "object": "response",
        "created_at": now,
        "completed_at": now,
        "status": "incomplete" if truncated else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "model": model,
        "output": output,
        **call.echo,
        "store": call.store,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "background": False,
        "usage": {
            "input_tokens": result.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": result.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        },
    }
    if call.store:
        raws = raws_of(call.req.units)
        m = session.matched
        if m is not None and m.version == session.tree_version and len(m.raws) == len(raws):
            # The same groups, with the objects the session already kept for the history
            # before this turn: a client that resends the whole conversation every turn
            # then costs one copy of it, not one per stored response.
            raws = m.raws
        last = next(reversed(session.responses.values()), None)
        if last is not None:
            # Agents resend the same tools and instructions each turn: keep one copy.
            for key in ("tools", "instructions"):
                if response[key] == last.response[key]:
                    response[key] = last.response[key]
        kept, logprobs = response, None
        if result.logprobs is not None:
            # Stored without the per-token dicts (StoredResponse.logprobs); the client gets them now.
            logprobs = result.logprobs
            output = [_with_logprobs(item, []) if item["type"] == "message" else item for item in output]
            kept = {**response, "output": output}
        size = call.req.size + len(json.dumps(output))
        new = [*raws[call.first_new :], output]
        session.responses[response["id"]] = StoredResponse(call.previous, new, kept, size, logprobs)
    return response


def response_stream_events(response: dict[str, Any]) -> list[bytes]:
    """The SSE frames of a streamed response (the SDKs' event sequence, replayed)."""
    seq = count()

    def ev(kind: str, **data: Any) -> bytes:
        payload = {"type": kind, **data, "sequence_number": next(seq)}
        return b"event: " + kind.encode() + b"\ndata: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"

    start = {**response, "status": "in_progress", "output": [], "usage": None,
             "incomplete_details": None, "completed_at": None}
    frames = [ev("response.created", response=start), ev("response.in_progress", response=start)]
    for i, item in enumerate(response["output"]):
        ref = {"item_id": item["id"], "output_index": i}
        kind = item["type"]
        if kind == "function_call":
            frames.append(ev("response.output_item.added", output_index=i,
                             item={**item, "arguments": "", "status": "in_progress"}))
            frames.append(ev("response.function_call_arguments.delta", **ref, delta=item["arguments"]))
            frames.append(ev("response.function_call_arguments.done", **ref,
                             arguments=item["arguments"], name=item["name"]))
        else:
            frames.append(ev("response.output_item.added", output_index=i,
                             item={**item, "content": [], "status": "in_progress"}))
            part = item["content"][0]
            text = part["text"]
            prefix = "response.output_text" if kind == "message" else "response.reasoning_text"
            empty = {**part, "text": ""}
            extra: dict[str, Any] = {}
            if kind == "message":
                # Logprobs ride on the done events (deltas are cut by characters, not tokens).
                empty["logprobs"] = extra["logprobs"] = []
            frames.append(ev("response.content_part.added", **ref, content_index=0, part=empty))
            for k in range(0, len(text), _CHUNK_CHARS):
                frames.append(ev(prefix + ".delta", **ref, content_index=0, delta=text[k : k + _CHUNK_CHARS], **extra))
            if kind == "message":
                extra["logprobs"] = part["logprobs"]
            frames.append(ev(prefix + ".done", **ref, content_index=0, text=text, **extra))
            frames.append(ev("response.content_part.done", **ref, content_index=0, part=part))
        frames.append(ev("response.output_item.done", output_index=i, item=item))
    final = "response.completed" if response["status"] == "completed" else "response.incomplete"
    frames.append(ev(final, response=response))
    return frames
