"""Regexes that someone other than the run's author wrote, compiled for RE2 (linear time).

A strict tool schema's ``pattern`` comes from the agent; a ``reward=match`` pattern
is matched against text the policy wrote. Python's ``re`` backtracks: ``^(a+)+$``
against 29 ``a`` and a ``!`` took 34 s, doubling per character, on the gateway's
event loop. RE2 (``google-re2``) matches in time linear in the text, whatever the
pattern, and refuses what it cannot do that way (backreferences, lookaround): those
patterns get a ``RegexError`` that says so, never a slow match.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

__all__ = ["RegexError", "compile_regex", "search"]

RE2_LIMITS = "RE2 syntax: no backreferences, lookahead or lookbehind, repetition counts up to 1000"
"""What a refusal tells the user about the syntax accepted."""


class RegexError(ValueError):
    """A pattern RE2 cannot compile (invalid, or a feature only backtracking engines have)."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the error is raised with its message; no C++ log line
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=512)
def compile_regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached: agents resend the same schemas every turn).

    Raises:
        RegexError: RE2 cannot compile it; the message names the pattern and RE2's reason.
    """
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise RegexError(f"regex {pattern!r} cannot be used: {reason} ({RE2_LIMITS})") from None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (JSON Schema's ``pattern``), in linear time."""
    return compile_regex(pattern).search(text) is not None
