"""Strict function tools: a call's arguments checked against its tool's schema after sampling.

Defines ``strict_schemas`` (the strict tools of a request, by name),
``split_strict`` (the calls whose arguments fit, and how many did not) and
``misfit_reason`` (why a call did not fit, for its turn's parse status).

Why after sampling: ``strict: true`` asks that a call's arguments match the
tool's schema, which OpenAI guarantees by constrained decoding. The gateway's
samplers take a prompt and return tokens (no grammar), so, as with
``tool_choice`` (``core.gateway.toolchoice``), the guarantee is kept by what is
returned: a call that does not fit is not returned as a call (counted, and the
turn flagged), never passed off as valid. Trained tokens are always the tokens
generated. pydantic-ai and the OpenAI Agents SDK send ``strict: true`` by
default, so refusing it would break them.

Why RE2: a schema's ``pattern`` and ``patternProperties`` come from the client and
jsonschema would match them with Python's backtracking ``re`` on the event loop
(``^(a+)+$`` against 30 characters stalled every session for 34 s). The validator
here matches them with RE2 (``core.safe_regex``, linear time), and a request whose
strict schema holds a regex RE2 cannot run gets a 400 that names it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from core.gateway.errors import bad_request
from core.safe_regex import RegexError, compile_regex, search

__all__ = ["misfit_reason", "strict_schemas", "split_strict"]

_CACHED = 64
"""Validators kept (agents resend the same tools every turn)."""
_validators: OrderedDict[str, Any] = OrderedDict()


def _regexes(schema: Any) -> Iterator[str]:
    """Every regex a schema holds (``pattern`` values, ``patternProperties`` keys), walked
    without recursion. Raises ``RegexError`` for ``unevaluatedProperties`` beside
    ``patternProperties``: jsonschema matches those with Python's ``re`` internally."""
    stack, seen = [schema], 0
    while stack and seen < 100_000:
        node = stack.pop()
        seen += 1
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        props = node.get("patternProperties")
        if isinstance(props, dict):
            if "unevaluatedProperties" in node:
                raise RegexError("'unevaluatedProperties' beside 'patternProperties' is not supported")
            yield from (k for k in props if isinstance(k, str))
        stack.extend(v for v in node.values() if isinstance(v, dict | list))


def _check_regexes(name: str, schema: Any) -> None:
    """A 400 naming the tool when its strict schema holds a regex RE2 cannot run."""
    try:
        for pattern in _regexes(schema):
            compile_regex(pattern)
    except RegexError as exc:
        raise bad_request(
            f"strict tool {name!r}: {exc}; the gateway checks strict schemas with RE2 (linear time) "
            "so that no pattern can stall it",
            param="tools",
        ) from None


def _pattern(validator: Any, patrn: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, props: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in props.items():
        for k, v in instance.items():
            if search(patrn, k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in named and not any(search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for k in extras:
            yield from validator.descend(instance[k], extra, path=k)
    elif not extra and extras:
        yield ValidationError(f"additional properties are not allowed ({sorted(extras)!r})")


_rx_validator: Any = None


def _rx_validator_class() -> Any:
    """Draft 2020-12 with every regex keyword matched by RE2 instead of Python's ``re``."""
    global _rx_validator
    if _rx_validator is None:
        from jsonschema import Draft202012Validator
        from jsonschema.validators import extend

        _rx_validator = extend(
            Draft202012Validator,
            {
                "pattern": _pattern,
                "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties,
            },
        )
    return _rx_validator


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
        validator: Any = _rx_validator_class()(schema, registry=Registry())
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
    request with many strict tools costs nothing extra, except that each regex they hold
    is compiled by RE2 (cached), so that one it cannot run is a 400 here.

    Raises:
        GatewayError: a 400 when a strict schema holds a regex RE2 cannot run.
    """
    if not isinstance(tools, list):
        return None
    out: dict[str, Any] = {}
    for t in tools:
        fn = t if flat else t.get("function")
        if isinstance(fn, dict) and fn.get("strict") is True:
            schema = fn.get("parameters", fn.get("input_schema"))
            out[str(fn["name"])] = {"type": "object", "properties": {}} if schema is None else schema
            _check_regexes(str(fn["name"]), schema)
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


def misfit_reason(schemas: dict[str, Any] | None, name: str, args: Any) -> str:
    """Why ``args`` break the strict schema of tool ``name``: the validator's first error,
    or what kept them from being checked. '' when they fit (or the tool is not strict)."""
    if not schemas or name not in schemas:
        return ""
    validator = _validator(schemas[name])
    if validator is None:
        return "its schema is not valid JSON Schema, so no arguments fit it"
    if not isinstance(args, dict):
        return "the arguments are not a JSON object"
    try:
        error = next(iter(validator.iter_errors(args)), None)
    except Exception as exc:  # an unresolvable $ref, a deep value: not shown to fit
        return f"the arguments could not be checked ({type(exc).__name__})"
    return "" if error is None else str(error.message)
