"""Which tool calls a turn may return: ``tool_choice`` and parallel calls, for every dialect.

Defines:

- ``ToolChoice``: the dialect-neutral choice (``auto``, ``none``, ``required``,
  optionally restricted to some tool names) plus whether several calls may be
  returned at once.
- ``openai_tool_choice`` (chat completions and Responses shapes) and
  ``anthropic_tool_choice``: parse a request's fields, 400 naming the field on
  anything malformed or on a named tool that is not offered.
- ``enforce``: apply a choice to what the tool parser read from the model's text.

Why enforcement happens after sampling: samplers take a prompt and return
tokens (no grammar), so the gateway cannot constrain what the model writes.
The prompt is rendered exactly as for ``auto`` (the tools stay in it, as vLLM
does by default), which keeps a conversation's token prefix the same whatever
the choice, and the choice decides which parsed calls reach the client. The
trained tokens are always the tokens generated; a turn that did not follow the
choice is answered as documented below and flagged (``violated``), never
passed off as compliant:

- ``none``: no call is returned; if the model wrote calls anyway, the whole
  text comes back as content and the turn is a violation.
- ``required``: a turn without a call returns its text and is a violation.
- a named tool (or an allowed subset): calls to other tools are dropped; a
  turn left without a call is a violation (whole text as content when the
  model called something else).
- ``parallel=False``: the first call is returned, later ones are dropped
  (counted, not a violation of the choice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from core.gateway.errors import bad_request
from core.gateway.fields import key_list, preview, short_repr

__all__ = ["AUTO", "Enforced", "ToolChoice", "anthropic_tool_choice", "enforce", "openai_tool_choice"]

Mode = Literal["auto", "none", "required"]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """What calls a turn may return."""

    mode: Mode = "auto"
    """``auto``: any number (incl. none); ``none``: no call; ``required``: at least one."""
    names: tuple[str, ...] | None = None
    """Tools the calls may name; None: any (offered or not, as the parser reads them)."""
    parallel: bool = True
    """More than one call may be returned."""


AUTO = ToolChoice()
"""The default: whatever the model calls is returned."""


@dataclass(slots=True)
class Enforced:
    """A turn's reply after ``enforce``."""

    content: str
    """Text for the client."""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    """(name, arguments) per returned call."""
    dropped: int = 0
    """Parsed calls not returned (disallowed tool, or beyond the first when not parallel)."""
    violated: bool = False
    """The model did not follow the choice (see the module docstring)."""


def enforce(choice: ToolChoice, content: str, calls: list[tuple[str, Any]], text: str) -> Enforced:
    """Apply ``choice`` to a parse (``content``, ``calls``) of the model's ``text``."""
    if choice is AUTO or (choice.mode == "auto" and choice.names is None and (choice.parallel or len(calls) < 2)):
        return Enforced(content, list(calls))
    if choice.mode == "none":
        if calls:
            return Enforced(text, [], dropped=len(calls), violated=True)
        return Enforced(content, [])
    kept = [c for c in calls if choice.names is None or c[0] in choice.names]
    off_list = len(calls) - len(kept)
    if not choice.parallel and len(kept) > 1:
        kept = kept[:1]
    dropped = len(calls) - len(kept)
    violated = off_list > 0 or (choice.mode == "required" and not kept)
    if calls and not kept:
        return Enforced(text, [], dropped=dropped, violated=violated)
    return Enforced(content, kept, dropped=dropped, violated=violated)


def _offered(tools: list[dict[str, Any]] | None) -> list[str]:
    return [str(t["function"]["name"]) for t in tools or ()]


_LISTED = 20
"""Most offered tool names an error message lists."""


def _named(name: Any, tools: list[dict[str, Any]] | None, param: str) -> str:
    if not isinstance(name, str) or not name:
        raise bad_request(f"'{param}' must name a tool with a non-empty string", param=param.split(".")[0])
    offered = _offered(tools)
    if name not in offered:
        # Client strings are quoted cut short: the message must stay small whatever was sent.
        listed = ", ".join(short_repr(n) for n in offered[:_LISTED]) + (", ..." if len(offered) > _LISTED else "")
        raise bad_request(
            f"'{param}' names the tool {short_repr(name)}, which is not among the request's tools "
            f"({listed or 'none offered'}); offer it in 'tools' or choose another",
            param=param.split(".")[0],
        )
    return name


def _parallel(body: dict[str, Any]) -> bool:
    v = body.get("parallel_tool_calls")
    if v is None:
        return True
    if not isinstance(v, bool):
        raise bad_request(
            f"'parallel_tool_calls' must be true or false, got {preview(v)}", param="parallel_tool_calls"
        )
    return v


def _needs_tools(mode: str, tools: list[dict[str, Any]] | None) -> None:
    if not tools:
        raise bad_request(
            f"'tool_choice' is {mode!r} but the request offers no tools; send 'tools' or drop 'tool_choice'",
            param="tool_choice",
        )


def openai_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> ToolChoice:
    """``tool_choice`` and ``parallel_tool_calls`` of an OpenAI body (chat completions or Responses).

    Accepted: ``"auto"``, ``"none"``, ``"required"``, ``{"type": "function", "function":
    {"name": N}}`` (chat) or ``{"type": "function", "name": N}`` (Responses), and
    ``{"type": "allowed_tools", ...}`` with ``mode`` and ``tools`` (at the top level, as
    Responses writes it, or under ``allowed_tools``, as chat does). ``tools`` are the
    request's tools in chat-template form.
    """
    parallel = _parallel(body)
    v = body.get("tool_choice")
    if v is None or v == "auto":
        return AUTO if parallel else ToolChoice(parallel=False)
    if v == "none":
        return ToolChoice("none", parallel=parallel)
    if v == "required":
        _needs_tools("required", tools)
        return ToolChoice("required", parallel=parallel)
    if not isinstance(v, dict):
        raise bad_request(
            f"'tool_choice' must be 'none', 'auto', 'required' or an object naming a function, got {preview(v, 60)}",
            param="tool_choice",
        )
    kind = v.get("type")
    if kind == "function":
        _needs_tools("function", tools)
        fn = v.get("function")
        wanted = fn.get("name") if isinstance(fn, dict) else v.get("name")
        name = _named(wanted, tools, "tool_choice.function.name")
        return ToolChoice("required", (name,), parallel)
    if kind == "allowed_tools":
        _needs_tools("allowed_tools", tools)
        spec = v.get("allowed_tools", v)
        mode = spec.get("mode") if isinstance(spec, dict) else None
        listed = spec.get("tools") if isinstance(spec, dict) else None
        if mode not in ("auto", "required") or not isinstance(listed, list) or not listed:
            raise bad_request(
                "'tool_choice' of type 'allowed_tools' needs 'mode' ('auto' or 'required') and a non-empty "
                "'tools' list of {'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        names = []
        for j, t in enumerate(listed):
            fn = t.get("function") if isinstance(t, dict) else None
            wanted = fn.get("name") if isinstance(fn, dict) else (t.get("name") if isinstance(t, dict) else None)
            names.append(_named(wanted, tools, f"tool_choice.tools[{j}].name"))
        return ToolChoice(mode, tuple(dict.fromkeys(names)), parallel)
    raise bad_request(
        f"'tool_choice' of type {preview(kind)} is not supported; use 'none', 'auto', 'required', "
        "{'type': 'function', ...} or {'type': 'allowed_tools', ...}",
        param="tool_choice",
    )


_ANTHROPIC_KEYS = {"type", "name", "disable_parallel_tool_use", "cache_control"}


def anthropic_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> ToolChoice:
    """``tool_choice`` of an Anthropic messages body: ``{"type": "auto" | "any" | "tool" | "none",
    "name": ..., "disable_parallel_tool_use": ...}``."""
    v = body.get("tool_choice")
    if v is None:
        return AUTO
    if not isinstance(v, dict):
        raise bad_request(
            f"'tool_choice' must be an object such as {{'type': 'auto'}}, got {preview(v)}",
            param="tool_choice",
        )
    extra = set(v) - _ANTHROPIC_KEYS
    if extra:
        raise bad_request(f"'tool_choice' has unknown keys {key_list(extra)}", param="tool_choice")
    kind = v.get("type")
    single = v.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise bad_request("'tool_choice.disable_parallel_tool_use' must be true or false", param="tool_choice")
    parallel = not single
    if kind == "none":
        if single is not None:
            raise bad_request("'tool_choice' of type 'none' takes no 'disable_parallel_tool_use'", param="tool_choice")
        return ToolChoice("none")
    if kind == "auto":
        return AUTO if parallel else ToolChoice(parallel=False)
    if kind == "any":
        _needs_tools("any", tools)
        return ToolChoice("required", parallel=parallel)
    if kind == "tool":
        _needs_tools("tool", tools)
        return ToolChoice("required", (_named(v.get("name"), tools, "tool_choice.name"),), parallel)
    raise bad_request(
        f"'tool_choice.type' must be 'auto', 'any', 'tool' or 'none', got {preview(kind)}", param="tool_choice"
    )
