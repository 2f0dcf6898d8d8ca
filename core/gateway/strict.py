"""Strict function tools: a call's arguments checked against its tool's schema after sampling.

Defines ``strict_schemas`` (the strict tools of a request, by name) and
``split_strict`` (the calls whose arguments fit, and how many did not).

Why after sampling: ``strict: true`` asks that a call's arguments match the
tool's schema, which OpenAI guarantees by constrained decoding. The gateway's
samplers take a prompt and return tokens (no grammar), so, as with
``tool_choice`` (``core.gateway.toolchoice``), the guarantee is kept by what is
returned: a call that does not fit is not returned as a call (counted, and the
turn flagged), never passed off as valid. Trained tokens are always the tokens
generated. pydantic-ai and the OpenAI Agents SDK send ``strict: true`` by
default, so refusing it would break them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

__all__ = ["strict_schemas", "split_strict"]

_CACHED = 64
"""Validators kept (agents resend the same tools every turn)."""
_validators: OrderedDict[str, Any] = OrderedDict()


def _validator(schema: Any) -> Any:
    """A compiled validator of ``schema`` (cached by its JSON text); None when it is not a
    valid JSON schema (then no call can be shown to fit it).

    The empty registry is why a ``$ref`` to a URL is unresolvable (so nothing fits it)
    rather than fetched: without one jsonschema GETs it, blocking the event loop, at a
    URL the client chose."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    from referencing import Registry

    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return None
    if key in _validators:
        _validators.move_to_end(key)
        return _validators[key]
    try:
        Draft202012Validator.check_schema(schema)
        validator: Any = Draft202012Validator(schema, registry=Registry())
    except (SchemaError, RecursionError):
        validator = None
    _validators[key] = validator
    if len(_validators) > _CACHED:
        _validators.popitem(last=False)
    return validator


def strict_schemas(tools: Any, *, flat: bool = False) -> dict[str, Any] | None:
    """The schemas of a request's strict function tools by name; None when none is strict.

    ``tools`` as the client sent them (already checked by the dialect): chat's
    ``{"type": "function", "function": {..., "strict": true}}``, or with ``flat`` the
    Responses and Anthropic form ``{"name", "parameters" | "input_schema", "strict"}``.
    Nothing is compiled here: only the tools the model calls are (``split_strict``), so a
    request with many strict tools costs nothing extra.
    """
    if not isinstance(tools, list):
        return None
    out: dict[str, Any] = {}
    for t in tools:
        fn = t if flat else t.get("function")
        if isinstance(fn, dict) and fn.get("strict") is True:
            schema = fn.get("parameters", fn.get("input_schema"))
            out[str(fn["name"])] = {"type": "object", "properties": {}} if schema is None else schema
    return out or None


def split_strict(schemas: dict[str, Any] | None, calls: list[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], int]:
    """(calls whose arguments fit their strict tool's schema, or whose tool is not strict;
    how many calls did not fit). Arguments that are not a JSON object never fit, nor does
    anything a schema that is not valid JSON Schema would be asked to check."""
    if not schemas:
        return calls, 0
    kept = []
    for name, args in calls:
        if name in schemas:
            validator = _validator(schemas[name])
            try:
                fits = validator is not None and isinstance(args, dict) and validator.is_valid(args)
            except Exception:  # an unresolvable $ref, a deep value: not shown to fit
                fits = False
            if not fits:
                continue
        kept.append((name, args))
    return kept, len(calls) - len(kept)
