"""The certifier's independent side: transformers' ``apply_chat_template`` and what the model writes.

Defines:

- ``Reference``: the conversation a client sent, in the form the template takes, rendered
  with the tokenizer's public ``apply_chat_template`` (not the gateway's renderer) and encoded.
- ``Reference.written``: the tokens a model trained on this template writes for an assistant
  message: what the template itself writes for that message after the generation prompt,
  ended by an end-of-turn id, so the tool calls and reasoning it writes round-trip.
- ``first_difference``: the first differing token of two sequences (``TokenDiff``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from core.gateway.certify.report import TokenDiff

__all__ = ["Reference", "Unwritable", "first_difference"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Reference:
    """Renders conversations with ``apply_chat_template`` and encodes them without the gateway."""

    def __init__(self, tokenizer: Any, kwargs: dict[str, Any], end_of_turn: Sequence[int]) -> None:
        """Args:
        tokenizer: The model's tokenizer (with its chat template).
        kwargs: The gateway's ``chat_template_kwargs``.
        end_of_turn: The ids that stop generation.
        """
        self.tokenizer = tokenizer
        self.kwargs = dict(kwargs)
        self.end_of_turn = tuple(end_of_turn)
        self.specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
        for ident, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                self.specials.add(int(ident))
        self.special_texts = sorted({self.decode([i]) for i in self.specials}, key=len, reverse=True)
        self.string_arguments = self._wants_string_arguments()
        self.think = False
        """The gateway splits ``<think>`` reasoning (``written`` writes it as the model does)."""

    def _wants_string_arguments(self) -> bool:
        """Whether the template refuses dict arguments (it concatenates them as text)."""
        call = {"id": "call00001", "type": "function", "function": {"name": "f", "arguments": {"k": "v"}}}
        chat = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        try:
            self.tokenizer.apply_chat_template(chat, tokenize=False, **self.kwargs)
        except Exception:
            return True
        return False

    def form(self, message: dict[str, Any]) -> dict[str, Any]:
        """A message as the template takes it: content text, arguments as dicts (or JSON text
        for a template that wants text), reasoning under both keys templates read."""
        out = {k: v for k, v in message.items() if v is not None}
        if message.get("content") is None:
            out["content"] = ""
        reasoning = out.pop("reasoning_content", None)
        if reasoning:
            out["reasoning_content"] = out["thinking"] = reasoning
        calls = []
        for call in out.get("tool_calls") or ():
            fn = dict(call["function"])
            args = fn.get("arguments")
            if isinstance(args, str) and not self.string_arguments:
                fn["arguments"] = json.loads(args)
            elif not isinstance(args, str) and self.string_arguments:
                fn["arguments"] = json.dumps(args, ensure_ascii=False)
            calls.append({**call, "function": fn})
        if calls:
            out["tool_calls"] = calls
        return out

    def text(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], extra: dict[str, Any], *,
        generation: bool,
    ) -> str:
        """The template's text for ``messages``."""
        kwargs = {**self.kwargs, **extra}
        return str(self.tokenizer.apply_chat_template(
            [self.form(m) for m in messages], tools=list(tools) or None, tokenize=False,
            add_generation_prompt=generation, **kwargs,
        ))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token text maps to its id; nothing added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def _cut(self, text: str, at: int) -> int:
        """``at``, moved back to the start of a special token it falls inside."""
        for special in self.special_texts:
            start = text.rfind(special, 0, at + len(special) - 1)
            if start >= 0 and start < at < start + len(special):
                return start
        return at

    def round_trips(self, text: str) -> bool:
        """The tokenizer encodes ``text`` without losing a character."""
        return self.decode(self.encode(text)) == text

    def writes_calls(
        self, history: Sequence[dict[str, Any]], assistant: dict[str, Any], tools: Sequence[dict[str, Any]],
        extra: dict[str, Any],
    ) -> bool:
        """Whether the template writes any of ``assistant``'s tool calls when it follows ``history``
        (DeepSeek R1's writes none: it renders calls only for a message whose content is None)."""
        prompt = self.text(history, tools, extra, generation=True)
        full = self.text([*history, assistant], tools, extra, generation=False)
        text = full[_common(prompt, full) :]
        return any(c["function"]["name"] in text for c in assistant.get("tool_calls") or ())

    def opener_stop(
        self, history: Sequence[dict[str, Any]], assistant: dict[str, Any], following: dict[str, Any],
        tools: Sequence[dict[str, Any]], extra: dict[str, Any],
    ) -> int | None:
        """The end-of-turn id the template writes first after ``assistant`` when ``following``
        comes next, where it writes no closer of its own: GLM's templates open the next message
        with ``<|observation|>`` or ``<|user|>``, the ids its model stops on. None otherwise."""
        alone = self.text([*history, assistant], tools, extra, generation=False)
        try:
            more = self.text([*history, assistant, following], tools, extra, generation=False)
        except Exception:  # the template refuses what follows: no opener to read
            return None
        if not more.startswith(alone):
            return None
        after = self.encode(more[len(alone) :])
        return after[0] if after and after[0] in self.end_of_turn else None

    def written(
        self, history: Sequence[dict[str, Any]], assistant: dict[str, Any], tools: Sequence[dict[str, Any]],
        extra: dict[str, Any], *, calls: str = "", stop: int | None = None,
    ) -> list[int]:
        """The tokens the model writes for ``assistant`` after ``history``'s generation prompt.

        What the template writes for the message in history, past the generation prompt
        (or past the part of it the history rendering shares: Qwen3 with thinking off
        prompts an empty ``<think>`` block its history leaves out). With ``think`` set, the
        gateway splits ``<think>`` reasoning; a template that drops the reasoning even from the last
        message (DeepSeek R1) gets it written as the model does, ``<think>\\nR\\n</think>\\n\\n``
        (without the opening tag when the prompt opened it). Cut after the first end-of-turn
        id; without one, a trailing special token (gpt-oss's ``<|end|>``) becomes the
        end-of-turn id the model stops on. ``calls``: the message's tool calls as the model
        writes them, for a template that writes none (``writes_calls``); put before the
        end-of-turn id. A message that changes how the template renders the turns before it
        (Kimi K2.5's final answer drops the reasoning of the tool loop before it) is written as
        the template writes it after its generation prompt. ``stop``: the id the model stops on when the template writes no
        end-of-turn id of its own after the message (``opener_stop``).
        """
        prompt = self.text(history, tools, extra, generation=True)
        full = self.text([*history, assistant], tools, extra, generation=False)
        text = full[self._cut(full, _common(prompt, full)) :]
        base = self.text(history, tools, extra, generation=False) if history else ""
        if _common(prompt, full) < len(base) and prompt.startswith(base) and prompt[len(base) :] in full:
            # The message re-renders the turns before it (Kimi K2.5 drops a tool loop's reasoning
            # once its final answer follows): the model writes the message's own text, after
            # the generation prompt, into the prompt it was served.
            header = prompt[len(base) :]
            text = full[full.rfind(header) + len(header) :]
        ids = self.encode(text)
        if self.think:
            reasoning = str(assistant.get("reasoning_content") or "")
            opened = prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)
            if reasoning and reasoning not in text and opened and text.startswith(THINK_CLOSE):
                ids = self.encode(reasoning) + ids  # history writes the block empty (DeepSeek V3.1)
            elif reasoning and reasoning not in text:
                ids = self.encode(("" if opened else THINK_OPEN + "\n") + reasoning + "\n" + THINK_CLOSE + "\n\n") + ids
            elif opened and THINK_CLOSE not in text:
                ids = self.encode("\n" + THINK_CLOSE + "\n\n") + ids
        at = next((i for i, t in enumerate(ids) if t in self.end_of_turn), None)
        if calls:
            ids = [*ids[: len(ids) if at is None else at], *self.encode(calls), *ids[len(ids) if at is None else at :]]
            at = next((i for i, t in enumerate(ids) if t in self.end_of_turn), None)
        if at is not None:
            if not _only_specials(self, ids[at + 1 :]):
                raise Unwritable(
                    f"the template writes this message past the end-of-turn token {self.decode(ids[at : at + 1])!r}: "
                    "the model cannot write it in one turn"
                )
            return ids[: at + 1]
        if stop is not None:
            return [*ids, stop]
        while ids and not self.decode(ids[-1:]).strip():  # trailing newlines after the closer
            ids = ids[:-1]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        end = eos if eos in self.end_of_turn else self.end_of_turn[0]
        if ids and ids[-1] in self.specials:
            ids = ids[:-1]
        return [*ids, end]


class Unwritable(ValueError):
    """The template writes an assistant message that no single generated turn can be (gpt-oss
    ends a turn at each call's ``<|call|>``, so two calls are two turns)."""


def _only_specials(ref: Reference, ids: Sequence[int]) -> bool:
    """Whether ``ids`` hold only special tokens and whitespace (a closer after the stop id)."""
    return not ref.decode([i for i in ids if i not in ref.specials]).strip()


def _common(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    return len(os.path.commonprefix([a, b]))


def first_difference(trace: Sequence[int], reference: Sequence[int], decode: Any) -> TokenDiff | None:
    """Where ``trace`` and ``reference`` first differ (None when equal)."""
    n = min(len(trace), len(reference))
    at = next((i for i in range(n) if trace[i] != reference[i]), n)
    if at == len(trace) == len(reference):
        return None
    a = trace[at] if at < len(trace) else None
    b = reference[at] if at < len(reference) else None
    return TokenDiff(
        index=at,
        trace_id=a,
        trace_text=decode([a]) if a is not None else "",
        reference_id=b,
        reference_text=decode([b]) if b is not None else "",
        before=decode(list(trace[max(0, at - 6) : at])),
    )
