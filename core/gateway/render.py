"""Rendering canonical messages to token ids with the model's own chat template.

Defines ``ChatRenderer``:

- ``render_prompt``: the whole conversation, for a session's first turn or a
  fresh start after the history diverged (cost grows with the history).
- ``render_continuation``: only the tokens that follow a generated turn the
  model was already served: the rest of the assistant closer (``<|im_end|>\\n``
  for ChatML, minus what the model emitted itself; GLM's templates write no
  closer and the model's stop token opens the next message) plus the new
  messages and the generation prompt. Its cost depends on the new messages only, which is
  what keeps an append-only turn's cost flat as the context grows.
- ``decode``, ``count``.
- ``min_tokens``: a lower bound on a text's token count from its length, so a
  prompt that cannot fit the context budget is refused before it is tokenized
  (tokenizing is the expensive step: seconds for megabytes).

How the tail is rendered without the history: the template is rendered on a
fixed two-message *anchor* conversation (``user``, ``assistant``; after the
conversation's own system message when it has one) with the same tools, once
with the new messages appended and once without; the tail text is the
difference, and the closer is what the template writes after the anchor's
assistant content. This works for every template whose rendering of a message
depends only on its neighbours (ChatML/Qwen, Llama 3, Hermes); a template that
fails the self-check (the anchor render is not a prefix: it rewrites what came
before, e.g. Mistral v3 moves the system prompt to the last user message) makes
the turn fall back to a full render and counts it, unless the template writes
the anchor's assistant content right after the generation prompt once more
messages follow and the turn neither reasoned nor wrote a think block (Qwen3
writes an empty think block into the last assistant message only).

Tool calls: after a turn that called tools, the tail is rendered incrementally only
when the template writes the calls in history (DeepSeek R1's drops them: the served
tokens hold calls its rendering does not, so the history is rendered whole).

Reasoning: after a turn whose reasoning the client sent back, the anchor's
assistant message carries reasoning too, and the tail is rendered
incrementally only when the template writes that reasoning where the model
generated it (the anchor render holds it and stays a prefix). A template that
drops past reasoning (Qwen3 after a new user message, DeepSeek R1 always)
raises ``TailUnsupported``, so the gateway renders the history as the template
does and the turn starts a new row.

Tool-call arguments: canonical arguments are dicts; a template that
concatenates them as strings (DeepSeek V3) gets them as JSON text
(``string_arguments``, probed once at start).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.gateway.pieces import piece_encoder

__all__ = ["ChatRenderer", "InvalidText", "PromptTooLong", "ServedTurn", "TailUnsupported", "TemplateRefused"]

_ANCHOR_USER = "\u2063tracerl-anchor-user\u2063"
_ANCHOR_ASSISTANT = "\u2063tracerl-anchor-assistant\u2063"
_ANCHOR_REASONING = "\u2063tracerl-anchor-reasoning\u2063"
_ANCHOR_ARGUMENT = "tracerl-anchor-argument-5f0c2e"
"""ASCII: templates may ``tojson`` the arguments with ASCII escapes."""

ANCHOR_CACHE_ENTRIES = 64
"""Most tool sets whose anchor render is cached (least recently used dropped first)."""
ANCHOR_CACHE_CHARS = 4_000_000
"""Most characters of anchor text cached in all (an anchor holds its tools' rendering)."""
_ANCHOR_VARIANTS = 4
"""Tool sets with the same tool names kept side by side (e.g. different descriptions)."""
_BATCH_ENCODE_CHARS = 16_384
"""Texts longer than this are encoded with ``encode_batch``, which releases the GIL."""
_PROBE = "Hello, world!\n\n  two  spaces\ttab\r\nline ünïcödé 中文 🙂 {\"k\": [1, 2.5]} <tag> end."
"""Text a tokenizer must round-trip for ``min_tokens`` to trust its vocabulary."""


class TailUnsupported(Exception):
    """The template cannot be rendered incrementally for this tail; render the whole history."""


class PromptTooLong(Exception):
    """The rendered prompt cannot fit the token limit it was rendered for (found before tokenizing)."""

    def __init__(self, at_least: int) -> None:
        super().__init__(f"the prompt has at least {at_least} tokens")
        self.at_least = at_least


class TemplateRefused(ValueError):
    """The chat template raised on these messages (its ``raise_exception``, or a type it cannot handle)."""


class InvalidText(ValueError):
    """The rendered text holds a lone UTF-16 surrogate, which no tokenizer encodes."""


def _check_unicode(text: str, exc: Exception) -> None:
    """Raise ``InvalidText`` when the tokenizer's failure ``exc`` comes from a lone surrogate."""
    from core.gateway.safejson import valid_unicode

    if not valid_unicode(text):
        raise InvalidText("the text holds a lone UTF-16 surrogate") from exc


_CHUNK_CHARS = 32_768
"""Without a trusted length bound, long texts are counted in pieces this long first."""


def _longest_model_token(tokenizer: Any) -> int | None:
    """Length of the longest string of a fast tokenizer's model vocabulary, read id by id;
    None when there is no backend or its ids have holes (the caller reads ``get_vocab()``).

    Why not ``get_vocab()``: it builds a dict of the whole vocabulary (Qwen3's 151k
    strings: 26 MB at once, the gateway's peak memory after the tokenizer load).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    if backend is None or model is None:
        return None
    longest = 0
    to_token = model.id_to_token
    for i in range(int(backend.get_vocab_size(with_added_tokens=False))):
        token = to_token(i)
        if token is None:
            return None
        longest = max(longest, len(token))
    return longest


def _longest_token_chars(tokenizer: Any) -> int | None:
    """Length of the longest vocabulary (or added-token) string; None when unknown."""
    try:
        longest = _longest_model_token(tokenizer)
        lengths = [len(x) for x in tokenizer.get_vocab()] if longest is None else [longest]
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        lengths += [len(str(getattr(t, "content", t))) for t in added.values()]
    except Exception:
        return None
    return max(1, *lengths) if lengths else None


def _max_token_chars(tokenizer: Any, backend: Any, longest: int | None) -> int | None:
    """Most characters of text one token can cover; None when that cannot be trusted.

    Every vocabulary string is at least as long as the text its token covers:
    byte-level BPE writes one character per byte, SentencePiece one per
    character (``▁`` for a space), byte-fallback pieces (``<0xE4>``) six for
    one byte, added tokens their literal text. So a text of n characters (after
    the tokenizer's normalizer) needs at least ceil(n / longest string) tokens,
    provided the tokenizer covers every character, which the round-trip probe checks
    (a tokenizer that drops whitespace or characters fails it and gets no bound).
    ``longest`` is that longest string (``_longest_token_chars``).
    """
    if longest is None:
        return None
    try:
        if backend is not None:
            ids = backend.encode(_PROBE, add_special_tokens=False).ids
            back = backend.decode(ids, skip_special_tokens=False)
        else:
            back = tokenizer.decode(tokenizer.encode(_PROBE, add_special_tokens=False), skip_special_tokens=False)
    except Exception:
        return None
    return longest if back == _PROBE else None


@dataclass(frozen=True, slots=True)
class ServedTurn:
    """The generated assistant turn a continuation follows, as the model was served it."""

    closer: str
    """Text of the stop token the model ended its turn with (``"<|im_end|>"``), or ``""`` when
    it was cut off. When the template closes the turn with something else, the served tokens
    are not its rendering: ``TailUnsupported`` (unless ``keep``)."""
    reasoning: bool = False
    """The turn carried reasoning and the client sent it back: the template must render it in
    history (else ``TailUnsupported``)."""
    calls: tuple[str, ...] = ()
    """Names of the turn's tool calls. When the plain anchor fails, an anchor that makes these
    calls is tried (gpt-oss renders a tool-call turn unlike a plain answer, and names the call
    in the tool results)."""
    thought: bool = False
    """The model wrote a think block, even an empty one: a template that renders the anchor
    differently once more messages follow is then not trusted to write the turn as served."""
    system: str | None = None
    """The conversation's system prompt (the content of its first message when that is a
    system message), or None. The anchor conversation starts with it, so a template that
    writes it somewhere that moves as messages follow (Mistral v3 puts it in front of the
    *last* user message) fails the prefix check and the history is rendered whole, and a
    template whose later rendering reads it (a reasoning switch in the system prompt) renders
    the tail as it would after the real one."""


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
                "prompts with the model's template (set tokenizer.chat_template; a Mistral tokenizer loaded "
                "in Mistral's format gets one from core.tokenizer.with_chat_template, with mistral-common "
                "installed: pip install 'tracerl[mistral]')"
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
        # Anchor renders by tool names; each entry (tools, anchor text, closer) is matched by
        # equality, so equal tools sent as new objects on every request hit. Bounded in entries
        # and characters: a client cycling through tool sets cannot grow it.
        self._anchor_cache: OrderedDict[tuple[str, ...] | None, list[tuple[Any, str, str]]] = OrderedDict()
        self._anchor_chars = 0
        self._anchor_lock = threading.Lock()  # large renders run in worker threads
        self._drops_calls: dict[tuple[str, ...] | None, bool] = {}
        """``_writes_calls``' answers by anchor key (bounded by ``ANCHOR_CACHE_ENTRIES``)."""
        longest = _longest_token_chars(tokenizer)
        self.max_token_chars: int | None = _max_token_chars(tokenizer, self._backend, longest)
        """Most characters one token covers (``min_tokens``' divisor); None: no length bound."""
        self._longest_token = longest or 1
        self._pieces = piece_encoder(self._backend) if self._backend is not None else None
        """Encodes short texts as the tokenizer does, about five times faster (``core.gateway.pieces``);
        None: the tokenizer encodes everything."""
        normalizer = getattr(self._backend, "normalizer", None)
        self._normalize: Any = getattr(normalizer, "normalize_str", None)
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
        self.reasoning_key = (
            "thinking" if "reasoning_content" not in self.template and "message.thinking" in self.template else None
        )
        """The key the template reads reasoning from when it is not ``reasoning_content``
        (gpt-oss: ``thinking``); canonical messages are renamed for it."""
        self.string_arguments = False
        """Tool-call arguments are rendered as JSON text: the template refuses dicts (``_probe_arguments``)."""
        self.string_arguments = self._probe_arguments()

    def _probe_arguments(self) -> bool:
        """Whether the template needs tool-call arguments as JSON strings: it refuses a
        dict (DeepSeek V3 concatenates ``arguments`` to text) and accepts the string."""
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"k": "v"}}}
        chat: list[dict[str, Any]] = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        with contextlib.suppress(TemplateRefused):  # refused: try the arguments as a string
            self.render_text(chat, None, add_generation_prompt=False)
            return False
        self.string_arguments = True
        try:
            self.render_text(chat, None, add_generation_prompt=False)
            return True
        except TemplateRefused:
            return False
        finally:
            self.string_arguments = False

    def with_kwargs(self, extra: dict[str, Any]) -> ChatRenderer:
        """A renderer whose template also sees ``extra`` (a request's ``enable_thinking`` ...).

        Shares this one's tokenizer, compiled template and length bound (the costly
        parts); has its own anchor cache, since the variables may change the anchor.
        """
        clone = copy.copy(self)
        clone.kwargs = {**self.kwargs, **extra}
        clone._anchor_cache = OrderedDict()
        clone._anchor_chars = 0
        clone._anchor_lock = threading.Lock()
        clone._drops_calls = {}
        return clone

    # ------------------------------------------------------------------ text

    def render_text(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, *, add_generation_prompt: bool
    ) -> str:
        """The template's text for ``messages``."""
        if self.string_arguments:
            messages = [_string_arguments(m) for m in messages]
        if self.reasoning_key is not None:
            key = self.reasoning_key
            messages = [
                {(key if k == "reasoning_content" else k): v for k, v in m.items()} if "reasoning_content" in m else m
                for m in messages
            ]
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
                try:
                    template.environment.handle_exception()  # re-raises with the template's line numbers
                except Exception as exc:
                    raise TemplateRefused(f"{type(exc).__name__}: {exc}") from exc
                raise
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    list(messages), tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                    **self.kwargs,
                )
            )
        except Exception as exc:
            raise TemplateRefused(f"{type(exc).__name__}: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings map to their ids; no BOS added).

        Long texts go through ``encode_batch``, which releases the GIL while the
        Rust encoder runs (``encode`` holds it), so a long prompt tokenized in a
        worker thread does not stall the event loop. Shorter ones (a turn's new
        messages) go through the piece encoder when the tokenizer has one
        (``core.gateway.pieces``: the same ids, about a fifth of the CPU).
        """
        try:
            if self._backend is not None:
                if len(text) > _BATCH_ENCODE_CHARS:
                    return list(self._backend.encode_batch([text], add_special_tokens=False)[0].ids)
                if self._pieces is not None:
                    return self._pieces.encode(text)
                return list(self._backend.encode(text, add_special_tokens=False).ids)
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        except Exception as exc:
            _check_unicode(text, exc)
            raise

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))`` from the text's length alone (0 without a bound)."""
        if self.max_token_chars is None:
            return 0
        return -(-len(text) // self.max_token_chars)

    def _check_fits(self, text: str, limit: int | None, already: int = 0) -> None:
        """Raise ``PromptTooLong`` when ``text`` needs more than ``limit`` tokens for certain."""
        if limit is None:
            return
        if self.max_token_chars is None:
            if len(text) > max(4 * _CHUNK_CHARS, 8 * limit):
                self._check_fits_in_pieces(text, limit, already)
            return
        if len(text) <= limit * self.max_token_chars:
            return
        if self._normalize is not None:  # e.g. NFC may merge characters; measure what is tokenized
            text = self._normalize(text)
        least = self.min_tokens(text)
        if least > limit:
            raise PromptTooLong(already + least)

    def _check_fits_in_pieces(self, text: str, limit: int, already: int) -> None:
        """``_check_fits`` for a tokenizer without a trusted length bound (one that drops
        or fuses characters it does not know): count the text piece by piece and refuse
        once the pieces read so far need far more than ``limit`` tokens, so a huge hostile
        body costs a few pieces of tokenizing, not all of it.

        A token can span a cut between pieces, so every cut may save up to the longest
        token's length in tokens; that is taken off, and the refusal waits for twice the
        limit, so a prompt near the limit is always left to the exact count.
        """
        total = 0
        for cuts, start in enumerate(range(0, len(text), _CHUNK_CHARS), start=1):
            total += len(self.encode(text[start : start + _CHUNK_CHARS]))
            least = total - cuts * self._longest_token
            if least > 2 * limit:
                raise PromptTooLong(already + least)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    # ------------------------------------------------------------------ ids

    def render_prompt(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, *, limit: int | None = None
    ) -> list[int]:
        """Token ids of the whole conversation plus the generation prompt.

        Raises:
            PromptTooLong: the text needs more than ``limit`` tokens (checked before tokenizing).
            TemplateRefused: the template raised on these messages.
        """
        text = self.render_text(messages, tools, add_generation_prompt=True)
        self._check_fits(text, limit)
        return self.encode(text)

    def count(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, *, limit: int | None = None
    ) -> int:
        """Prompt tokens the conversation costs (what ``count_tokens`` answers).

        Long texts are counted without building the id list (``len`` of the
        Rust encoding): converting a million ids to Python ints holds the GIL.

        Raises:
            PromptTooLong: the text needs more than ``limit`` tokens (checked before tokenizing).
            TemplateRefused: the template raised on these messages.
        """
        text = self.render_text(messages, tools, add_generation_prompt=True)
        self._check_fits(text, limit)
        if self._backend is not None and len(text) > _BATCH_ENCODE_CHARS:
            try:
                return len(self._backend.encode_batch([text], add_special_tokens=False)[0])
            except Exception as exc:
                _check_unicode(text, exc)
                raise
        return len(self.encode(text))

    def anchor_chars(
        self, tools: list[dict[str, Any]] | None, *, default: int, reasoning: bool = False, system: str | None = None
    ) -> int:
        """Characters of the cached anchor render for ``tools`` after ``system`` (what every
        tail render re-renders), or ``default`` when it is not cached."""
        if not tools and system is None:
            return 0
        with self._anchor_lock:
            for entry in self._anchor_cache.get(self._key(tools, reasoning, system=system is not None), ()):
                if same_json(entry[0], (tools, system)):
                    return len(entry[1])
        return default

    def anchor_cache_size(self) -> tuple[int, int]:
        """(cached tool sets, cached characters) of the anchor cache."""
        return sum(len(v) for v in self._anchor_cache.values()), self._anchor_chars

    def _anchor(
        self, tools: list[dict[str, Any]] | None, reasoning: bool = False, call: tuple[str, ...] = (),
        system: str | None = None,
    ) -> tuple[str, str]:
        """(anchor text, closer) for ``tools`` (and ``system``), cached by tool names and matched
        by ``same_json`` (equal, keys in the same order: what renders the same), never by ``==``.

        ``call``: the anchor's assistant message calls these tools (the served turn's, so a
        template that names the last call in the tool results that follow renders them
        right); its closer is what the template writes after the last call's JSON
        arguments (``<|call|>`` for gpt-oss). ``system``: the anchor starts with this
        system prompt (``ServedTurn.system``).
        """
        key = self._key(tools, reasoning, call, system=system is not None)
        with self._anchor_lock:
            for entry in self._anchor_cache.get(key, ()):
                if same_json(entry[0], (tools, system)):
                    self._anchor_cache.move_to_end(key)
                    return entry[1], entry[2]
        text = self.render_text(_anchor_messages(reasoning, call, system), tools, add_generation_prompt=False)
        marker = _ANCHOR_ARGUMENT if call else _ANCHOR_ASSISTANT
        cut = text.rfind(marker)
        if cut < 0:
            raise TailUnsupported("the template drops assistant content")
        cut += len(marker)
        if call:  # past the arguments' closing brace (XML arguments: the tail cuts at the stop token)
            brace = text.find("}", cut)
            cut = cut if brace < 0 else brace + 1
        closer = text[cut:]
        if len(text) <= ANCHOR_CACHE_CHARS // 4:
            with self._anchor_lock:
                self._remember(key, ((tools, system), text, closer))
        return text, closer

    def _generation_prompt(self, tools: list[dict[str, Any]] | None, served: ServedTurn) -> str:
        """The anchor conversation up to its assistant turn, rendered with the generation prompt:
        what the model was served before it wrote that turn (cached with the anchors)."""
        key = ("\0generation", *(self._key(tools, system=served.system is not None) or ()))
        with self._anchor_lock:
            for entry in self._anchor_cache.get(key, ()):
                if same_json(entry[0], (tools, served.system)):
                    self._anchor_cache.move_to_end(key)
                    return entry[1]
        text = self.render_text(_anchor_messages(False, (), served.system)[:-1], tools, add_generation_prompt=True)
        if len(text) <= ANCHOR_CACHE_CHARS // 4:
            with self._anchor_lock:
                self._remember(key, ((tools, served.system), text, ""))
        return text

    @staticmethod
    def _key(
        tools: list[dict[str, Any]] | None, reasoning: bool = False, call: tuple[str, ...] = (), *, system: bool = False
    ) -> tuple[str, ...] | None:
        try:
            names = None if tools is None else tuple(str(t["function"]["name"]) for t in tools)
        except (KeyError, TypeError):
            names = ("\0unnamed",)
        if reasoning or call or system:
            return ("\0reasoning" if reasoning else "", "\0system" if system else "", "\0call", *call,
                    "\0tools", *(names or ()))
        return names

    def _remember(self, key: tuple[str, ...] | None, entry: tuple[Any, str, str]) -> None:
        bucket = self._anchor_cache.setdefault(key, [])
        self._anchor_cache.move_to_end(key)
        bucket.insert(0, entry)
        self._anchor_chars += len(entry[1])
        if len(bucket) > _ANCHOR_VARIANTS:
            self._anchor_chars -= len(bucket.pop()[1])
        while self._anchor_cache and (
            len(self._anchor_cache) > ANCHOR_CACHE_ENTRIES or self._anchor_chars > ANCHOR_CACHE_CHARS
        ):
            _, dropped = self._anchor_cache.popitem(last=False)
            self._anchor_chars -= sum(len(e[1]) for e in dropped)

    def render_continuation(
        self,
        tail: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        served: ServedTurn,
        *,
        limit: int | None = None,
        already: int = 0,
        keep: bool = False,
    ) -> list[int]:
        """Tokens to append after a served, generated assistant turn.

        Args:
            tail: Canonical messages after that assistant message (may be empty).
            tools: Tools offered on this request.
            served: What the served turn ended with, and whether it reasoned or called
                tools (``ServedTurn``).
            limit: Most tokens the continuation may have (checked before tokenizing).
            already: Tokens in front of the continuation (reported by ``PromptTooLong``).
            keep: Extend the served tokens even where the template renders the anchor
                differently once more messages follow (Qwen3 drops the empty ``<think>``
                block of a past turn): the tail is then what the template writes after
                the anchor's assistant content.

        Raises:
            TailUnsupported: the template does not render incrementally here, or drops
                the served turn's reasoning from history.
            PromptTooLong: the continuation needs more than ``limit`` tokens.
            TemplateRefused: the template raised on the tail itself.
        """
        if served.calls and not keep and not self._writes_calls(tools, served):
            raise TailUnsupported("the template drops the turn's tool calls from history")
        try:
            text = self._tail_text(tail, tools, served, keep=keep)
        except TailUnsupported:
            if not served.calls or keep or not served.closer:
                raise
            text = self._tail_text(tail, tools, served, keep=False, calls=served.calls)
        self._check_fits(text, limit, already)
        return self.encode(text)

    def _writes_calls(self, tools: list[dict[str, Any]] | None, served: ServedTurn) -> bool:
        """Whether the template writes a tool-call turn's calls into history (DeepSeek R1's
        drops them: it renders calls only for a message whose content is None, which no
        canonical message has). False only when it renders the anchor that makes the
        served turn's calls without their arguments; True when it writes them or refuses that
        anchor (Mistral's refuse its made-up call ids: the tail render decides as before)."""
        key = self._key(tools, served.reasoning, served.calls)
        found = self._drops_calls.get(key)
        if found is None:
            try:
                text = self.render_text(_anchor_messages(served.reasoning, served.calls), tools,
                                        add_generation_prompt=False)
            except TemplateRefused:
                return True
            found = _ANCHOR_ARGUMENT not in text
            with self._anchor_lock:
                if len(self._drops_calls) >= ANCHOR_CACHE_ENTRIES:
                    self._drops_calls.clear()
                self._drops_calls[key] = found
        return not found

    def _tail_text(
        self,
        tail: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        served: ServedTurn,
        *,
        keep: bool,
        calls: tuple[str, ...] = (),
    ) -> str:
        """``render_continuation``'s text, after a plain anchor or one that makes ``calls``.

        A template may render the anchor's assistant message differently when it is the
        last message: Qwen3's writes an empty think block into it, and only there. The tail
        is then still exact when, with more messages after it, the template writes the
        assistant content right after the generation prompt, where the model wrote it
        (``_generation_prompt``), and the turn neither reasoned nor wrote a think block.
        """
        emitted_closer, reasoning = served.closer, served.reasoning
        anchor = _anchor_messages(reasoning, calls, served.system)
        try:
            anchor_text, closer = self._anchor(tools, reasoning, calls, served.system)
            full = self.render_text([*anchor, *tail], tools, add_generation_prompt=True)
            if calls and emitted_closer and emitted_closer in closer:
                # What the template writes after the calls starts at the stop token the model
                # ended on (MiniMax M2 writes XML arguments: its anchor's closer starts at the
                # marker value, not after a closing brace).
                closer = closer[closer.index(emitted_closer) :]
        except TemplateRefused as exc:
            # The made-up anchor conversation may break a rule the real one keeps (a
            # template that wants a system message first): the full render decides.
            raise TailUnsupported(f"the template refuses the anchor conversation: {exc}") from exc
        if not full.startswith(anchor_text):
            at = full.find(_ANCHOR_ASSISTANT)
            in_place = not (reasoning or served.thought or calls) and full[:at] == self._generation_prompt(tools, served)
            if at < 0 or not (keep or in_place):
                raise TailUnsupported("the template renders the anchor differently when followed by more messages")
            # What the template writes after the assistant content: its closer, then the tail.
            closer = full[at + len(_ANCHOR_ASSISTANT) :]
            if emitted_closer and not closer.startswith(emitted_closer) and not keep:
                raise TailUnsupported(
                    f"the turn ended with {emitted_closer!r}, which the template does not write after it"
                )
            text = closer[len(emitted_closer) :] if emitted_closer and closer.startswith(emitted_closer) else closer
        else:
            if reasoning and _ANCHOR_REASONING not in anchor_text:
                raise TailUnsupported("the template drops the turn's reasoning from history")
            # What follows the assistant content: its closer, then the new messages. The stop
            # token the model ended on is usually the closer (<|im_end|>); GLM's templates write
            # none, and the model stops on the token that opens the next message
            # (<|observation|> before tool results, <|user|> before a question).
            text = closer + full[len(anchor_text) :]
            if emitted_closer and text.startswith(emitted_closer):
                text = text[len(emitted_closer) :]
            elif emitted_closer and not keep:
                # e.g. gpt-oss ends a final answer with <|return|> and writes <|end|> in history,
                # Llama 3.1 stops on <|eom_id|> where its template writes <|eot_id|>; GLM stopped
                # on <|user|> and tool results follow.
                raise TailUnsupported(
                    f"the turn ended with {emitted_closer!r}, which the template does not write after it"
                )
        return text


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` render the same: equal, with dict keys in the same order and
    the same types throughout (``==`` ignores key order and takes ``1`` for ``1.0`` and
    ``True``, which a template's ``tojson`` writes differently). The anchor cache is shared
    by every session of a renderer, so matching by ``==`` gave one client's anchor (its
    tools' JSON in its key order) to another client's session, whose tail then no longer
    extended its render: a second row (issue #29). Iterative: tools nest as deep as a
    request body may."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list | tuple):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def _anchor_messages(reasoning: bool, calls: tuple[str, ...] = (), system: str | None = None) -> list[dict[str, Any]]:
    """The made-up conversation a tail is rendered after (the conversation's ``system`` prompt
    first, when it has one; its assistant with reasoning or not, answering or making ``calls``)."""
    assistant: dict[str, Any] = {"role": "assistant", "content": "" if calls else _ANCHOR_ASSISTANT}
    if reasoning:
        assistant["reasoning_content"] = _ANCHOR_REASONING
    if calls:
        assistant["tool_calls"] = [
            {"id": f"call_anchor{i}", "type": "function", "function": {"name": name, "arguments": {"a": _ANCHOR_ARGUMENT}}}
            for i, name in enumerate(calls)
        ]
    head = [] if system is None else [{"role": "system", "content": system}]
    return [*head, {"role": "user", "content": _ANCHOR_USER}, assistant]


def _string_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with its tool calls' dict arguments as JSON text (for templates that want text)."""
    calls = message.get("tool_calls")
    if not calls or all(isinstance(c.get("function", {}).get("arguments"), str) for c in calls):
        return message
    import json

    out = []
    for call in calls:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            fn = {**fn, "arguments": json.dumps(args, ensure_ascii=False)}
        out.append({**call, "function": fn})
    return {**message, "tool_calls": out}
