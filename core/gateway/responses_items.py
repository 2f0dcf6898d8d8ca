"""Responses API input items and tools, in the canonical chat form the renderer takes.

Defines:

- ``group_items``: a request's ``input`` items as unit raws. A message or a
  ``function_call_output`` is one unit; an assistant turn (consecutive
  ``reasoning``, assistant ``message`` and ``function_call`` items, in that
  order) is one unit, the list of its items. The gateway answers a turn with
  exactly such a run of items, and one assistant message with ``tool_calls``
  is what the chat template rendered for it, so the echoed run compares equal
  to the recorded turn and the next prompt extends the served tokens.
- ``item_units``: a conversation's units (the ``instructions`` first).
- ``responses_tools``: Responses-style flat function tools in chat-template form.

Only text is accepted: images, files, audio and hosted-tool items are a 400
naming the item. Reasoning items become the assistant message's
``reasoning_content`` (``REASONING_KEY``), which the chat template renders where
it keeps past reasoning (Qwen3 within one question's tool loop) and drops where
it does not (see docs/gateway.md, Model families).
"""

from __future__ import annotations

from typing import Any

from core.gateway.errors import bad_request
from core.gateway.fields import short_repr
from core.gateway.messages import Canon, Unit, Units, canonical_tool_call

__all__ = ["REASONING_KEY", "group_items", "item_units", "reasoning_text", "responses_tools"]

REASONING_KEY = "reasoning_content"
"""The canonical assistant message key that carries reasoning back to the template
(``core.gateway.messages``)."""

_KINDS = ("message", "function_call", "function_call_output", "reasoning")
"""The item types accepted (a tuple: ``in`` compares with ``==``, so an unhashable ``type`` is fine)."""
_ASSISTANT_RANK = {"reasoning": 0, "message": 1, "function_call": 2}
"""Order of the items of one assistant turn, as the gateway emits them."""
_TEXT_PARTS = ("input_text", "output_text", "text")
_REFUSED_ITEMS = (
    "item_reference",
    "file_search_call",
    "web_search_call",
    "computer_call",
    "computer_call_output",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "custom_tool_call",
    "custom_tool_call_output",
    "compaction",
)


def _kind(item: Any, param: str) -> str:
    """The item's type: ``message``, ``function_call``, ``function_call_output`` or ``reasoning``."""
    if not isinstance(item, dict):
        raise bad_request(f"{param} must be an object (an input item), got {type(item).__name__}", param="input")
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    if kind in _KINDS:
        return str(kind)
    if kind in _REFUSED_ITEMS:
        hint = (
            "; send the item itself, or continue from a stored response with previous_response_id"
            if kind == "item_reference"
            else "; this gateway serves function tools only"
        )
        raise bad_request(f"{param}.type is {short_repr(kind)}, which this gateway does not accept{hint}", param="input")
    raise bad_request(
        f"{param}.type is {short_repr(kind)}; expected 'message', 'function_call', 'function_call_output' or 'reasoning'",
        param="input",
    )


def group_items(items: Any, *, start: int = 0) -> list[Any]:
    """``input`` items as unit raws: an item, or the list of one assistant turn's items.

    Args:
        items: The ``input`` list (or a string: one user message).
        start: Index of ``items[0]`` in the request's ``input``, for error messages.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad_request(f"'input' must be a string or a list of items, got {type(items).__name__}", param="input")
    out: list[Any] = []
    run: list[Any] | None = None
    rank = -1
    for i, item in enumerate(items, start):
        # Inline for the usual item (the whole history is resent every turn); _kind for the rest.
        kind = item.get("type") if type(item) is dict else None
        if kind is None and type(item) is dict and "role" in item:
            kind = "message"
        elif kind not in _KINDS:
            kind = _kind(item, f"input[{i}]")
        if kind == "function_call_output" or (kind == "message" and item.get("role") != "assistant"):
            run = None
            out.append(item)
            continue
        r = _ASSISTANT_RANK[kind]
        if run is None or r < rank or (r == rank and kind == "message"):
            run = []
            out.append(run)
        run.append(item)
        rank = r
    return out


def _text(content: Any, param: str) -> str:
    """A message's text: a string or a list of text parts (``input_text``, ``output_text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or a list of text parts, got {type(content).__name__}", param="input")
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise bad_request(
                f"{param}[{j}] has type {short_repr(kind)}; this gateway accepts only text parts "
                "({'type': 'input_text' or 'output_text', 'text': ...})",
                param="input",
            )
    return "".join(texts)


def reasoning_text(item: dict[str, Any], param: str) -> str:
    """The text of a ``reasoning`` item: its ``reasoning_text`` content (or, without any, its summary)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise bad_request(f"{param}.content must be a list of reasoning_text parts", param="input")
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise bad_request(f"{param}.content[{j}] must be {{'type': 'reasoning_text', 'text': ...}}", param="input")
        texts.append(part["text"])
    return "".join(texts)


def _convert_single(item: Any, param: str) -> Canon:
    if item.get("type") == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise bad_request(f"{param}.call_id must be a string", param="input")
        return [{"role": "tool", "content": _text(item.get("output"), f"{param}.output"), "tool_call_id": call_id}]
    role = item.get("role")
    if role in ("system", "developer"):
        return [{"role": "system", "content": _text(item.get("content"), f"{param}.content")}]
    if role == "user":
        return [{"role": "user", "content": _text(item.get("content"), f"{param}.content")}]
    raise bad_request(
        f"{param}.role is {short_repr(role)}; expected 'user', 'system', 'developer' or 'assistant'", param="input"
    )


def _convert_turn(items: list[Any], param: str, start: int) -> Canon:
    """One assistant turn's items as one assistant message."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, item in enumerate(items, start):
        where = f"{param}[{i}]"
        kind = item.get("type") or "message"
        if kind == "reasoning":
            thoughts.append(reasoning_text(item, where))
        elif kind == "message":
            texts.append(_text(item.get("content"), f"{where}.content"))
        else:
            name, call_id, args = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
                raise bad_request(
                    f"{where} must have string 'name', 'call_id' and 'arguments' (a JSON string)", param="input"
                )
            calls.append(canonical_tool_call(call_id, name, args, param=f"{where}.arguments"))
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if "".join(thoughts):
        msg[REASONING_KEY] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def _instructions(raw: Any, i: int) -> Canon:
    return [{"role": "system", "content": raw[1]}]


def item_units(instructions: str | None, stored: list[Any], new: list[Any]) -> Units:
    """The units of a conversation: the instructions (if any), a stored conversation's
    groups, then this request's (``group_items``).

    ``instructions`` are this request's: a previous response's are not carried over
    (as on OpenAI), so an agent that sends the same instructions every turn keeps
    one system message at the front. Error messages name the request's
    ``input[i]``; stored groups were accepted before.
    """
    raws: list[Any] = [("instructions", instructions)] if instructions else []
    raws.extend(stored)
    first_new = len(raws)
    raws.extend(new)
    positions = [0] * len(raws)
    pos = 0
    for k in range(first_new, len(raws)):
        positions[k] = pos
        pos += len(raws[k]) if isinstance(raws[k], list) else 1

    def make(k: int) -> Unit:
        raw, at = raws[k], positions[k]
        if isinstance(raw, tuple):
            return Unit(raw, _instructions, -1)
        if isinstance(raw, list):
            return Unit(raw, lambda r, _i: _convert_turn(r, "input", at), at)
        return Unit(raw, lambda r, _i: _convert_single(r, f"input[{at}]"), at)

    return Units(raws, make)


def responses_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Flat Responses function tools (``{type, name, description, parameters, strict}``)
    in chat-template form; None when absent or empty.

    ``strict`` is not passed on to the template; it is honoured by what is returned
    (``core.gateway.strict``: a call that breaks the schema is not returned as a call).
    """
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be a list, got {type(tools).__name__}", param="tools")
    out = []
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad_request(f"tools[{j}] must be an object, got {type(t).__name__}", param="tools")
        if t.get("type") != "function":
            raise bad_request(
                f"tools[{j}].type is {short_repr(t.get('type'))}; this gateway serves function tools only "
                "({'type': 'function', 'name': ..., 'parameters': {...}})",
                param="tools",
            )
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise bad_request(f"tools[{j}].name must be a non-empty string", param="tools")
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{j}].parameters must be a JSON schema object", param="tools")
        # Chat's key order (name, description, parameters): templates dump tools with tojson.
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            if not isinstance(t["description"], str):
                raise bad_request(f"tools[{j}].description must be a string", param="tools")
            fn["description"] = t["description"]
        if t.get("strict") is not None and not isinstance(t["strict"], bool):
            raise bad_request(f"tools[{j}].strict must be true or false", param="tools")
        fn["parameters"] = params if params is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out

