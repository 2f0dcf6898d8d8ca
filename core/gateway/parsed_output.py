"""What a tool-call parser returns, shared by every parser module.

It sits apart from the parsers so ``toolparse`` (the registry) can import
``harmony`` (one parser) while both build the same result type.

Defines:

- ``ParsedOutput``: content, tool calls, and whether the text *tried* to call
  a tool but was malformed (then the whole text comes back as content and the
  turn is counted as ill-formed in the trace metadata).
- ``ToolParser``: a parser's signature, text in, ``ParsedOutput`` out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

__all__ = ["ParsedOutput", "ToolParser"]


@dataclass
class ParsedOutput:
    """What a parser made of one turn's text."""

    content: str
    """Text for the client (everything but well-formed tool calls)."""
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    """(name, arguments) per call, arguments a dict (or a string the model wrote)."""
    ill_formed: bool = False
    """The text tried to call a tool and failed; ``content`` is then the raw text."""
    error: str = ""
    """Why it was ill-formed."""
    bad_json: bool = False
    """Ill-formed because a call's JSON (the call object or its arguments) did not decode,
    or decoded to something other than an object (``ParseStatus.BAD_JSON``); otherwise
    ill-formed markup (``ParseStatus.MARKUP_NO_CALL``)."""
    call_ids: list[str | None] = field(default_factory=list)
    """The id the model wrote for each call (Mistral's ``[TOOL_CALLS][{..., "id": ...}]``), aligned
    with ``tool_calls``; empty when the format writes none. The gateway returns it to the client,
    so history sent back renders the id the model generated."""


ToolParser: TypeAlias = Callable[[str], ParsedOutput]
