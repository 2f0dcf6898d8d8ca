"""Typed reads of optional request fields, with errors that name the field.

Hand-written rather than pydantic: request bodies are proxied chat payloads
with many optional, loosely typed fields, and the hot path validates only the
few fields the gateway uses (the messages are validated as they are converted).
"""

from __future__ import annotations

import math
from typing import Any

from core.gateway.errors import bad_request

__all__ = ["opt_bool", "opt_int", "opt_number", "opt_stop"]


def opt_int(body: dict[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    """``body[key]`` as an int, None when absent or null."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{key}' must be an integer, got {type(v).__name__} {v!r:.40}", param=key)
    if minimum is not None and v < minimum:
        raise bad_request(f"'{key}' must be >= {minimum}, got {v}", param=key)
    return v


def opt_number(
    body: dict[str, Any], key: str, *, low: float, high: float, low_open: bool = False
) -> float | None:
    """``body[key]`` as a finite float in [low, high] ((low, high] when ``low_open``)."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**9:
        raise bad_request(f"'{key}' must be in [{low}, {high}], got an integer of {len(str(abs(v)))} digits", param=key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise bad_request(f"'{key}' must be a number, got {type(v).__name__} {v!r:.40}", param=key)
    if v > high or v < low or (low_open and v == low):
        bracket = "(" if low_open else "["
        raise bad_request(f"'{key}' must be in {bracket}{low}, {high}], got {v}", param=key)
    return float(v)


def opt_bool(body: dict[str, Any], key: str) -> bool:
    """``body[key]`` as a bool, False when absent or null."""
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_request(f"'{key}' must be true or false, got {type(v).__name__} {v!r:.40}", param=key)
    return v


def opt_stop(body: dict[str, Any], key: str) -> tuple[str, ...]:
    """A stop string or list of stop strings."""
    v = body.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise bad_request(f"'{key}' must be a string or a list of strings", param=key)
