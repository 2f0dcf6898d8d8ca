"""A resent request body recognised by its bytes: only what is new in it is parsed.

Defines:

- ``ResentBody``: what a session keeps of its last parsed turn request: the raw bytes,
  where its ``messages`` array and each message end, and the parsed messages.
- ``parse_turn_body``: a turn request's body as a JSON object, reusing the parsed
  messages of the session's last body for the bytes it resends.

Why: agents resend the whole conversation every turn, so parsing the body, and then
comparing the parsed history with the stored one, grows with the context. Here the
new body is compared with the previous one byte for byte at message boundaries (a
C ``memcmp``, about 10 GB/s); the messages whose bytes are unchanged are the very
objects parsed last time, which the history match then recognises by identity
(``core.gateway.history.match_path``), and only the bytes after them are parsed.

The answer is always what ``json.loads`` gives for the body (which is what
``core.gateway.app.parse_body`` gives): the new messages are parsed by ``json``'s own
scanner, the other top-level fields by the caller's full parser on a small document
made of the body without its messages, and anything unexpected (other encodings,
errors, a second ``messages`` key) falls back to the full parse, which also makes
every 400. Nothing about a message is validated at parse time, so a reused message
skips nothing: validation happens when a message is converted (``core.gateway.messages``).
"""

from __future__ import annotations

import json
import json.decoder
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ResentBody", "parse_turn_body"]

_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")
"""JSON's whitespace (``json.decoder.WHITESPACE``)."""
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_STAND_IN = json.dumps("tracerl-messages-" + secrets.token_hex(16)).encode()
"""A JSON string no client can know, standing in for the messages when the other fields
are parsed: finding it back as the only message proves no later key replaced them."""
_STAND_IN_VALUE = [json.loads(_STAND_IN)]


@dataclass(frozen=True, slots=True)
class ResentBody:
    """A parsed turn request's bytes and messages, for recognising the next one."""

    raw: bytes
    """The body as received."""
    head: int
    """Bytes up to and including the ``[`` that opens the top-level ``messages`` array."""
    ends: tuple[int, ...]
    """One past each message's last byte, in order."""
    messages: tuple[Any, ...]
    """The parsed messages (the objects handed on; never mutated by the gateway)."""


def parse_turn_body(
    raw: bytes, previous: ResentBody | None, full: Callable[[bytes], dict[str, Any]],
    loads: Callable[[bytes], Any],
) -> tuple[dict[str, Any], ResentBody | None]:
    """(the body as a JSON object, what to keep for the next body of the session).

    Args:
        raw: The request body.
        previous: What the session kept of its last body (None: nothing).
        full: The full parser (``parse_body``): used when the body is not a plain UTF-8
            JSON object with one ``messages`` array, and for every invalid body (its
            400s are the answers).
        loads: Parses a JSON document as ``json.loads`` would (``core.gateway.app._loads``).
    """
    if previous is not None:
        try:
            extended = _extend(raw, previous, loads)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            extended = None
        if extended is not None:
            return extended
    try:
        walked = _walk(raw)
    except (ValueError, RecursionError):
        walked = None
    if walked is not None:
        return walked
    return full(raw), None


def _skip(text: str, pos: int) -> int:
    """The offset of the first non-whitespace character at or after ``pos``."""
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]  # '*' always matches


def _byte_ends(raw_offset: int, text: str, start: int, char_ends: list[int]) -> list[int]:
    """``char_ends`` (offsets into ``text``, from ``start``) as offsets into the raw bytes,
    given that ``text[start]`` is at byte ``raw_offset``."""
    if text.isascii():
        return [raw_offset + c - start for c in char_ends]
    out = []
    at, byte = start, raw_offset
    for c in char_ends:
        byte += len(text[at:c].encode("utf-8", "surrogatepass"))
        at = c
        out.append(byte)
    return out


def _elements(text: str, pos: int, after_value: bool) -> tuple[list[Any], list[int], int]:
    """(values, their end offsets, offset past the ``]``) of an array's elements from ``pos``:
    just after its ``[`` (``after_value`` False) or just after one of its values."""
    items: list[Any] = []
    ends: list[int] = []
    pos = _skip(text, pos)
    if after_value:
        if text[pos : pos + 1] == "]":
            return items, ends, pos + 1
        if text[pos : pos + 1] != ",":
            raise ValueError("expected ',' or ']' after an array element")
        pos = _skip(text, pos + 1)
    elif text[pos : pos + 1] == "]":
        return items, ends, pos + 1
    while True:
        item, pos = _DECODER.raw_decode(text, pos)  # a ']' here (a trailing comma) raises
        items.append(item)
        ends.append(pos)
        pos = _skip(text, pos)
        c = text[pos : pos + 1]
        if c == "]":
            return items, ends, pos + 1
        if c != ",":
            raise ValueError("expected ',' or ']' after an array element")
        pos = _skip(text, pos + 1)


def _walk(raw: bytes) -> tuple[dict[str, Any], ResentBody | None] | None:
    """The body parsed as ``json.loads`` would, with its messages' offsets; None when it is
    not a UTF-8 JSON object (the full parser decides)."""
    if json.detect_encoding(raw) != "utf-8":
        return None
    text = raw.decode("utf-8", "surrogatepass")  # what json.loads decodes bytes with
    pos = _skip(text, 0)
    if text[pos : pos + 1] != "{":
        return None
    body: dict[str, Any] = {}
    head_char = -1
    found: tuple[list[Any], list[int]] | None = None
    pos = _skip(text, pos + 1)
    if text[pos : pos + 1] == "}":
        pos += 1
    else:
        while True:
            if text[pos : pos + 1] != '"':
                return None
            key, pos = _scanstring(text, pos + 1)
            pos = _skip(text, pos)
            if text[pos : pos + 1] != ":":
                return None
            pos = _skip(text, pos + 1)
            value: Any
            if key == "messages" and head_char < 0 and text[pos : pos + 1] == "[":
                head_char = pos + 1
                value, char_ends, pos = _elements(text, head_char, after_value=False)
                found = (value, char_ends)
            else:
                if key == "messages":
                    found = None  # a second messages key: parse it, keep nothing
                value, pos = _DECODER.raw_decode(text, pos)
            body[key] = value
            pos = _skip(text, pos)
            c = text[pos : pos + 1]
            if c == "}":
                pos += 1
                break
            if c != ",":
                return None
            pos = _skip(text, pos + 1)
    if _skip(text, pos) != len(text):
        return None
    if found is None:
        return body, None
    messages, char_ends = found
    head = _byte_ends(0, text, 0, [head_char])[0]
    ends = _byte_ends(head, text, head_char, char_ends)
    return body, ResentBody(raw, head, tuple(ends), tuple(messages))


def _extend(
    raw: bytes, previous: ResentBody, loads: Callable[[bytes], Any]
) -> tuple[dict[str, Any], ResentBody] | None:
    """The body when it starts with ``previous``'s bytes up to a message boundary (or at
    least up to its messages array): those messages reused, the rest parsed; else None."""
    prev, ends = previous.raw, previous.ends
    view = memoryview(prev)
    # Most messages resent unchanged: the longest boundary whose prefix matches (prefixes
    # that match are a run from the first boundary, so a binary search finds its end).
    kept = 0
    if ends and raw.startswith(view[: ends[-1]]):
        kept = len(ends)
    elif ends:
        low, high = 0, len(ends)  # ends[:low] known to match, ends[high:] not
        while low < high:
            mid = (low + high + 1) // 2
            if raw.startswith(view[: ends[mid - 1]]):
                low = mid
            else:
                high = mid - 1
        kept = low
    start = ends[kept - 1] if kept else previous.head
    if not kept and not raw.startswith(view[:start]):
        return None
    text = raw[start:].decode("utf-8", "surrogatepass")
    items, char_ends, after = _elements(text, 0, after_value=kept > 0)
    new_ends = _byte_ends(start, text, 0, char_ends)
    rest = _byte_ends(start, text, 0, [after])[0]
    # The other fields: the body with a stand-in for its messages, parsed whole (its head
    # is as long as the fields before the messages, its rest as the fields after them).
    top = loads(raw[: previous.head] + _STAND_IN + b"]" + raw[rest:])
    if not isinstance(top, dict) or top.get("messages") != _STAND_IN_VALUE:
        return None
    messages = previous.messages[:kept] + tuple(items)
    top["messages"] = list(messages)
    return top, ResentBody(raw, previous.head, ends[:kept] + tuple(new_ends), messages)
