"""Tool calls as a model writes them, for templates that do not write them into history.

Defines ``write_calls``: an assistant message's calls in the text format a tool parser reads.

Why: the certifier scripts the model by what the template writes for each assistant message.
A template that drops tool calls from history (DeepSeek R1's renders them only for a message
whose content is None) shows no call to copy, yet the model it belongs to still calls tools in
its format. The certifier then writes the calls as the resolved parser reads them, so the case
still checks what matters: the calls come back to the client, and the turn after them is
exactly the template's rendering (a new row, since that rendering leaves the calls out).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["write_calls"]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _calls(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for call in message.get("tool_calls") or ():
        args = call["function"]["arguments"]
        out.append((str(call["function"]["name"]), json.loads(args) if isinstance(args, str) else dict(args)))
    return out


def _hermes(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "\n".join(f"<tool_call>\n{_json({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


def _deepseek_v3(calls: list[tuple[str, dict[str, Any]]]) -> str:
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{_json(a)}\n```<｜tool▁call▁end｜>" for n, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _deepseek_v31(calls: list[tuple[str, dict[str, Any]]]) -> str:
    body = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{_json(a)}<｜tool▁call▁end｜>" for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _value(v: Any) -> str:
    return v if isinstance(v, str) else _json(v)


def _qwen3_coder(calls: list[tuple[str, dict[str, Any]]]) -> str:
    def one(name: str, args: dict[str, Any]) -> str:
        params = "".join(f"<parameter={k}>\n{_value(v)}\n</parameter>\n" for k, v in args.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    return "\n".join(one(n, a) for n, a in calls)


def _glm45(calls: list[tuple[str, dict[str, Any]]]) -> str:
    def one(name: str, args: dict[str, Any]) -> str:
        pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_value(v)}</arg_value>\n" for k, v in args.items())
        return f"<tool_call>{name}\n{pairs}</tool_call>"

    return "\n".join(one(n, a) for n, a in calls)


_WRITERS = {"hermes": _hermes, "qwen3": _hermes, "deepseek_v3": _deepseek_v3, "deepseek_v31": _deepseek_v31,
            "qwen3_coder": _qwen3_coder,
            "glm45": _glm45}


def write_calls(parser: str | None, message: dict[str, Any]) -> str | None:
    """The calls of ``message`` as text the ``parser`` reads; None for a parser without a writer."""
    writer = _WRITERS.get(parser or "")
    return None if writer is None else writer(_calls(message))
