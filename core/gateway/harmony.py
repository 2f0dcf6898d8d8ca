"""OpenAI's harmony format (gpt-oss): a generated turn read as its messages.

Defines ``HarmonyMessage``, ``read_messages``, and the two parsers the gateway
registers: ``split_harmony`` (reasoning: the ``analysis`` channel) and
``parse_harmony`` (tool calls: messages addressed ``to=functions.NAME``).

A gpt-oss turn is generated after the prompt's ``<|start|>assistant`` and may
hold several messages, e.g.::

    <|channel|>analysis<|message|>Need to compute.<|end|>
    <|start|>assistant to=functions.calc<|channel|>commentary json<|message|>{"x": 1}

(the closing ``<|call|>`` or ``<|return|>`` is the stop token, cut before
parsing). The recipient may also follow the channel
(``<|channel|>commentary to=functions.calc <|constrain|>json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.gateway import safejson
from core.gateway.parsed_output import ParsedOutput

__all__ = ["HarmonyMessage", "parse_harmony", "read_messages", "split_harmony"]

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass(frozen=True, slots=True)
class HarmonyMessage:
    """One message of a turn."""

    channel: str
    """``analysis``, ``commentary`` or ``final`` ('' when the header names none)."""
    recipient: str | None
    """``functions.NAME`` for a tool call, else None."""
    body: str
    start: int
    """Where the message begins in the parsed text (its ``<|start|>``, or 0 for the first)."""


def read_messages(text: str) -> list[HarmonyMessage] | None:
    """The messages of a generated turn; None when the text is not harmony (no channel header)."""
    if CHANNEL not in text and MESSAGE not in text:
        return None
    out: list[HarmonyMessage] = []
    starts = [0] + [m.start() for m in re.finditer(re.escape(START), text) if m.start() > 0]
    for i, at in enumerate(starts):
        chunk = text[at : starts[i + 1] if i + 1 < len(starts) else len(text)]
        if chunk.startswith(START):
            chunk = chunk[len(START) :]
        if not chunk.strip():
            continue
        head, sep, body = chunk.partition(MESSAGE)
        if not sep:
            return None
        for end in _ENDS:
            if body.endswith(end):
                body = body[: -len(end)]
                break
        channel = ""
        if CHANNEL in head:
            channel = head.split(CHANNEL, 1)[1].split()[0] if head.split(CHANNEL, 1)[1].split() else ""
        found = _RECIPIENT.search(head)
        out.append(HarmonyMessage(channel, found.group(1) if found else None, body, at))
    return out


def split_harmony(text: str) -> tuple[str, str]:
    """(reasoning, rest): the analysis channel's text, and for the rest either the answer's
    text (final and commentary messages without a recipient) or, when the turn calls a
    tool, the turn's markup from its first message that is not analysis (for ``parse_harmony``)."""
    messages = read_messages(text)
    if messages is None:
        return "", text
    reasoning = "\n".join(m.body for m in messages if m.channel == "analysis")
    others = [m for m in messages if m.channel != "analysis"]
    if any(m.recipient is not None for m in others):
        return reasoning, text[others[0].start :]
    return reasoning, "".join(m.body for m in others)


def parse_harmony(text: str) -> ParsedOutput:
    """Tool calls of a turn's messages addressed to ``functions.NAME`` (JSON arguments);
    text of the others is content. Any other recipient or non-JSON arguments: ill-formed."""
    messages = read_messages(text)
    if messages is None:
        return ParsedOutput(content=text)
    calls: list[tuple[str, object]] = []
    content: list[str] = []
    for m in messages:
        if m.recipient is None:
            if m.channel != "analysis":
                content.append(m.body)
            continue
        if not m.recipient.startswith("functions.") or len(m.recipient) == len("functions."):
            return ParsedOutput(content=text, ill_formed=True, error=f"recipient {m.recipient!r} is not functions.NAME")
        try:
            args = safejson.loads(m.body)
        except ValueError as exc:
            return ParsedOutput(content=text, ill_formed=True, error=f"tool call arguments are not JSON: {exc}", bad_json=True)
        if not isinstance(args, dict):
            return ParsedOutput(content=text, ill_formed=True, error="tool call arguments are not an object", bad_json=True)
        calls.append((m.recipient[len("functions.") :], args))
    return ParsedOutput(content="".join(content), tool_calls=calls)
