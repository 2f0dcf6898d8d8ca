"""Tool-call parsers: model text in, assistant content and tool calls out.

Defines:

- ``ParsedOutput`` (re-exported from ``core.gateway.parsed_output``): what every parser returns.
- ``parse_hermes``: Qwen2.5/Qwen3/Hermes ``<tool_call>{"name": .., "arguments": ..}</tool_call>``.
- ``parse_qwen3_coder``: Qwen3-Coder XML ``<tool_call><function=NAME><parameter=P>v</parameter></function></tool_call>``.
- ``parse_llama3_json``: Llama 3.x JSON ``{"name": .., "parameters": ..}`` (optionally after ``<|python_tag|>``).
- ``parse_deepseek_v3``: DeepSeek V3/R1 ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``
  then a fenced JSON block per call.
- ``parse_deepseek_v31`` (``core.gateway.toolformats``): DeepSeek V3.1 / V3.2, the same markers
  with each call's JSON right after ``<｜tool▁sep｜>`` (no type, no fenced block).
- ``parse_minimax_m2`` (``core.gateway.toolformats``): MiniMax M2 ``<minimax:tool_call>`` with
  ``<invoke name="NAME"><parameter name="K">V</parameter>…</invoke>`` per call.
- ``parse_kimi_k2`` (``core.gateway.toolformats``): Kimi K2 / K2.5 ``<|tool_calls_section_begin|>``
  with ``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{json}<|tool_call_end|>``
  per call; the id ``functions.NAME:N`` is the model's own, returned to the client.
- ``harmony`` (gpt-oss): messages addressed ``to=functions.NAME`` (``core.gateway.harmony``).
- ``parse_glm45``: GLM-4.5 ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``.
- ``parse_mistral``: Mistral ``[TOOL_CALLS]`` followed by a JSON list of calls (v3 tokenizers)
  or by ``NAME[ARGS]{json}`` per call (v11 and later).
- ``PARSERS``, ``detect_parser``: the registry by config name and detection from a chat template.
- ``CALL_MARKERS``, ``call_markers``: tool-call markup of known formats, and which of it a chat
  template writes (a turn holding such markup but no call is ``ParseStatus.MARKUP_NO_CALL``).
- ``MODEL_CALL_IDS``: the formats whose model writes its own call ids (Kimi K2), and their form.
- ``new_call_id``, ``kept_call_ids``: tool-call ids, the model's own where its format writes
  one (Mistral v3 to v7, Kimi K2), else fresh ones of the form the format's templates accept.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Collection
from typing import Any

from core.gateway import safejson
from core.gateway.harmony import parse_harmony
from core.gateway.parsed_output import ParsedOutput, ToolParser
from core.gateway.toolformats import (
    DS_CALLS_BEGIN,
    KIMI_SECTION_BEGIN,
    MINIMAX_BEGIN,
    deepseek_calls_block,
    kimi_call_id,
    parse_deepseek_v31,
    parse_kimi_k2,
    parse_minimax_m2,
)

__all__ = [
    "CALL_MARKERS",
    "MODEL_CALL_IDS",
    "PARSERS",
    "ParsedOutput",
    "call_markers",
    "detect_parser",
    "get_parser",
    "kept_call_ids",
    "new_call_id",
    "parse_deepseek_v3",
    "parse_deepseek_v31",
    "parse_glm45",
    "parse_hermes",
    "parse_kimi_k2",
    "parse_mistral",
    "parse_llama3_json",
    "parse_minimax_m2",
    "parse_qwen3_coder",
]



_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _ill(text: str, why: str, *, bad_json: bool = False) -> ParsedOutput:
    return ParsedOutput(content=text, ill_formed=True, error=why, bad_json=bad_json)


def parse_hermes(text: str) -> ParsedOutput:
    """Parse Hermes/Qwen3 JSON tool calls; any broken block makes the whole turn text."""
    start = text.find("<tool_call>")
    if start < 0:
        if "</tool_call>" in text:
            return _ill(text, "'</tool_call>' without an opening tag")
        return ParsedOutput(content=text)
    calls: list[tuple[str, Any]] = []
    pos = start
    for m in _HERMES_BLOCK.finditer(text, start):
        if text[pos : m.start()].strip():
            return _ill(text, "text between tool calls")
        try:
            obj = safejson.loads(m.group(1))
        except ValueError as exc:  # TooDeep included
            return _ill(text, f"tool call is not JSON: {exc}", bad_json=True)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return _ill(text, "tool call lacks a string 'name'")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = safejson.loads(args)
            except ValueError:
                return _ill(text, "tool call 'arguments' is a string that is not JSON", bad_json=True)
        if not isinstance(args, dict):
            return _ill(text, "tool call 'arguments' is not an object", bad_json=True)
        calls.append((obj["name"], args))
        pos = m.end()
    if not calls or text[pos:].strip():
        return _ill(text, "unterminated '<tool_call>' or text after the last tool call")
    return ParsedOutput(content=text[:start].rstrip("\n"), tool_calls=calls)


_CODER_FN = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_CODER_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _coder_value(raw: str) -> Any:
    value = raw.strip("\n")
    try:
        return safejson.loads(value)
    except ValueError:  # not JSON, or nested too deep: keep the text
        return value


def parse_qwen3_coder(text: str) -> ParsedOutput:
    """Parse Qwen3-Coder XML tool calls (parameter values JSON-decoded when they parse)."""
    start = text.find("<tool_call>")
    if start < 0:
        if "<function=" in text:
            return _ill(text, "'<function=' outside a '<tool_call>' block")
        return ParsedOutput(content=text)
    calls: list[tuple[str, Any]] = []
    pos = start
    for block in _HERMES_BLOCK.finditer(text, start):
        if text[pos : block.start()].strip():
            return _ill(text, "text between tool calls")
        body = block.group(1).strip()
        fn = _CODER_FN.fullmatch(body)
        if fn is None:
            return _ill(text, "tool call is not '<function=NAME>...</function>'")
        args: dict[str, Any] = {}
        inner = fn.group(2)
        rest = _CODER_PARAM.sub("", inner)
        if rest.strip():
            return _ill(text, "text inside '<function=...>' outside '<parameter=...>' tags")
        for p in _CODER_PARAM.finditer(inner):
            args[p.group(1).strip()] = _coder_value(p.group(2))
        calls.append((fn.group(1).strip(), args))
        pos = block.end()
    if not calls or text[pos:].strip():
        return _ill(text, "unterminated '<tool_call>' or text after the last tool call")
    return ParsedOutput(content=text[:start].rstrip("\n"), tool_calls=calls)


def parse_llama3_json(text: str) -> ParsedOutput:
    """Parse Llama 3.x JSON tool calls: the whole turn is one call, or several joined by ';'."""
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
    elif not body.startswith("{"):
        return ParsedOutput(content=text)
    calls: list[tuple[str, Any]] = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError) as exc:
            return _ill(text, f"tool call is not JSON: {type(exc).__name__}: {exc}", bad_json=True)
        if safejson.deeper_than(obj):
            return _ill(text, f"tool call JSON nests more than {safejson.MAX_DEPTH} levels", bad_json=True)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return _ill(text, "tool call lacks a string 'name'")
        args = obj.get("parameters", obj.get("arguments", {}))
        if not isinstance(args, dict):
            return _ill(text, "tool call 'parameters' is not an object", bad_json=True)
        calls.append((obj["name"], args))
        pos = end
        while pos < len(body) and body[pos] in " \n\t;":
            pos += 1
    if not calls:
        return _ill(text, "empty tool call")
    return ParsedOutput(content="", tool_calls=calls)


_DS_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(\w+)<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```<｜tool▁call▁end｜>", re.DOTALL
)


def parse_deepseek_v3(text: str) -> ParsedOutput:
    """Parse DeepSeek V3/R1 tool calls: ``<｜tool▁calls▁begin｜>``, then per call
    ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``
    (joined by newlines), then ``<｜tool▁calls▁end｜>``; text before the block is content."""
    found = deepseek_calls_block(text)
    if isinstance(found, ParsedOutput):
        return found
    start, block = found
    calls: list[tuple[str, Any]] = []
    pos = 0
    for m in _DS_CALL.finditer(block):
        if block[pos : m.start()].strip():
            return _ill(text, "text between tool calls")
        if m.group(1) != "function":
            return _ill(text, f"tool call type {m.group(1)!r} is not 'function'")
        try:
            args = safejson.loads(m.group(3))
        except ValueError as exc:
            return _ill(text, f"tool call arguments are not JSON: {exc}", bad_json=True)
        if not isinstance(args, dict):
            return _ill(text, "tool call arguments are not an object", bad_json=True)
        calls.append((m.group(2).strip(), args))
        pos = m.end()
    if not calls or block[pos:].strip():
        return _ill(text, "a tool call is not '<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME' + a fenced JSON block")
    return ParsedOutput(content=text[:start], tool_calls=calls)


_GLM_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_glm45(text: str) -> ParsedOutput:
    """Parse GLM-4.5 tool calls. Values are JSON-decoded when they parse (the template writes
    non-strings as JSON, strings raw; without the tool's schema a string that reads as JSON,
    such as ``"5"``, comes back decoded)."""
    start = text.find("<tool_call>")
    if start < 0:
        if "<arg_key>" in text or "</tool_call>" in text:
            return _ill(text, "'<arg_key>' or '</tool_call>' outside a '<tool_call>' block")
        return ParsedOutput(content=text)
    calls: list[tuple[str, Any]] = []
    pos = start
    for block in _GLM_CALL.finditer(text, start):
        if text[pos : block.start()].strip():
            return _ill(text, "text between tool calls")
        body = block.group(1)
        cut = body.find("<arg_key>")
        name = (body if cut < 0 else body[:cut]).strip()
        if not name or "<" in name:
            return _ill(text, "tool call lacks a function name before its arguments")
        args_text = "" if cut < 0 else body[cut:]
        if _GLM_ARG.sub("", args_text).strip():
            return _ill(text, "text inside '<tool_call>' outside '<arg_key>'/'<arg_value>' pairs")
        calls.append((name, {m.group(1).strip(): _coder_value(m.group(2)) for m in _GLM_ARG.finditer(args_text)}))
        pos = block.end()
    if not calls or text[pos:].strip():
        return _ill(text, "unterminated '<tool_call>' or text after the last tool call")
    return ParsedOutput(content=text[:start].rstrip("\n"), tool_calls=calls)


MISTRAL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_MISTRAL_ID = re.compile(r"[a-zA-Z0-9]{9}")
"""A Mistral tool-call id: mistral-common and Mistral's chat templates refuse any other."""


def parse_mistral(text: str) -> ParsedOutput:
    """Parse Mistral tool calls: ``[TOOL_CALLS][{"name", "arguments", "id"}, ...]`` (v3 to v7
    tokenizers; the model writes each call's id, kept in ``call_ids`` when it is the 9 letters or
    digits Mistral's formats take) or ``[TOOL_CALLS]NAME[ARGS]{...}`` (repeated for several
    calls); text before is content."""
    start = text.find(MISTRAL_CALLS)
    if start < 0:
        return ParsedOutput(content=text)
    rest = text[start:]
    calls: list[tuple[str, Any]] = []
    ids: list[str | None] = []
    decoder = json.JSONDecoder()
    for piece in rest.split(MISTRAL_CALLS)[1:]:
        piece = piece.strip()
        if _MISTRAL_ARGS in piece and not piece.startswith("["):
            name, _, raw = piece.partition(_MISTRAL_ARGS)
            try:
                args, end = decoder.raw_decode(raw.strip())
            except (ValueError, RecursionError) as exc:
                return _ill(text, f"tool call arguments are not JSON: {type(exc).__name__}: {exc}", bad_json=True)
            if raw.strip()[end:].strip() or not name.strip() or not isinstance(args, dict):
                return _ill(text, "a tool call is not 'NAME[ARGS]{...}'")
            calls.append((name.strip(), args))
            ids.append(None)
            continue
        try:
            listed, end = decoder.raw_decode(piece)
        except (ValueError, RecursionError) as exc:
            return _ill(text, f"tool calls are not a JSON list: {type(exc).__name__}: {exc}", bad_json=True)
        if piece[end:].strip() or not isinstance(listed, list) or not listed:
            return _ill(text, "'[TOOL_CALLS]' is not followed by a JSON list of calls", bad_json=True)
        for obj in listed:
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
                return _ill(text, "tool call lacks a string 'name'")
            args = obj.get("arguments", {})
            if not isinstance(args, dict):
                return _ill(text, "tool call 'arguments' is not an object", bad_json=True)
            calls.append((obj["name"], args))
            ident = obj.get("id")
            ids.append(ident if isinstance(ident, str) and _MISTRAL_ID.fullmatch(ident) else None)
    if any(safejson.deeper_than(a) for _, a in calls):
        return _ill(text, f"tool call JSON nests more than {safejson.MAX_DEPTH} levels", bad_json=True)
    return ParsedOutput(content=text[:start], tool_calls=calls, call_ids=ids if any(ids) else [])


PARSERS: dict[str, ToolParser] = {
    "hermes": parse_hermes,
    "qwen3": parse_hermes,
    "qwen3_coder": parse_qwen3_coder,
    "llama3_json": parse_llama3_json,
    "deepseek_v3": parse_deepseek_v3,
    "deepseek_v31": parse_deepseek_v31,
    "minimax_m2": parse_minimax_m2,
    "kimi_k2": parse_kimi_k2,
    "harmony": parse_harmony,
    "glm45": parse_glm45,
    "mistral": parse_mistral,
}
"""Parsers by config name (``gateway.tool_parser``); ``qwen3`` is an alias of ``hermes``."""


MODEL_CALL_IDS: dict[str, Callable[[str, int], str]] = {"kimi_k2": kimi_call_id}
"""Formats whose model writes each call's id itself, and the id it writes for the n-th call
(from 0) of a conversation to a tool: Kimi K2's template writes the id, and the tool's name
only inside it, into history."""


def detect_parser(chat_template: str) -> str | None:
    """Guess the tool-call format from a chat template's text; None when it shows none."""
    if "<|call|>" in chat_template and "to=" in chat_template:
        return "harmony"
    if MINIMAX_BEGIN in chat_template:
        return "minimax_m2"
    if KIMI_SECTION_BEGIN in chat_template:
        return "kimi_k2"
    if DS_CALLS_BEGIN in chat_template:
        # V3 / R1 fence each call's JSON in a ```json block; V3.1 / V3.2 write it bare after the name.
        bare = "<｜tool▁sep｜>" in chat_template and "```json" not in chat_template
        return "deepseek_v31" if bare else "deepseek_v3"
    if "<arg_key>" in chat_template:
        return "glm45"
    if MISTRAL_CALLS in chat_template:
        return "mistral"
    if "<function=" in chat_template and "<parameter=" in chat_template:
        return "qwen3_coder"
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3_json"
    return None


CALL_MARKERS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "<arg_key>",
    "<|python_tag|>",
    DS_CALLS_BEGIN,
    "<｜tool▁call▁begin｜>",
    MISTRAL_CALLS,
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<minimax:tool_call>",
    "<TOOLCALL>",
)
"""Markup that opens or closes a tool call in a known format (Hermes/Qwen, Qwen3-Coder,
GLM, Llama 3, DeepSeek, Mistral, Kimi K2, MiniMax M2, Nemotron). Only strings no prose
writes by chance: a turn holding one and no call tried to call a tool."""


def call_markers(chat_template: str) -> tuple[str, ...]:
    """The ``CALL_MARKERS`` a chat template writes: the model learned to call tools with them,
    so a turn that holds one but parses to no call is a failed call, whatever the configured
    parser reads (a parser of another format would otherwise see plain text, and a run
    would train without a single tool call and not know it)."""
    return tuple(m for m in CALL_MARKERS if m in chat_template)


def get_parser(name: str, chat_template: str) -> tuple[str | None, ToolParser | None]:
    """Resolve ``gateway.tool_parser`` against the template.

    Returns:
        (resolved name, parser); (None, None) for ``none``.

    Raises:
        ConfigError: unknown name, or ``auto`` on a template that renders tools
            in a format no parser knows (offering tools would silently never
            produce a tool call).
    """
    from core.errors import ConfigError

    if name == "none":
        return None, None
    if name == "auto":
        found = detect_parser(chat_template)
        if found is None:
            if "tools" in chat_template:
                raise ConfigError(
                    "gateway.tool_parser='auto' found no known tool-call format in the chat template, "
                    f"which renders tools; set gateway.tool_parser to one of {sorted(PARSERS)} "
                    "or to 'none' (then requests that offer tools are refused)"
                )
            return None, None
        return found, PARSERS[found]
    if name not in PARSERS:
        raise ConfigError(f"unknown gateway.tool_parser {name!r}; choose one of {sorted(PARSERS)}, 'auto' or 'none'")
    return name, PARSERS[name]


def new_call_id(parser: str | None) -> str:
    """A fresh tool-call id the parser's format can render back: 9 letters or digits for
    ``mistral`` (mistral-common and Mistral's templates refuse any other), else ``call_`` + hex."""
    if parser == "mistral":
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


_ID_ALPHABET = string.ascii_letters + string.digits


def kept_call_ids(
    parsed: ParsedOutput, kept: list[tuple[str, Any]], taken: Collection[str] = ()
) -> list[str | None]:
    """The model's ids of ``kept``, calls of ``parsed`` that survived ``tool_choice`` (an ordered
    subsequence of ``parsed.tool_calls``: each is matched to the next equal call); None where
    the model wrote none, or wrote one in ``taken`` (returned earlier in the session) or given
    to an earlier call of ``kept``: clients match tool results to calls by id, so an id is
    returned once."""
    if not parsed.call_ids:
        return [None] * len(kept)
    out: list[str | None] = []
    given: set[str] = set(taken)
    at = 0
    for call in kept:
        while at < len(parsed.tool_calls) and parsed.tool_calls[at] != call:
            at += 1
        ident = parsed.call_ids[at] if at < len(parsed.call_ids) else None
        out.append(ident if ident is not None and ident not in given else None)
        if ident is not None:
            given.add(ident)
        at += 1
    return out
