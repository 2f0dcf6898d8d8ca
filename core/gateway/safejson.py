"""JSON from untrusted sources (request bodies, client tool arguments, model output), bounded.

Defines:

- ``MAX_DEPTH``: the deepest nesting the gateway accepts anywhere.
- ``TooDeep``: a ``ValueError`` for JSON nested deeper than that.
- ``loads``: ``json.loads`` that turns ``RecursionError`` into ``TooDeep`` and
  refuses documents nested deeper than ``MAX_DEPTH``.
- ``deeper_than``: the depth check ``loads`` applies, for objects parsed otherwise.
- ``lone_surrogate``: where a parsed request holds a lone UTF-16 surrogate.

Why a depth cap: Python's JSON parser and every later recursive step (``==``
when matching history, the template's ``tojson``, the response encoder) share
one recursion limit. A document parsed just under that limit at the top of a
request can overflow it a few frames deeper, as a ``RecursionError`` (a 500)
after the turn was sampled. 128 levels is far above any real chat payload and
far below the limit, so nothing accepted can overflow later.

Why surrogates: JSON's ``"\\ud800"`` escape parses to a lone surrogate, a
``str`` that cannot be encoded as UTF-8, so the tokenizer and the response
encoder fail on it. Escaped surrogate *pairs* (``"\\ud83d\\ude00"``) parse to
one character and are fine.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "TooDeep", "deeper_than", "loads", "lone_surrogate"]

MAX_DEPTH = 128
"""Deepest nesting of arrays and objects accepted in any JSON the gateway parses."""

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_STR = re.compile(r"\\u[dD][89a-fA-F]")


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


def _bad(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate(raw: str | bytes, obj: Any) -> str | None:
    """The path (``messages[0].content``) of a string in ``obj`` holding a lone surrogate, else None.

    ``raw`` is the text ``obj`` was parsed from: a lone surrogate can only come
    from a ``\\uD8xx``-``\\uDFxx`` escape, so a text without one is cleared by a
    C-speed search and the walk runs only for texts that have one (escaped
    emoji pairs, or the bad case).
    """
    pattern = _SURROGATE_ESCAPE_STR if isinstance(raw, str) else _SURROGATE_ESCAPE
    if pattern.search(raw) is None:  # type: ignore[arg-type]
        return None
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _bad(node):
                return path or "body"
        elif isinstance(node, dict):
            for key, value in node.items():
                if _bad(key):
                    return f"{path}.{key!r}" if path else repr(key)
                stack.append((value, f"{path}.{key}" if path else key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                stack.append((value, f"{path}[{i}]"))
    return None
