"""Typed reads of optional request fields, with errors that name the field.

Hand-written rather than pydantic: request bodies are proxied chat payloads
with many optional, loosely typed fields, and the hot path validates only the
few fields the gateway uses (the messages are validated as they are converted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.gateway.errors import bad_request

__all__ = ["ANTHROPIC_FIELDS", "ANTHROPIC_UNHONOURED", "CHAT_FIELDS", "OPENAI_UNHONOURED", "Fields", "Unhonoured",
           "VERBOSITIES", "check_fields", "drop_ignored", "key_list", "opt_bool", "opt_int", "opt_number", "opt_stop", "preview", "refuse_unhonoured",
           "short_repr", "verbosity_hint"]


def short_repr(v: Any, limit: int = 60) -> str:
    """``repr(v)`` for an error message, cut to about ``limit`` characters; containers by size
    only (the repr of a value nested ~1000 deep recurses past Python's limit)."""
    if isinstance(v, dict):
        return f"an object of {len(v)} keys"
    if isinstance(v, list):
        return f"a list of {len(v)} items"
    if isinstance(v, str):
        return repr(v[:limit])
    return repr(v)[:limit]


def key_list(keys: Any, limit: int = 10) -> str:
    """Some of a client's object keys for an error message: sorted, each cut short, at most
    ``limit`` of them (a hostile object may have thousands of long keys)."""
    names = sorted(str(k) for k in keys)
    shown = ", ".join(short_repr(k, 40) for k in names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}]"


def preview(v: Any, limit: int = 40) -> str:
    """A short description of a client value for an error message: type and the start of its
    repr, containers by size only (the repr of a value nested ~1000 deep recurses past
    Python's limit, and an error message must not fail)."""
    if isinstance(v, dict | list):
        return short_repr(v, limit)
    return f"{type(v).__name__} {short_repr(v, limit)}"


def opt_int(body: dict[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    """``body[key]`` as an int, None when absent or null."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{key}' must be an integer, got {preview(v)}", param=key)
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
        raise bad_request(f"'{key}' must be a number, got {preview(v)}", param=key)
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
        raise bad_request(f"'{key}' must be true or false, got {preview(v)}", param=key)
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


Unhonoured = dict[str, tuple[Callable[[Any], bool], str]]
"""Field -> (is the value neutral?, what to do instead): fields that would change what the
model may produce and that the gateway cannot honour. A neutral value (``0``, ``{}``,
``"text"``) is accepted; anything else is a 400 naming the field."""


def _zero(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == 0


def _one(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == 1


def _empty(v: Any) -> bool:
    return v in ({}, [], "", False) or (isinstance(v, dict) and all(x is None for x in v.values()))


def _false(v: Any) -> bool:
    return v is False


_SAMPLER = "the gateway's samplers take a prompt and sampling parameters only; drop it"

OPENAI_UNHONOURED: Unhonoured = {
    "frequency_penalty": (_zero, _SAMPLER),
    "presence_penalty": (_zero, _SAMPLER),
    "logit_bias": (_empty, _SAMPLER),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text" and len(v) == 1,
                        "structured output (json_object / json_schema) needs constrained decoding, which the "
                        "gateway's samplers do not do; ask for JSON in the prompt and parse the text, or have "
                        "the framework return it through a tool call (LangChain: with_structured_output("
                        "method='function_calling'))"),
    "functions": (_empty, "the legacy 'functions' field is not supported; send 'tools'"),
    "function_call": (lambda v: v in ("none", "auto"), "the legacy 'function_call' field is not supported; "
                      "send 'tool_choice'"),
    "audio": (_empty, "the model answers in text only"),
    "modalities": (lambda v: v == ["text"], "the model answers in text only; send ['text'] or drop it"),
    "web_search_options": (_empty, "the gateway has no web search; drop it"),
    "moderation": (_empty, "the gateway moderates neither the input nor the output; drop it"),
    # vLLM / SGLang extensions clients pass through extra_body
    "repetition_penalty": (_one, _SAMPLER),
    "length_penalty": (_one, _SAMPLER),
    "min_p": (_zero, _SAMPLER),
    "min_tokens": (_zero, _SAMPLER),
    "ignore_eos": (_false, "the gateway always stops at the model's end of turn"),
    "bad_words": (_empty, _SAMPLER),
    "allowed_token_ids": (_empty, _SAMPLER),
    "best_of": (_one, "one completion per turn; drop it"),
    "use_beam_search": (_false, _SAMPLER),
    "prompt_logprobs": (lambda v: v is None, "prompt logprobs are not returned; the trace has the prompt"),
    "echo": (_false, "the prompt is not echoed; the trace has it"),
    "add_generation_prompt": (lambda v: v is True, "the gateway always renders the generation prompt"),
    "continue_final_message": (_false, "the gateway does not continue a final assistant message"),
    "chat_template": (_empty, "the gateway renders with the model's own template (gateway config)"),
    "documents": (_empty, "documents are not rendered; put them in the messages"),
    "include_stop_str_in_output": (_false, "stop strings are cut from the returned text"),
    "guided_json": (_empty, "guided decoding is not supported by the gateway's samplers"),
    "guided_regex": (_empty, "guided decoding is not supported by the gateway's samplers"),
    "guided_choice": (_empty, "guided decoding is not supported by the gateway's samplers"),
    "guided_grammar": (_empty, "guided decoding is not supported by the gateway's samplers"),
    "structured_outputs": (_empty, "guided decoding is not supported by the gateway's samplers"),
}
"""OpenAI chat fields that change the output and are refused unless neutral (docs/gateway.md)."""

ANTHROPIC_UNHONOURED: Unhonoured = {
    "container": (_empty, "the gateway runs no code-execution container; drop it"),
    "mcp_servers": (_empty, "the gateway connects to no MCP server; give the agent the tools instead"),
    "context_management": (_empty, "the gateway never edits the context; the trace must be what the model saw"),
    "output_format": (_empty, "structured output needs constrained decoding, which the gateway's samplers do not do"),
    "output_config": (_empty, "the gateway has no effort control; drop it"),
}
"""Anthropic messages fields that change the output and are refused unless neutral."""


VERBOSITIES = ("low", "medium", "high")


def verbosity_hint(value: Any, param: str) -> tuple[str, ...]:
    """``("verbosity",)`` when ``value`` asks for a verbosity other than the default: a hint
    no chat template expresses and that constrains nothing the sampler may produce, so it is
    accepted and counted (``hints_ignored``), never passed on (docs/gateway.md, "Hints").

    Raises:
        GatewayError: 400 naming ``param`` for a value OpenAI does not define.
    """
    if value is None or value == "medium":
        return ()
    if value not in VERBOSITIES:
        raise bad_request(f"'{param}' must be one of {list(VERBOSITIES)}, got {preview(value)}", param=param.split(".")[0])
    return ("verbosity",)


def refuse_unhonoured(body: dict[str, Any], table: Unhonoured) -> None:
    """400 naming the first field of ``table`` that ``body`` sets to a value that is not neutral."""
    for key, v in body.items():
        if key not in table:
            continue
        neutral, hint = table[key]
        if v is not None and not neutral(v):
            raise bad_request(
                f"'{key}' is not supported by this gateway ({hint}); got {preview(v, 60)}", param=key
            )


@dataclass(frozen=True, slots=True)
class Fields:
    """Every top-level field one dialect knows, by what the gateway does with it."""

    dialect: str
    """How error messages name the route (``chat completions``)."""
    read: frozenset[str]
    """Fields the parser reads and honours (or refuses by value)."""
    harmless: frozenset[str]
    """Fields accepted and ignored: they cannot change what the model may produce."""
    unhonoured: Unhonoured
    """Fields refused unless neutral (``refuse_unhonoured``)."""
    hints: dict[str, str] = field(default_factory=dict)
    """What to send instead of an unknown field other servers take (the 400 says it)."""


CHAT_FIELDS = Fields(
    dialect="chat completions",
    read=frozenset({
        "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens",
        "temperature", "top_p", "top_k", "stop", "n", "stream", "stream_options", "seed", "logprobs",
        "top_logprobs", "reasoning_effort", "chat_template_kwargs", "verbosity", "model",
    }),
    harmless=frozenset({
        "user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
        "prompt_cache_options", "safety_identifier", "prediction",
    }),
    unhonoured=OPENAI_UNHONOURED,
    hints={
        "enable_thinking": "send chat_template_kwargs {'enable_thinking': ...} (vLLM's form), or reasoning_effort 'none'",
        "thinking": "send chat_template_kwargs {'thinking': ...} for a template with that switch, or reasoning_effort",
        "reasoning": "send reasoning_effort (chat completions) or use /v1/responses, which takes 'reasoning'",
        "max_output_tokens": "send max_completion_tokens (chat completions) or use /v1/responses",
        "input": "send 'messages', or use /v1/responses, which takes 'input'",
    },
)
"""OpenAI ``/v1/chat/completions``: ``prediction`` only speeds decoding up (the output is the
model's either way); the other harmless fields are billing, caching and storage hints."""

ANTHROPIC_FIELDS = Fields(
    dialect="messages",
    read=frozenset({
        "messages", "system", "tools", "tool_choice", "max_tokens", "temperature", "top_p", "top_k",
        "stop_sequences", "stream", "thinking", "model",
    }),
    harmless=frozenset({
        "metadata", "service_tier", "cache_control", "inference_geo", "speed", "workspace_id",
        "user_profile_id", "diagnostics",
    }),
    unhonoured=ANTHROPIC_UNHONOURED,
)
"""Anthropic ``/v1/messages`` (and ``count_tokens``): the harmless fields are routing, caching,
speed and attribution hints (``diagnostics`` only asks for cache-miss reasons)."""


def check_fields(body: dict[str, Any], fields: Fields) -> None:
    """400 naming a field of ``body`` the dialect does not know, or an unhonoured one set to a
    value that is not neutral. Unknown fields are refused, not ignored: one may change what
    the model produces (``gateway.ignore_request_fields`` drops named ones first). Null
    counts as absent, as on the Responses route."""
    for key, value in body.items():
        if value is None or key in fields.read or key in fields.harmless or key in fields.unhonoured:
            continue
        name = short_repr(key, 60)
        hint = fields.hints.get(key)
        if hint is not None:
            raise bad_request(f"{name} is not a {fields.dialect} field; {hint}", param=key)
        raise bad_request(
            f"{name} is not a {fields.dialect} field this gateway knows; it is refused rather than ignored "
            "because it might change what the model produces. Drop it, or list it in the gateway config's "
            "gateway.ignore_request_fields to have it ignored (docs/gateway.md, Request fields)",
            param=key[:60],
        )
    refuse_unhonoured(body, fields.unhonoured)


def drop_ignored(body: dict[str, Any], ignore: frozenset[str]) -> dict[str, Any]:
    """``body`` without the fields ``gateway.ignore_request_fields`` names (a copy, when it had any)."""
    if not ignore or ignore.isdisjoint(body):
        return body
    return {k: v for k, v in body.items() if k not in ignore}
