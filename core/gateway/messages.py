"""Client messages to the canonical chat-template form, for both wire dialects.

Defines:

- ``Unit``: one wire message (or the Anthropic ``system`` field) with its
  canonical form computed lazily. History matching compares the raw JSON first
  (a C-speed ``==``), so a message the gateway has seen before is never
  converted again; that keeps a turn's cost independent of the history length.
- ``Units``: a request's units, each made on first use; ``raws`` is the
  request's raw messages as one list, so a history the gateway has seen is
  recognised by one C-speed list comparison (``core.gateway.history.match_path``)
  and no unit is made for it.
- ``openai_units`` / ``anthropic_units``: validate a request's messages and
  wrap them as units.
- ``openai_tools`` / ``anthropic_tools``: validate tool definitions and return
  them in the ``{"type": "function", "function": {...}}`` form chat templates take.
- ``canonical_tool_call``: the canonical form of one tool call.

Canonical messages are plain dicts: ``role`` (system, user, assistant, tool),
``content`` (a string), and for assistants optional ``tool_calls`` whose
``arguments`` are a dict when they parse as a JSON object, and optional
``reasoning_content`` (the reasoning a client sends back: OpenAI
``reasoning_content`` or ``reasoning``, Anthropic ``thinking`` blocks; the
key Qwen3's and DeepSeek's templates read). Tool calls keep their ids so the
same message echoed back by a client compares equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from core.gateway import safejson
from core.gateway.errors import bad_request
from core.gateway.fields import short_repr

__all__ = [
    "Unit",
    "Units",
    "anthropic_tools",
    "anthropic_units",
    "canonical_tool_call",
    "openai_tools",
    "openai_units",
    "raws_of",
]

Canon = list[dict[str, Any]]


@dataclass(slots=True)
class Unit:
    """One wire message and a converter to its canonical message(s)."""

    raw: Any
    """The message exactly as parsed from the request JSON."""
    convert: Callable[[Any, int], Canon]
    """Validates ``raw`` and returns its canonical messages (an Anthropic user turn may hold several)."""
    index: int
    """Position in the request, for error messages."""
    _canon: Canon | None = None

    def canon(self) -> Canon:
        """The canonical messages, converted on first use (raises ``GatewayError`` if invalid)."""
        if self._canon is None:
            self._canon = self.convert(self.raw, self.index)
        return self._canon


class Units(Sequence[Unit]):
    """A request's units, each made on first use (an unchanged history costs no per-message work)."""

    __slots__ = ("_make", "_units", "raws")

    def __init__(self, raws: list[Any], make: Callable[[int], Unit]) -> None:
        """Args:
        raws: Each unit's raw JSON, in order (not copied; never mutated here).
        make: Builds the unit at an index.
        """
        self.raws = raws
        self._make = make
        self._units: list[Unit | None] = [None] * len(raws)

    def __len__(self) -> int:
        return len(self.raws)

    @overload
    def __getitem__(self, i: int) -> Unit: ...
    @overload
    def __getitem__(self, i: slice) -> list[Unit]: ...
    def __getitem__(self, i: int | slice) -> Unit | list[Unit]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.raws)))]
        unit = self._units[i]
        if unit is None:
            unit = self._units[i] = self._make(i % len(self.raws))
        return unit

    def __iter__(self) -> Iterator[Unit]:
        for i in range(len(self.raws)):
            yield self[i]


def raws_of(units: Sequence[Unit]) -> list[Any]:
    """The units' raw JSON as a list (``Units.raws`` as is; built for other sequences)."""
    raws = getattr(units, "raws", None)
    return raws if isinstance(raws, list) else [u.raw for u in units]


def canonical_tool_call(call_id: str, name: str, arguments: Any, *, param: str | None = None) -> dict[str, Any]:
    """A tool call in canonical form; JSON-object argument strings become dicts.

    ``param``: where the arguments sit in a client request; arguments nested
    deeper than ``safejson.MAX_DEPTH`` are then a 400 naming it (elsewhere they
    stay a string).
    """
    if isinstance(arguments, str):
        try:
            parsed = safejson.loads(arguments)
        except safejson.TooDeep as exc:
            if param is not None:
                raise bad_request(f"{param} is {exc}; send flatter arguments", param=param) from None
            parsed = None
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _text(content: Any, param: str, *, allow_none: bool = False) -> str:
    """Flatten a string or a list of text parts; refuse images and other parts by name."""
    if isinstance(content, str):
        return content
    if content is None and allow_none:
        return ""
    if isinstance(content, list):
        out: list[str] = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise bad_request(f"{param}[{j}] must be an object, got {type(part).__name__}", param=param)
            kind = part.get("type")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"{param}[{j}] has type {short_repr(kind)}; this gateway accepts only text parts "
                    "({'type': 'text', 'text': ...})",
                    param=param,
                )
            out.append(part["text"])
        return "".join(out)
    raise bad_request(
        f"{param} must be a string or a list of text parts, got {type(content).__name__}", param=param
    )


def _check_messages(messages: Any, param: str) -> list[Any]:
    if not isinstance(messages, list):
        raise bad_request(f"'{param}' must be a list of messages, got {type(messages).__name__}", param=param)
    if not messages:
        raise bad_request(f"'{param}' must hold at least one message, got an empty list", param=param)
    if set(map(type, messages)) == {dict}:  # C speed: the usual case, every message a plain object
        return messages
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"{param}[{i}] must be an object, got {type(m).__name__}", param=param)
    return messages


# ----------------------------------------------------------------------------- OpenAI


def _openai_tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"{param} must be a list, got {type(calls).__name__}", param=param)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{param}[{j}] must be {{'function': {{'name': str, 'arguments': ...}}}}", param=param)
        args = fn.get("arguments", "{}")
        if not isinstance(args, str | dict):
            raise bad_request(f"{param}[{j}].function.arguments must be a JSON string", param=param)
        call_id = call.get("id") or ""
        if not isinstance(call_id, str):
            raise bad_request(f"{param}[{j}].id must be a string", param=param)
        out.append(canonical_tool_call(call_id, fn["name"], args, param=f"{param}[{j}].function.arguments"))
    return out


def _named(out: dict[str, Any], m: Any, param: str) -> dict[str, Any]:
    """``out`` with the message's participant ``name`` when it has one: Kimi K2's template
    writes it in place of the role (``<|im_system|>calculator<|im_middle|>`` for a tool result
    named ``calculator``), so dropping it would train a prompt the server never renders."""
    name = m.get("name")
    if name is None or name == "":
        return out
    if not isinstance(name, str):
        raise bad_request(f"{param}.name must be a string, got {type(name).__name__}", param=param)
    out["name"] = name
    return out


def _openai_convert(m: Any, i: int) -> Canon:
    param = f"messages[{i}]"
    role = m.get("role")
    if role in ("system", "developer"):
        return [_named({"role": "system", "content": _text(m.get("content"), f"{param}.content")}, m, param)]
    if role == "user":
        return [_named({"role": "user", "content": _text(m.get("content"), f"{param}.content")}, m, param)]
    if role == "assistant":
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": _text(m.get("content"), f"{param}.content", allow_none=True),
        }
        calls = m.get("tool_calls")
        if calls:
            msg["tool_calls"] = _openai_tool_calls(calls, f"{param}.tool_calls")
        for key in ("reasoning_content", "reasoning"):
            reasoning = m.get(key)
            if reasoning is None:
                continue
            if not isinstance(reasoning, str):
                raise bad_request(f"{param}.{key} must be a string, got {type(reasoning).__name__}", param=param)
            if reasoning:
                msg["reasoning_content"] = reasoning
            break
        return [msg]
    if role == "tool":
        call_id = m.get("tool_call_id", "")
        if not isinstance(call_id, str):
            raise bad_request(f"{param}.tool_call_id must be a string", param=param)
        tool = {"role": "tool", "content": _text(m.get("content"), f"{param}.content"), "tool_call_id": call_id}
        return [_named(tool, m, param)]
    raise bad_request(
        f"{param}.role is {short_repr(role)}; expected one of 'system', 'developer', 'user', 'assistant', 'tool'",
        param=param,
    )


def openai_units(messages: Any) -> Units:
    """Wrap an OpenAI ``messages`` list (validated structurally now, fully on conversion)."""
    msgs = _check_messages(messages, "messages")
    return Units(msgs, lambda i: Unit(msgs[i], _openai_convert, i))


def openai_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Validate OpenAI ``tools``; None when absent or empty."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be a list, got {type(tools).__name__}", param="tools")
    for j, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise bad_request(f"tools[{j}] must be {{'type': 'function', 'function': {{...}}}}", param="tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{j}].function.name must be a non-empty string", param="tools")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise bad_request(f"tools[{j}].function.parameters must be a JSON schema object", param="tools")
    return tools


# ----------------------------------------------------------------------------- Anthropic


def _anthropic_system(raw: Any, i: int) -> Canon:
    return [{"role": "system", "content": _text(raw[1], "system")}]


def _block_id(block: dict[str, Any], key: str, bparam: str, param: str) -> str:
    """A block's ``id`` / ``tool_use_id``: a string ('' when absent). A scalar is taken as its
    text, as before; an object or list is a 400 (``str`` of one nested ~1000 deep recursed into a 500)."""
    v = block.get(key, "")
    if isinstance(v, dict | list):
        raise bad_request(f"{bparam}.{key} must be a string, got {short_repr(v)}", param=param)
    return str(v)


def _anthropic_convert(m: Any, i: int) -> Canon:
    param = f"messages[{i}]"
    role = m.get("role")
    content = m.get("content")
    if role not in ("user", "assistant"):
        raise bad_request(f"{param}.role is {short_repr(role)}; expected 'user' or 'assistant'", param=param)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{param}.content must be a string or a list of blocks", param=param)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    out: Canon = []
    for j, block in enumerate(content):
        bparam = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"{bparam}.thinking must be a string", param=param)
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted by another provider: nothing a template could render
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise bad_request(f"{bparam} must have a string 'name' and an object 'input'", param=param)
            calls.append(canonical_tool_call(_block_id(block, "id", bparam, param), block["name"], block.get("input", {})))
        elif kind == "tool_result" and role == "user":
            if texts:
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            result = block.get("content", "")
            out.append(
                {
                    "role": "tool",
                    "content": _text(result, f"{bparam}.content"),
                    "tool_call_id": _block_id(block, "tool_use_id", bparam, param),
                }
            )
        else:
            raise bad_request(
                f"{bparam} has type {short_repr(kind)}, which this gateway does not accept in a {role!r} message "
                "(text, tool_use in assistant turns, tool_result in user turns)",
                param=param,
            )
    if role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        if "".join(thoughts):
            msg["reasoning_content"] = "".join(thoughts)
        return [msg]
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def anthropic_units(system: Any, messages: Any) -> Units:
    """Wrap an Anthropic request's ``system`` and ``messages`` as units."""
    msgs = _check_messages(messages, "messages")
    if system is not None and system != "" and system != []:
        sys_raw = ("system", system)
        return Units(
            [sys_raw, *msgs],
            lambda i: Unit(sys_raw, _anthropic_system, -1) if i == 0 else Unit(msgs[i - 1], _anthropic_convert, i - 1),
        )
    return Units(msgs, lambda i: Unit(msgs[i], _anthropic_convert, i))


def anthropic_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Validate Anthropic ``tools`` and convert them to the chat-template form."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be a list, got {type(tools).__name__}", param="tools")
    out = []
    for j, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise bad_request(f"tools[{j}] must be an object with a non-empty string 'name'", param="tools")
        if t.get("type") not in (None, "custom"):
            raise bad_request(
                f"tools[{j}] has type {short_repr(t.get('type'))}; only custom tools are supported", param="tools"
            )
        schema = t.get("input_schema", {"type": "object", "properties": {}})
        if not isinstance(schema, dict):
            raise bad_request(f"tools[{j}].input_schema must be a JSON schema object", param="tools")
        # OpenAI's key order (name, description, parameters): templates dump tools
        # with tojson, so the order shows up in the prompt.
        fn: dict[str, Any] = {"name": t["name"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        fn["parameters"] = schema
        out.append({"type": "function", "function": fn})
    return out
