"""Reasoning switches: what a chat template offers, and the request fields that drive it.

The prompt side of reasoning; splitting the generated reply into reasoning and
answer (the reply side) is ``core.gateway.reasoning_parsers``.

Defines:

- ``ReasoningSwitches`` / ``template_reasoning``: whether the model's template has a
  thinking switch (``enable_thinking`` as Qwen3 and GLM-4.5 write it,
  ``thinking`` as DeepSeek V3.1 does), a ``reasoning_effort`` variable
  (gpt-oss), or reasons with no switch (``<think>`` or harmony channels in
  the template: DeepSeek R1, QwQ).
- ``anthropic_thinking``, ``openai_reasoning``, ``template_kwargs``: the
  template variables a request asks for (Anthropic ``thinking``, OpenAI
  ``reasoning_effort``, the vLLM-style ``chat_template_kwargs`` that Qwen3
  clients send), or a 400 naming the field when the template cannot do it.

Why: these fields change what the model produces, so a template that cannot
honour one refuses it instead of accepting and ignoring it. The request's
variables are passed to the template for that request only; the trace holds
the tokens the model was actually fed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.gateway import safejson
from core.gateway.errors import bad_request
from core.gateway.fields import key_list, preview

__all__ = ["AS_IS", "ReasoningSwitches", "anthropic_thinking", "openai_reasoning", "template_kwargs", "template_reasoning"]

_RESERVED = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "tokenize", "return_dict", "chat_template",
     "continue_final_message", "bos_token", "eos_token", "pad_token", "unk_token"}
)
"""Template variables the gateway owns; a request may not set them."""

_EFFORTS = ("none", "minimal", "low", "medium", "high")


@dataclass(frozen=True, slots=True)
class ReasoningSwitches:
    """What a chat template lets a request do about reasoning."""

    switch: str | None = None
    """Template variable that turns thinking on and off (``enable_thinking``, ``thinking``)."""
    effort: bool = False
    """The template takes ``reasoning_effort``."""
    always: bool = False
    """The template reasons with no switch (thinking cannot be turned off)."""


AS_IS = ReasoningSwitches()
"""A template without reasoning switches."""


def _variables(template: str) -> set[str] | None:
    """The template's free variables; None when jinja cannot parse it here."""
    try:
        import jinja2
        from jinja2 import meta

        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
        return set(meta.find_undeclared_variables(env.parse(template)))
    except Exception:
        return None


def template_reasoning(template: str) -> ReasoningSwitches:
    """What ``template`` offers (free variables read with jinja, a word match when it will not parse)."""
    found = _variables(template)
    if found is None:
        found = {w for w in ("enable_thinking", "reasoning_effort") if re.search(rf"\b{w}\b", template)}
    switch = "enable_thinking" if "enable_thinking" in found else "thinking" if "thinking" in found else None
    effort = "reasoning_effort" in found
    always = switch is None and ("<think>" in template or "<|channel|>" in template or effort)
    return ReasoningSwitches(switch, effort, always)


def anthropic_thinking(body: dict[str, Any], reasoning: ReasoningSwitches, max_tokens: int | None) -> dict[str, Any]:
    """Template variables for an Anthropic ``thinking`` field.

    ``{"type": "enabled", "budget_tokens": N}`` turns the template's switch on (or is
    accepted by a template that always reasons), ``{"type": "disabled"}`` turns it off
    (or is accepted by a template that never reasons), ``{"type": "adaptive"}`` (the model
    decides) leaves the template's default. ``display`` may be ``summarized`` (the
    reasoning is returned as is); ``omitted`` is refused (the reasoning is always returned). ``budget_tokens`` is checked as
    Anthropic does (an integer >= 1024 below ``max_tokens``); the samplers cannot stop
    thinking at a separate budget, so ``max_tokens`` bounds reasoning and answer together
    (Anthropic too treats the budget as a target, not a cap).
    """
    v = body.get("thinking")
    if v is None:
        return {}
    if not isinstance(v, dict) or v.get("type") not in ("enabled", "disabled", "adaptive"):
        raise bad_request(
            "'thinking' must be {'type': 'enabled', 'budget_tokens': N}, {'type': 'adaptive'} or "
            f"{{'type': 'disabled'}}, got {preview(v.get('type') if isinstance(v, dict) else v)}",
            param="thinking",
        )
    extra = set(v) - {"type", "budget_tokens", "display"}
    if extra:
        raise bad_request(f"'thinking' has unknown keys {key_list(extra)}", param="thinking")
    if v.get("display") not in (None, "summarized"):
        raise bad_request(
            f"'thinking.display' is {preview(v.get('display'))}: the gateway returns the model's reasoning as "
            "thinking blocks and cannot omit it; send 'summarized' or drop it",
            param="thinking",
        )
    if v["type"] == "adaptive":
        return {}  # the model decides: the template's own default
    if v["type"] == "enabled":
        budget = v.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
            raise bad_request("'thinking.budget_tokens' must be an integer >= 1024", param="thinking")
        if max_tokens is not None and budget >= max_tokens:
            raise bad_request(
                f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max_tokens})", param="thinking"
            )
        if reasoning.switch is not None:
            return {reasoning.switch: True}
        if reasoning.always:
            return {}
        raise bad_request(
            "'thinking' is enabled but this model's chat template has no reasoning mode; drop 'thinking'",
            param="thinking",
        )
    if reasoning.switch is not None:
        return {reasoning.switch: False}
    if reasoning.always:
        raise bad_request(
            "'thinking' is disabled but this model's chat template always reasons and has no switch to turn "
            "it off; drop 'thinking'",
            param="thinking",
        )
    return {}


def openai_reasoning(body: dict[str, Any], reasoning: ReasoningSwitches) -> dict[str, Any]:
    """Template variables for an OpenAI ``reasoning_effort`` field.

    Passed as ``reasoning_effort`` to a template that takes it (gpt-oss); on a template
    with an on/off switch, ``none`` turns thinking off; on a template that never reasons,
    ``none`` is what it does already (as Anthropic ``thinking: disabled`` is); anything
    else is a 400 (a level the template cannot express).
    """
    v = body.get("reasoning_effort")
    if v is None:
        return {}
    if v not in _EFFORTS:
        raise bad_request(f"'reasoning_effort' must be one of {list(_EFFORTS)}, got {preview(v)}", param="reasoning_effort")
    if reasoning.effort:
        return {"reasoning_effort": v}
    if reasoning.switch is not None and v == "none":
        return {reasoning.switch: False}
    if v == "none" and reasoning.switch is None and not reasoning.always:
        return {}  # the template never reasons: honoured as it is
    what = (
        f"only turns thinking on or off ({reasoning.switch}): send 'none' to turn it off, or "
        f"chat_template_kwargs {{'{reasoning.switch}': true}}"
        if reasoning.switch is not None
        else "has no reasoning effort"
    )
    raise bad_request(
        f"'reasoning_effort' {v!r} cannot be honoured: this model's chat template {what}", param="reasoning_effort"
    )


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The vLLM-style ``chat_template_kwargs`` of a request (``{"enable_thinking": false}``)."""
    v = body.get("chat_template_kwargs")
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise bad_request("'chat_template_kwargs' must be an object of template variables", param="chat_template_kwargs")
    if safejson.deeper_than(v):
        raise bad_request(
            f"'chat_template_kwargs' nests deeper than {safejson.MAX_DEPTH} levels; template variables need no such depth",
            param="chat_template_kwargs",
        )
    owned = sorted(_RESERVED & v.keys())
    if owned:
        raise bad_request(
            f"'chat_template_kwargs' may not set {owned}: the gateway owns them", param="chat_template_kwargs"
        )
    return dict(v)
