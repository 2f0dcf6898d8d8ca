"""The certifier's battery: synthetic conversations, written in the form chat templates take.

Defines:

- ``Case``: one conversation (messages with the assistant turns the model is to write), the
  tools offered, the template variables sent, and whether the client sends reasoning back.
- ``battery``: the cases for a template: plain multi-turn, system prompt, tools offered and
  called, parallel calls, tool results, a new question after a tool loop, long history,
  unicode, and, where the template reasons, reasoning sent back and not, and switched off.
- ``with_call_ids``: a case whose call ids are the ones a model writes itself (Kimi K2's
  ``functions.NAME:N``: its template writes the id, and the name only inside it).

Why these: each is a way a template may render history differently from what the model
generated (dropped reasoning, re-rendered tool calls, a system prompt moved, a turn closed
with another token), which is what makes a recorded trace differ from what an inference
server would feed the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["TOOLS", "Case", "battery", "with_call_ids"]

SYSTEM = "You are a careful assistant. Answer briefly."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "The expression."}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
]
"""The tools the tool cases offer (OpenAI form)."""


@dataclass(frozen=True)
class Case:
    """One synthetic conversation the certifier drives through the gateway."""

    name: str
    """Short name, shown in the table and named when training refuses."""
    what: str
    """What the case exercises, one line."""
    messages: tuple[dict[str, Any], ...]
    """The whole conversation: the client sends every message up to each assistant turn, and
    the model writes each assistant turn (tool-call arguments as dicts, reasoning as
    ``reasoning_content``)."""
    tools: tuple[dict[str, Any], ...] = ()
    """Tools offered on every request (none when empty)."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """``chat_template_kwargs`` sent on every request (a reasoning switch)."""
    echo_reasoning: bool = True
    """The client sends the reasoning it got back with the assistant message."""


def _call(name: str, args: dict[str, Any], ident: str) -> dict[str, Any]:
    # Ids are 9 letters or digits: the one form every template accepts (Mistral's refuse others).
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": args}}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _answer(text: str, reasoning: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _calling(*calls: dict[str, Any], reasoning: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": list(calls)}
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _result(ident: str, name: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": ident, "name": name, "content": text}


_SYS = {"role": "system", "content": SYSTEM}
_CALC = _call("calculator", {"expression": "12*7"}, "call00001")
_CALC2 = _call("calculator", {"expression": "84+5"}, "call00002")
_WEATHER = _call("get_weather", {"city": "Paris", "days": 2}, "call00003")


def _tool_loop(reasoning: bool) -> list[dict[str, Any]]:
    r = (lambda text: text) if reasoning else (lambda text: "")
    return [
        _SYS,
        _user("What is 12*7, plus 5?"),
        _calling(_CALC, reasoning=r("Multiply first.")),
        _result("call00001", "calculator", "84"),
        _calling(_CALC2, reasoning=r("Now add 5.")),
        _result("call00002", "calculator", "89"),
        _answer("The answer is 89.", r("Done.")),
        _user("And what is 2+2?"),
        _answer("4.", r("Easy.")),
    ]


def battery(*, reasoning: bool, switch: str | None) -> list[Case]:
    """The cases for a template.

    Args:
        reasoning: The gateway splits reasoning off the model's turns (a reasoning parser).
        switch: The template's reasoning switch (``enable_thinking``, ``thinking``), if any.
    """
    tools = tuple(TOOLS)
    on = {switch: True} if switch else {}
    long_history: list[dict[str, Any]] = [_SYS]
    for n in range(12):
        long_history += [_user(f"Step {n}: what comes after {n}?"), _answer(f"{n + 1} comes after {n}.")]
    cases = [
        Case("plain", "two user turns, no system prompt", (
            _user("Hi there!"), _answer("Hello! How can I help?"), _user("Say bye."), _answer("Bye."),
        ),),
        Case("system", "a system prompt, two user turns", (
            _SYS, _user("Name a colour."), _answer("Blue."), _user("Another one."), _answer("Green."),
        )),
        Case("tools_unused", "tools offered, answered without a call", (
            _SYS, _user("Say hello."), _answer("Hello."), _user("Again."), _answer("Hello again."),
        ), tools),
        Case("tool_call", "one call, its result, the answer", (
            _SYS, _user("What is 12*7?"), _calling(_CALC), _result("call00001", "calculator", "84"),
            _answer("12*7 is 84."),
        ), tools),
        Case("parallel_calls", "two calls in one turn, both results, the answer", (
            _SYS, _user("What is 12*7, and the weather in Paris?"), _calling(_CALC, _WEATHER),
            _result("call00001", "calculator", "84"), _result("call00003", "get_weather", "Sunny, 21 C"),
            _answer("84; sunny in Paris."),
        ), tools),
        Case("new_question", "two tool rounds, the answer, then a new question", tuple(_tool_loop(False)), tools),
        Case("long_history", "a system prompt and twelve exchanges", tuple(long_history)),
        Case("unicode", "accents, CJK, emoji and symbols in every role", (
            _SYS, _user("Ça va? 你好 🙂 — what is √81 × 2?"),
            _calling(_call("calculator", {"expression": "√81 × 2 — ünïcödé"}, "call00001")),
            _result("call00001", "calculator", "18 ✓ (résultat)"),
            _answer("C'est 18 🙂 — 十八."), _user("Merci ✨"), _answer("De rien! 不客气。"),
        ), tools),
    ]
    if reasoning:
        cases += [
            Case("reasoning_sent_back", "reasoning on every turn of a tool loop and a new question, "
                 "sent back by the client", tuple(_tool_loop(True)), tools, on),
            Case("reasoning_not_sent_back", "the same, the client dropping the reasoning it got",
                 tuple(_tool_loop(True)), tools, on, echo_reasoning=False),
        ]
    if switch:
        cases.append(Case("reasoning_off", f"{switch}=false: a tool loop and a new question",
                          tuple(_tool_loop(False)), tools, {switch: False}))
    return cases


def with_call_ids(case: Case, form: Callable[[str, int], str]) -> Case:
    """``case`` with each call's id replaced by ``form(name, n)``, n counting the conversation's
    calls from 0, in its tool results too: the ids a model that writes its own (``kimi_k2``)
    would have written."""
    renamed: dict[str, str] = {}
    for message in case.messages:
        for call in message.get("tool_calls") or ():
            renamed.setdefault(call["id"], form(call["function"]["name"], len(renamed)))

    def one(message: dict[str, Any]) -> dict[str, Any]:
        out = dict(message)
        if "tool_calls" in out:
            out["tool_calls"] = [{**c, "id": renamed[c["id"]]} for c in out["tool_calls"]]
        if out.get("tool_call_id") in renamed:
            out["tool_call_id"] = renamed[out["tool_call_id"]]
        return out

    return replace(case, messages=tuple(one(m) for m in case.messages))
