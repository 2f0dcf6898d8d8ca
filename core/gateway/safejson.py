"""JSON from untrusted sources (request bodies, client tool arguments, model output), bounded.

Defines:

- ``MAX_DEPTH``: the deepest nesting the gateway accepts anywhere.
- ``TooDeep``: a ``ValueError`` for JSON nested deeper than that.
- ``loads``: ``json.loads`` that turns ``RecursionError`` into ``TooDeep`` and
  refuses documents nested deeper than ``MAX_DEPTH``.
- ``deeper_than``: the depth check ``loads`` applies, for objects parsed otherwise.
- ``valid_unicode`` / ``lone_surrogate``: whether a string, and where in a
  parsed request a string, holds a lone UTF-16 surrogate.

Why a depth cap: Python's JSON parser and every later recursive step (the
response encoder, the template's ``tojson``) share one recursion limit, so
JSON that parses just under it can overflow it a few frames deeper, as a
``RecursionError`` after the turn was sampled. ``loads`` is for the small
documents the gateway parses on its own: tool calls the model wrote and tool
arguments a client sent as a string. 128 levels is far above any real tool
call and far below the limit. (Request bodies are parsed by
``core.gateway.app.parse_body``, orjson with a ``json`` fallback, without a
depth walk; its docstring says why that is safe.)

Why surrogates: JSON's ``"\\ud800"`` escape parses to a lone surrogate, a
``str`` that cannot be encoded as UTF-8, so the tokenizer fails on it (a
``TypeError``). Escaped surrogate *pairs* (``"\\ud83d\\ude00"``) parse to one
character and are fine. The gateway does not scan every body for them (that
costs as much as parsing it); the renderer notices when the tokenizer refuses
a text and only then ``lone_surrogate`` finds the field to name in the 400.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "TooDeep", "deeper_than", "loads", "lone_surrogate", "valid_unicode"]

MAX_DEPTH = 128
"""Deepest nesting of arrays and objects accepted in any JSON the gateway parses."""



class TooDeep(ValueError):
    """The JSON nests arrays/objects deeper than ``MAX_DEPTH``."""

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        super().__init__(f"JSON nested more than {limit} levels deep (the gateway's limit)")
        self.limit = limit


def _openers(text: str | bytes) -> int:
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")


def deeper_than(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` nests containers more than ``limit`` deep (iterative: no recursion)."""
    if not isinstance(obj, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list) and child:
                stack.append((child, depth + 1))
    return False


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` nested at most ``max_depth`` deep.

    The depth walk runs only when the text has more ``[``/``{`` than
    ``max_depth`` (a C-speed count), so small documents pay nothing for it.

    Raises:
        TooDeep: nested deeper than ``max_depth`` (also for a parser ``RecursionError``).
        ValueError: not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    try:
        obj = json.loads(text)
    except RecursionError:
        raise TooDeep(max_depth) from None
    if isinstance(obj, dict | list) and _openers(text) > max_depth and deeper_than(obj, max_depth):
        raise TooDeep(max_depth)
    return obj


def valid_unicode(s: str) -> bool:
    """Whether ``s`` encodes as UTF-8 (holds no lone surrogate)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate(obj: Any) -> str | None:
    """Where in ``obj`` a string (or key) holds a lone surrogate: ``""`` for ``obj`` itself,
    ``"[0].content"`` below it; None when nowhere. Iterative (no recursion)."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if not valid_unicode(node):
                return path
        elif isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and not valid_unicode(key):
                    return f"{path}[{key!r}]"
                stack.append((value, f"{path}.{key}"))
        elif isinstance(node, list | tuple):
            for i, value in enumerate(node):
                stack.append((value, f"{path}[{i}]"))
    return None
