"""Tool-call parsers of the newer model families (registered in ``core.gateway.toolparse``).

Defines:

- ``parse_deepseek_v31``: DeepSeek V3.1 / V3.2 ``<｜tool▁calls▁begin｜>``, then per call
  ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`` (no type, no fenced block),
  then ``<｜tool▁calls▁end｜>``.
- ``parse_minimax_m2``: MiniMax M2 ``<minimax:tool_call>``, then per call ``<invoke name="NAME">``
  with ``<parameter name="K">V</parameter>`` per argument, then ``</minimax:tool_call>``.
- ``parse_kimi_k2``: Kimi K2 / K2.5 ``<|tool_calls_section_begin|>``, then per call
  ``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{json}<|tool_call_end|>``,
  then ``<|tool_calls_section_end|>``. The call id ``functions.NAME:N`` is the model's own
  (``call_ids``): Kimi's template writes each call's id back into history as it was returned.
- ``kimi_call_id``: that id for the N-th call of a conversation (0-based).

Each returns a ``ParsedOutput``: the content before the calls and the calls, or, for markup
that does not parse, the whole text as content with ``ill_formed`` set and the reason.
"""

from __future__ import annotations

import re
from typing import Any

from core.gateway import safejson
from core.gateway.parsed_output import ParsedOutput

__all__ = ["kimi_call_id", "parse_deepseek_v31", "parse_kimi_k2", "parse_minimax_m2"]

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS31_CALL = re.compile(r"<｜tool▁call▁begin｜>([^<\n]+?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)


def _ill(text: str, why: str, *, bad_json: bool = False) -> ParsedOutput:
    return ParsedOutput(content=text, ill_formed=True, error=why, bad_json=bad_json)


def deepseek_calls_block(text: str) -> tuple[int, str] | ParsedOutput:
    """Where DeepSeek's ``<｜tool▁calls▁begin｜>`` block starts and what it holds (V3, R1 and
    V3.1 share it), or the answer when there is none (plain content) or it is ill-formed."""
    start = text.find(DS_CALLS_BEGIN)
    if start < 0:
        if DS_CALL_BEGIN in text:
            return _ill(text, f"'{DS_CALL_BEGIN}' outside a '{DS_CALLS_BEGIN}' block")
        return ParsedOutput(content=text)
    body = text[start + len(DS_CALLS_BEGIN) :]
    end = body.find(DS_CALLS_END)
    if end < 0:
        return _ill(text, f"unterminated '{DS_CALLS_BEGIN}' (no '{DS_CALLS_END}')")
    if body[end + len(DS_CALLS_END) :].strip():
        return _ill(text, "text after the tool calls")
    return start, body[:end]


def parse_deepseek_v31(text: str) -> ParsedOutput:
    """Parse DeepSeek V3.1 / V3.2 tool calls (arguments one JSON object per call, written
    right after ``<｜tool▁sep｜>``; calls chained without separators); text before the block
    is content."""
    found = deepseek_calls_block(text)
    if isinstance(found, ParsedOutput):
        return found
    start, block = found
    calls: list[tuple[str, Any]] = []
    pos = 0
    for m in _DS31_CALL.finditer(block):
        if block[pos : m.start()].strip():
            return _ill(text, "text between tool calls")
        try:
            args = safejson.loads(m.group(2))
        except ValueError as exc:
            return _ill(text, f"tool call arguments are not JSON: {exc}", bad_json=True)
        if not isinstance(args, dict):
            return _ill(text, "tool call arguments are not an object", bad_json=True)
        calls.append((m.group(1).strip(), args))
        pos = m.end()
    if not calls or block[pos:].strip():
        return _ill(text, f"a tool call is not '{DS_CALL_BEGIN}NAME<｜tool▁sep｜>' + a JSON object + '<｜tool▁call▁end｜>'")
    return ParsedOutput(content=text[:start], tool_calls=calls)


MINIMAX_BEGIN = "<minimax:tool_call>"
MINIMAX_END = "</minimax:tool_call>"
_MM_INVOKE = re.compile(r'<invoke name="([^"\n]+)">(.*?)</invoke>', re.DOTALL)
_MM_PARAM = re.compile(r'<parameter name="([^"\n]+)">(.*?)</parameter>', re.DOTALL)


def _value(raw: str) -> Any:
    """A parameter value: JSON when it parses (the template writes non-strings as JSON), else the text."""
    try:
        return safejson.loads(raw)
    except ValueError:  # not JSON, or nested too deep: keep the text
        return raw


def parse_minimax_m2(text: str) -> ParsedOutput:
    """Parse MiniMax M2 tool calls: ``<minimax:tool_call>``, then per call ``<invoke name="NAME">``
    with a ``<parameter name="K">V</parameter>`` per argument (values JSON-decoded when they
    parse, as for ``qwen3_coder``), then ``</minimax:tool_call>``; text before is content."""
    start = text.find(MINIMAX_BEGIN)
    if start < 0:
        if "<invoke name=" in text or MINIMAX_END in text:
            return _ill(text, f"'<invoke' or '{MINIMAX_END}' outside a '{MINIMAX_BEGIN}' block")
        return ParsedOutput(content=text)
    body = text[start + len(MINIMAX_BEGIN) :]
    end = body.find(MINIMAX_END)
    if end < 0:
        return _ill(text, f"unterminated '{MINIMAX_BEGIN}' (no '{MINIMAX_END}')")
    if body[end + len(MINIMAX_END) :].strip():
        return _ill(text, "text after the tool calls")
    calls: list[tuple[str, Any]] = []
    pos = 0
    block = body[:end]
    for m in _MM_INVOKE.finditer(block):
        if block[pos : m.start()].strip():
            return _ill(text, "text between tool calls")
        inner = m.group(2)
        if _MM_PARAM.sub("", inner).strip():
            return _ill(text, "text inside '<invoke>' outside '<parameter>' tags")
        calls.append((m.group(1).strip(), {p.group(1): _value(p.group(2)) for p in _MM_PARAM.finditer(inner)}))
        pos = m.end()
    if not calls or block[pos:].strip():
        return _ill(text, "a tool call is not '<invoke name=\"NAME\">' with '<parameter name=\"K\">' tags")
    return ParsedOutput(content=text[:start].rstrip("\n"), tool_calls=calls)


KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN = "<|tool_call_begin|>"
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>([^<]*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL
)
_KIMI_ID = re.compile(r"(?:functions\.)?([^\s:<>]+):(\d+)")
"""A Kimi call id: ``functions.NAME:N`` (N counts the conversation's calls from 0); the name is
read from it, as Kimi's format writes the name nowhere else."""


def kimi_call_id(name: str, index: int) -> str:
    """Kimi's id for the ``index``-th call of a conversation (from 0) to ``name``."""
    return f"functions.{name}:{index}"


def parse_kimi_k2(text: str) -> ParsedOutput:
    """Parse Kimi K2 / K2.5 tool calls: text before ``<|tool_calls_section_begin|>`` is content
    (kept as written: the template writes it right before the section), then one
    ``<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>`` per call, ID
    ``functions.NAME:N`` (kept as the call's id) and ARGS a JSON object."""
    start = text.find(KIMI_SECTION_BEGIN)
    if start < 0:
        if KIMI_CALL_BEGIN in text or KIMI_SECTION_END in text:
            return _ill(text, f"'{KIMI_CALL_BEGIN}' or '{KIMI_SECTION_END}' outside a '{KIMI_SECTION_BEGIN}' section")
        return ParsedOutput(content=text)
    body = text[start + len(KIMI_SECTION_BEGIN) :]
    end = body.find(KIMI_SECTION_END)
    if end < 0:
        return _ill(text, f"unterminated '{KIMI_SECTION_BEGIN}' (no '{KIMI_SECTION_END}')")
    if body[end + len(KIMI_SECTION_END) :].strip():
        return _ill(text, "text after the tool calls")
    block = body[:end]
    calls: list[tuple[str, Any]] = []
    ids: list[str | None] = []
    pos = 0
    for m in _KIMI_CALL.finditer(block):
        if block[pos : m.start()].strip():
            return _ill(text, "text between tool calls")
        ident = m.group(1).strip()
        named = _KIMI_ID.fullmatch(ident)
        if named is None:
            return _ill(text, f"tool call id {ident[:60]!r} is not 'functions.NAME:N'")
        try:
            args = safejson.loads(m.group(2))
        except ValueError as exc:
            return _ill(text, f"tool call arguments are not JSON: {exc}", bad_json=True)
        if not isinstance(args, dict):
            return _ill(text, "tool call arguments are not an object", bad_json=True)
        calls.append((named.group(1), args))
        ids.append(ident)
        pos = m.end()
    if not calls or block[pos:].strip():
        return _ill(text, f"a tool call is not '{KIMI_CALL_BEGIN}functions.NAME:N<|tool_call_argument_begin|>' "
                          "+ a JSON object + '<|tool_call_end|>'")
    return ParsedOutput(content=text[:start], tool_calls=calls, call_ids=ids)
