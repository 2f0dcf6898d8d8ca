"""Reading a sampled reply: the step between sampling a turn and recording it.

Defines:

- ``ReplyFormat``: how every reply of a gateway is read (decoding, end-of-turn ids,
  the reasoning parser, the tool parser).
- ``ReplySettings``: what one request asks of its reply (stop strings, stop ids, the
  tools offered, strict schemas, ``tool_choice``).
- ``Reply``: what was read (one frozen result).
- ``read_reply``: sampled tokens in, ``Reply`` out; a pure function, no session.
- ``parse_tools``: a tool parser's reading, its failures as an ill-formed call.
- ``parse_status``: what a turn's parse came to (``core.types.ParseStatus``) and why.

The order is the protocol's: the token that closed the turn is cut, then the first
stop string (only when no such token closed it), then the reasoning is split off,
then tool calls are parsed; calls to strict tools whose arguments break the schema
and calls ``tool_choice`` refuses are not returned. What the reply did wrong comes
back as counts; the gateway adds them to the session's counters. Every reply also
gets a parse status (``Reply.parse``), which the trace keeps on its turn.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from core.gateway.fields import short_repr
from core.gateway.parsed_output import ParsedOutput, ToolParser
from core.gateway.reasoning_parsers import ReasoningParser
from core.gateway.strict import misfit_reason, split_strict
from core.gateway.toolchoice import AUTO, ToolChoice, enforce
from core.types import FinishReason, ParseStatus

__all__ = ["Reply", "ReplyFormat", "ReplySettings", "parse_status", "parse_tools", "read_reply"]

DETAIL_CHARS = 300
"""Longest ``Reply.parse_detail`` kept (names and messages come from what the model wrote)."""


@dataclass(frozen=True, slots=True)
class ReplyFormat:
    """How a gateway reads every reply: fixed by its model and config."""

    decode: Callable[[Sequence[int]], str]
    """Token ids to text, special tokens included (``ChatRenderer.decode``)."""
    end_of_turn_ids: Collection[int]
    """Token ids that end the model's turn."""
    split_reasoning: ReasoningParser | None = None
    """The reasoning parser (``core.gateway.reasoning_parsers``); None: no reasoning split off."""
    parse_tools: ToolParser | None = None
    """The tool-call parser (``core.gateway.toolparse``); None: the gateway offers no tools."""
    call_markers: tuple[str, ...] = ()
    """Tool-call markup the chat template writes (``toolparse.call_markers``): a reply holding
    one that parses to no call is ``ParseStatus.MARKUP_NO_CALL``."""


@dataclass(frozen=True, slots=True)
class ReplySettings:
    """What one request asks of its reply."""

    stop: tuple[str, ...] = ()
    """Stop strings (the session's and the request's): the text is cut at the first found."""
    stop_token_ids: Collection[int] = ()
    """The turn's stop token ids besides the end-of-turn ids."""
    tools: tuple[str, ...] = ()
    """Names of the tools offered; none offered: the text is not parsed for calls."""
    strict: dict[str, Any] | None = None
    """Schemas of the tools sent with ``strict: true``, by name (``core.gateway.strict``)."""
    tool_choice: ToolChoice = AUTO
    """Which parsed calls the reply may return (``core.gateway.toolchoice``)."""
    opened_think: bool = False
    """The generation prompt left a reasoning block open (``prompt_opens_think``)."""
    closed_think: bool = False
    """The generation prompt ended with an empty reasoning block it closed (``prompt_closes_think``):
    newlines the turn starts with follow that tag, not part of the content."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a sampled turn said, read."""

    body: tuple[int, ...]
    """The sampled tokens without the end-of-turn or stop token that closed the turn."""
    closer: str
    """Text of that closing token ('' when none closed the turn)."""
    content: str
    """Text for the client (without tool-call markup unless ill-formed or refused)."""
    reasoning: str
    """Reasoning split off the text; '' when none."""
    stop_string: str | None
    """The stop string the text was cut at, if one was."""
    calls: tuple[tuple[str, Any], ...]
    """(name, arguments) of the calls returned: those that fit their strict schema and
    that ``tool_choice`` allows."""
    parsed: ParsedOutput
    """The tool parser's reading (its ``call_ids`` are the ids the model wrote)."""
    choice_violated: bool
    """The reply did not follow ``tool_choice`` (or a strict schema)."""
    dropped: int
    """Parsed calls not returned (refused by ``tool_choice`` or breaking a strict schema)."""
    strict_misfits: int
    """Calls to strict tools whose arguments break the schema."""
    unknown_calls: int
    """Calls naming a tool that was not offered."""
    parse: ParseStatus = ParseStatus.NO_TOOLS
    """What the parse came to (``parse_status``)."""
    parse_detail: str = ""
    """Why a failed parse failed; '' otherwise."""

    @property
    def ill_formed(self) -> bool:
        """The text tried to call a tool and the call did not parse."""
        return self.parsed.ill_formed


def read_reply(
    token_ids: Sequence[int], finish_reason: FinishReason, settings: ReplySettings, fmt: ReplyFormat
) -> Reply:
    """Read a sampled turn: cut the closing token and stop strings, split the reasoning,
    parse and filter the tool calls. Never raises for what the model wrote: the turn was
    sampled, so it is recorded (and counted) whatever it holds."""
    ids = list(token_ids)
    closer = ""
    body = ids
    if ids and (ids[-1] in fmt.end_of_turn_ids or ids[-1] in settings.stop_token_ids):
        closer = fmt.decode(ids[-1:])
        body = ids[:-1]
    text = fmt.decode(body)
    stop_string = None
    if settings.stop and not closer and finish_reason is FinishReason.STOP:
        hits = [(text.find(st), st) for st in settings.stop if st and st in text]
        if hits:
            at, stop_string = min(hits)
            text = text[:at]
    reasoning = ""
    if fmt.split_reasoning is not None:
        reasoning, text = fmt.split_reasoning(text, settings.opened_think)
        if settings.closed_think and not reasoning:
            text = text.lstrip("\n")
    parsed = parse_tools(fmt.parse_tools, text) if settings.tools else ParsedOutput(content=text)
    unknown = sum(1 for name, _ in parsed.tool_calls if name not in settings.tools)
    fitting, misfits = split_strict(settings.strict, parsed.tool_calls)
    content = parsed.content if fitting or not parsed.tool_calls else text
    enforced = enforce(settings.tool_choice, content, fitting, text)
    # A call breaking its strict schema, a required call that did not parse, or a refused
    # call attempted: the reply did not follow the request.
    violated = enforced.violated or misfits > 0 or (settings.tool_choice.mode != "auto" and parsed.ill_formed)
    status, detail = parse_status(settings, fmt, parsed, fitting)
    return Reply(
        body=tuple(body),
        closer=closer,
        content=enforced.content,
        reasoning=reasoning,
        stop_string=stop_string,
        calls=tuple(enforced.calls),
        parsed=parsed,
        choice_violated=violated,
        dropped=enforced.dropped + misfits,
        strict_misfits=misfits,
        unknown_calls=unknown,
        parse=status,
        parse_detail=detail[:DETAIL_CHARS],
    )


def parse_status(
    settings: ReplySettings, fmt: ReplyFormat, parsed: ParsedOutput, fitting: Sequence[tuple[str, Any]]
) -> tuple[ParseStatus, str]:
    """What ``parsed`` (the parser's reading of a reply) came to, and why when it failed.

    ``fitting``: the parsed calls that fit their strict schema (``split_strict``). The
    order is the docstring's of ``ParseStatus``: a failed parse, then calls naming a tool
    not offered, then calls breaking a strict schema, then markup the template writes
    in a reply the parser read no call from."""
    if not settings.tools:
        return ParseStatus.NO_TOOLS, ""
    if parsed.ill_formed:
        return (ParseStatus.BAD_JSON if parsed.bad_json else ParseStatus.MARKUP_NO_CALL), parsed.error
    if parsed.tool_calls:
        unknown = [name for name, _ in parsed.tool_calls if name not in settings.tools]
        if unknown:
            names = ", ".join(short_repr(n) for n in dict.fromkeys(unknown))
            return ParseStatus.UNKNOWN_TOOL, f"called {names}, not among the tools offered"
        if len(fitting) < len(parsed.tool_calls):
            name, args = _misfits(parsed.tool_calls, fitting)[0]
            why = misfit_reason(settings.strict, name, args)
            return ParseStatus.SCHEMA_MISMATCH, f"arguments of {short_repr(name)} break its strict schema: {why}"
        return ParseStatus.CALLS, ""
    found = [m for m in fmt.call_markers if m in parsed.content]
    if found:
        return ParseStatus.MARKUP_NO_CALL, (
            f"the text holds {found[0]!r}, tool-call markup of the chat template, but the tool "
            "parser read no call from it (check gateway.tool_parser)"
        )
    return ParseStatus.TEXT, ""


def _misfits(calls: Sequence[tuple[str, Any]], fitting: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The ``calls`` not in ``fitting`` (an ordered subsequence of them)."""
    out: list[tuple[str, Any]] = []
    at = 0
    for call in calls:
        if at < len(fitting) and fitting[at] == call:
            at += 1
        else:
            out.append(call)
    return out


def parse_tools(parser: ToolParser | None, text: str) -> ParsedOutput:
    """``parser``'s reading of a reply; any failure is an ill-formed call, never an error."""
    if parser is None:
        return ParsedOutput(content=text)
    try:
        return parser(text)
    except Exception as exc:
        return ParsedOutput(content=text, ill_formed=True, error=f"parser failed: {type(exc).__name__}: {exc}")
