"""Rendering canonical messages to token ids with the model's own chat template.

Defines ``ChatRenderer``:

- ``render_prompt``: the whole conversation, for a session's first turn or a
  fresh start after the history diverged (cost grows with the history).
- ``render_continuation``: only the tokens that follow a generated turn the
  model was already served: the rest of the assistant closer (``<|im_end|>\\n``
  for ChatML, minus what the model emitted itself) plus the new messages and
  the generation prompt. Its cost depends on the new messages only, which is
  what keeps an append-only turn's cost flat as the context grows.
- ``decode``, ``count``.

How the tail is rendered without the history: the template is rendered on a
fixed two-message *anchor* conversation (``user``, ``assistant``) with the same
tools, once with the new messages appended and once without; the tail text is
the difference, and the closer is what the template writes after the anchor's
assistant content. This works for every template whose rendering of a message
depends only on its neighbours (ChatML/Qwen, Llama 3, Hermes); a template that
fails the self-check (the anchor render is not a prefix) makes the session fall
back to full renders and counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ChatRenderer", "TailUnsupported"]

_ANCHOR_USER = "\u2063tracerl-anchor-user\u2063"
_ANCHOR_ASSISTANT = "\u2063tracerl-anchor-assistant\u2063"


class TailUnsupported(Exception):
    """The template cannot be rendered incrementally for this tail; render the whole history."""


class ChatRenderer:
    """Chat-template rendering and tokenization for one tokenizer (thread-compatible, no I/O)."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        """Bind a Hugging Face tokenizer.

        Args:
            tokenizer: A ``PreTrainedTokenizer(Fast)`` with a ``chat_template``.
            chat_template_kwargs: Extra template variables (``enable_thinking`` ...).

        Raises:
            ConfigError: the tokenizer has no chat template.
        """
        from core.errors import ConfigError

        self.tokenizer = tokenizer
        self.template: str | None = getattr(tokenizer, "chat_template", None)
        if not isinstance(self.template, str) or not self.template:
            raise ConfigError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; the gateway renders "
                "prompts with the model's template (set tokenizer.chat_template)"
            )
        self.kwargs = dict(chat_template_kwargs or {})
        for key in ("tokenize", "add_generation_prompt", "tools", "return_dict"):
            if key in self.kwargs:
                raise ConfigError(f"gateway.chat_template_kwargs may not set {key!r}; the gateway owns it")
        # The fast tokenizer's Rust backend: encode/decode without the Python wrapper's overhead.
        self._backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        self._specials: dict[str, Any] = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = getattr(tokenizer, name, None)
            if isinstance(value, str):
                self._specials[name] = value
        self.eos_token_id: int | None = getattr(tokenizer, "eos_token_id", None)
        self._anchor_cache: dict[int, tuple[Any, str, str]] = {}
        # transformers' own compiled template (same sandbox, filters and globals as
        # apply_chat_template) called directly: apply_chat_template's wrapper costs
        # ~100 us a call, more than the render itself.
        self._compiled: Any = None
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            self._compiled = _compile_jinja_template(self.template)
        except Exception:  # pragma: no cover - private helper moved: use the public path
            self._compiled = None
        # The template's globals (jinja's range/namespace/..., transformers' raise_exception,
        # strftime_now) flattened once: Template.render merges their ChainMap into a new dict
        # on every call, about a quarter of a tail render.
        self._globals: dict[str, Any] = dict(self._compiled.globals) if self._compiled is not None else {}

    # ------------------------------------------------------------------ text

    def render_text(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, *, add_generation_prompt: bool
    ) -> str:
        """The template's text for ``messages``."""
        template = self._compiled
        if template is not None:
            # What Template.render does, with the globals merged in advance (shared=True
            # passes the dict as the context's parent as is).
            variables = {
                **self._globals,
                **self._specials,
                **self.kwargs,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": add_generation_prompt,
            }
            try:
                context = template.new_context(variables, shared=True)
                return str(template.environment.concat(template.root_render_func(context)))
            except Exception:
                template.environment.handle_exception()  # re-raises with the template's line numbers
                raise
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
            )
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings map to their ids; no BOS added)."""
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    # ------------------------------------------------------------------ ids

    def render_prompt(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the whole conversation plus the generation prompt."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    def count(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        """Prompt tokens the conversation costs (what ``count_tokens`` answers)."""
        return len(self.render_prompt(messages, tools))

    def _anchor(self, tools: list[dict[str, Any]] | None) -> tuple[str, str]:
        """(anchor text, closer) for ``tools``, cached by the identity-and-equality of tools."""
        key = id(tools)
        hit = self._anchor_cache.get(key)
        if hit is not None and hit[0] == tools:
            return hit[1], hit[2]
        anchor = [
            {"role": "user", "content": _ANCHOR_USER},
            {"role": "assistant", "content": _ANCHOR_ASSISTANT},
        ]
        text = self.render_text(anchor, tools, add_generation_prompt=False)
        cut = text.rfind(_ANCHOR_ASSISTANT)
        if cut < 0:
            raise TailUnsupported("the template drops assistant content")
        closer = text[cut + len(_ANCHOR_ASSISTANT) :]
        if len(self._anchor_cache) > 256:
            self._anchor_cache.clear()
        # keep a reference to tools so id() stays unique while cached
        self._anchor_cache[key] = (tools, text, closer)
        return text, closer

    def render_continuation(
        self,
        tail: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        emitted_closer: str,
    ) -> list[int]:
        """Tokens to append after a served, generated assistant turn.

        Args:
            tail: Canonical messages after that assistant message (may be empty).
            tools: Tools offered on this request.
            emitted_closer: Text of the stop token the model ended its turn with
                (``"<|im_end|>"``), or ``""`` when it was cut off.

        Raises:
            TailUnsupported: the template does not render incrementally here.
        """
        anchor_text, closer = self._anchor(tools)
        anchor = [
            {"role": "user", "content": _ANCHOR_USER},
            {"role": "assistant", "content": _ANCHOR_ASSISTANT},
        ]
        full = self.render_text([*anchor, *tail], tools, add_generation_prompt=True)
        if not full.startswith(anchor_text):
            raise TailUnsupported("the template renders the anchor differently when followed by more messages")
        if emitted_closer and closer.startswith(emitted_closer):
            closer = closer[len(emitted_closer) :]
        return self.encode(closer + full[len(anchor_text) :])
