"""Token ids of ASCII text from cached pre-tokenizer pieces, equal to the tokenizer's own.

Defines:

- ``PieceEncoder``: ``encode(text)`` gives the ids ``backend.encode(text,
  add_special_tokens=False)`` gives, on a byte-level BPE tokenizer (Qwen, Llama 3,
  DeepSeek, gpt-oss, Mistral Tekken, Kimi, GLM): the ASCII text between added tokens
  through the piece cache, any other text between them by the tokenizer itself.
- ``piece_encoder(backend)``: the encoder for a ``tokenizers.Tokenizer``, or None
  when its pipeline is not one this module reproduces or the self-check fails.
- ``translate_pattern``: a pre-tokenizer regex (Oniguruma) as a Python ``re`` pattern
  that splits ASCII text the same way, or None.

Why: a turn's new text (about 140 tokens) cost the Rust tokenizer 220-370 us, most
of it in the pre-tokenizer's per-piece bookkeeping (offsets and alignments for
every piece), about a quarter of a turn's CPU. The same split by Python's ``re``
costs about 50 us, and the BPE of a piece (`` alpha``, ``12``) is looked up in a
cache filled by the tokenizer's own model, so this costs about a fifth.

Why it is exact: the tokenizer encodes text in fixed stages, and each is
reproduced only where it is the same function on ASCII text:

1. added tokens are split out first (leftmost-longest, non-normalized ones before
   normalized ones), which a regex of the tokens sorted longest first does;
   tokens with ``lstrip``/``rstrip``/``single_word`` are not reproduced. The text
   between them is encoded piece by piece, so a piece that is not ASCII is handed
   to the tokenizer alone and the rest below applies to ASCII pieces only;
2. the normalizer must be absent or Unicode normalization (NFC/NFD/NFKC/NFKD),
   the identity on ASCII;
3. the pre-tokenizer's regexes (``Split``, behaviour ``Isolated``, or ByteLevel's
   own) are translated for ASCII input: a Unicode property becomes its ASCII
   members (``\\p{L}`` is ``A-Za-z``: ASCII's categories are the same in every
   Unicode version) and ``re.ASCII`` makes ``\\s``, ``\\d``, ``\\w`` and ``(?i)``
   ASCII's, as they are in Oniguruma on ASCII; constructs whose meaning differs
   between the engines (``^``, ``$``, ``\\Z``, Ruby's ``(?m)``) are refused, and
   both engines backtrack the same way (leftmost alternative, greedy quantifiers);
4. ByteLevel maps bytes to characters with a fixed table, and each piece is
   tokenized by the tokenizer's own model (``model.tokenize``), as the pipeline does
   piece by piece;
5. without special tokens the post-processor adds nothing (only ByteLevel and
   TemplateProcessing are accepted), and truncation and padding must be off.

On top, ``piece_encoder`` compares the encoder with the tokenizer on a probe set
(every ASCII character, the added tokens, contractions, whitespace runs, code) and
gives no encoder when any id differs (tests/gateway/test_pieces.py fuzzes every
real family's tokenizer the same way).
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["PieceEncoder", "piece_encoder", "translate_pattern"]

log = logging.getLogger("core.gateway")

CACHE_ENTRIES = 1 << 16
"""Most pieces whose ids are cached (the cache is emptied when full)."""
_CACHED_CHARS = 48
"""Longer pieces (long whitespace runs, long words) are tokenized every time, not cached."""

_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
"""ByteLevel's own split (``use_regex: true``), as the tokenizers library writes it."""
_UNICODE_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
_POST_PROCESSORS = frozenset({"ByteLevel", "TemplateProcessing"})
_NOTHING = "\\x80"
"""A class member no ASCII text holds: an empty property (``\\p{M}`` has no ASCII member)."""


def _ascii_members(category: str) -> str:
    """The ASCII characters of a Unicode general category (``L``, ``Lu``, ``N``, ``P`` ...),
    escaped for a character class."""
    chars = [chr(c) for c in range(128) if unicodedata.category(chr(c)).startswith(category)]
    return "".join(re.escape(c) if c in "\\]^-[" else c for c in chars)


def _property(name: str) -> str | None:
    """The class members of ``\\p{name}`` on ASCII, or None for a property not handled."""
    if not re.fullmatch(r"[A-Z][a-z]?", name):
        return None  # scripts (\p{Han}), binary properties, Oniguruma's aliases
    members = _ascii_members(name)
    return members or _NOTHING


def translate_pattern(pattern: str) -> str | None:
    """A Python pattern (for ``re.ASCII``) splitting ASCII text as ``pattern`` does in
    Oniguruma, or None when the pattern uses something not translated.

    Capturing groups become non-capturing (the split takes whole matches).
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_start = -1
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            nxt = pattern[i + 1]
            if nxt in "pP":
                m = re.match(r"\{(\^?)([A-Za-z_]+)\}", pattern[i + 2 :])
                if m is None:
                    return None
                members = _property(m.group(2))
                negated = (nxt == "P") != bool(m.group(1))
                if members is None or (negated and in_class):
                    return None
                if in_class:
                    out.append(members)
                else:
                    out.append(("[^" if negated else "[") + members + "]")
                i += 2 + m.end()
                continue
            if nxt in "ZzAGKRXhHbBQEk" or nxt.isdigit() and nxt != "0":
                return None  # anchors and escapes whose meaning differs, backreferences
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" or pattern.startswith("&&", i):
                return None  # Oniguruma's nested classes and intersections
            if c == "]" and i > class_start:
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            class_start = j + 1 if pattern[j : j + 1] == "]" else j  # a leading ']' is a literal
            out.append(pattern[i:j])
            i = j
            continue
        if c in "^$":
            return None  # Ruby syntax: line anchors
        if c == "(":
            if pattern.startswith("(?", i):
                m = re.match(r"\(\?(?::|=|!|<=|<!|>|i:|i\))", pattern[i:])
                if m is None:
                    return None  # named groups, (?m) (dot-all in Ruby), other flags
                out.append(m.group())
                i += m.end()
                continue
            out.append("(?:")
            i += 1
            continue
        out.append(c)
        i += 1
    if in_class:
        return None
    translated = "".join(out)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "possible nested set" and the like: meanings differ
            re.compile(translated, re.ASCII)
    except (re.error, Warning):
        return None
    return translated


def _byte_chars() -> str:
    """ByteLevel's character for each ASCII byte (GPT-2's ``bytes_to_unicode``)."""
    printable = set(range(ord("!"), ord("~") + 1))
    shifted = 0
    table = []
    for b in range(128):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(256 + shifted))
            shifted += 1
    return "".join(table)


_BYTE_LEVEL = str.maketrans({chr(b): c for b, c in enumerate(_byte_chars())})


class PieceEncoder:
    """Encodes ASCII text as a byte-level BPE tokenizer does, through a piece cache."""

    def __init__(
        self,
        model: Any,
        splits: list[re.Pattern[str]],
        added: list[tuple[re.Pattern[str] | None, dict[str, int]]],
        fallback: Callable[[str], list[int]],
    ) -> None:
        """Args:
        model: The tokenizer's model (``backend.model``): tokenizes one byte-level piece.
        splits: The pre-tokenizer's splits, in order (each ``Isolated``: the matches and the
            text between them are the pieces).
        added: The added-token passes: the non-normalized tokens, then the normalized ones
            (each a regex of the tokens, longest first, or None without any, and their ids).
        fallback: The tokenizer's own encoding, for text between added tokens that is not
            ASCII (the tokenizer encodes the text between added tokens piece by piece, so
            such a piece is encoded alone as it would be in place).
        """
        self.model = model
        self.splits = splits
        self.added = added
        self.fallback = fallback
        self._cache: dict[str, tuple[int, ...]] = {}
        # ``split`` with the tokens as a group: text and tokens alternate, found in C.
        self._passes = [(None if p is None else re.compile(f"({p.pattern})"), ids) for p, ids in added]

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (``backend.encode(text, add_special_tokens=False).ids``)."""
        out: list[int] = []
        self._encode_added(text, 0, out)
        return out

    def _encode_added(self, text: str, depth: int, out: list[int]) -> None:
        """Split out the added tokens of pass ``depth`` (0: matched on the raw text; 1: on the
        normalized text, the raw text when it is ASCII), then encode what is between them."""
        if depth and not text.isascii():  # normalized (NFC...) text is not the text itself
            out += self.fallback(text)
            return
        if depth == len(self._passes):
            self._encode_plain(text, out)
            return
        pattern, ids = self._passes[depth]
        if pattern is None:
            self._encode_added(text, depth + 1, out)
            return
        for i, part in enumerate(pattern.split(text)):
            if i & 1:
                out.append(ids[part])
            elif part:
                self._encode_added(part, depth + 1, out)

    def _encode_plain(self, text: str, out: list[int]) -> None:
        if len(self.splits) == 1:
            pieces = _isolated(self.splits[0], text)
        else:
            pieces = [text]
            for split in self.splits:
                pieces = [p for piece in pieces for p in _isolated(split, piece)]
        cache = self._cache
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = tuple(t.id for t in self.model.tokenize(piece.translate(_BYTE_LEVEL)))
                if len(piece) <= _CACHED_CHARS:
                    if len(cache) >= CACHE_ENTRIES:
                        cache.clear()
                    cache[piece] = ids
            out += ids


def _isolated(split: re.Pattern[str], text: str) -> list[str]:
    """``Split(behavior="Isolated")``: the matches and the text between them, in order."""
    pieces: list[str] = split.findall(text)
    if sum(map(len, pieces)) == len(text) and "" not in pieces:
        return pieces
    out = []
    pos = 0
    for m in split.finditer(text):
        if m.start() == m.end():
            continue  # an empty match splits nothing
        if m.start() > pos:
            out.append(text[pos : m.start()])
        out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def _state(component: Any) -> dict[str, Any] | None:
    """A tokenizers component's JSON description (``__getstate__``), or None."""
    if component is None:
        return None
    try:
        state = json.loads(component.__getstate__())
    except Exception:
        return None
    return state if isinstance(state, dict) else None


def _splits(pre: dict[str, Any] | None) -> list[re.Pattern[str]] | None:
    """The pre-tokenizer's splits as Python patterns, or None when it is not byte-level BPE's."""
    if pre is None:
        return None
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    patterns: list[str] = []
    for step in steps[:-1]:
        if step.get("type") != "Split" or step.get("behavior") != "Isolated" or step.get("invert"):
            return None
        source = step.get("pattern") or {}
        if "Regex" in source:
            patterns.append(str(source["Regex"]))
        elif "String" in source:
            patterns.append(re.escape(str(source["String"])))
        else:
            return None
    if steps[-1].get("use_regex", True):
        patterns.append(_GPT2_PATTERN)
    compiled = []
    for p in patterns:
        translated = translate_pattern(p)
        if translated is None:
            return None
        compiled.append(re.compile(translated, re.ASCII))
    return compiled


def _added(backend: Any) -> list[tuple[re.Pattern[str] | None, dict[str, int]]] | None:
    """The two added-token passes (non-normalized, then normalized), or None for flags not reproduced."""
    raw: dict[str, int] = {}
    normalized: dict[str, int] = {}
    for token_id, token in backend.get_added_tokens_decoder().items():
        content = str(token.content)
        if not content or token.lstrip or token.rstrip or token.single_word:
            return None
        (normalized if token.normalized else raw)[content] = int(token_id)
    passes: list[tuple[re.Pattern[str] | None, dict[str, int]]] = []
    for tokens in (raw, normalized):
        alternatives = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
        passes.append((re.compile(alternatives) if tokens else None, tokens))
    return passes


def _reproducible(backend: Any) -> bool:
    """Whether the stages around the pre-tokenizer are ones this module reproduces."""
    if getattr(backend, "truncation", None) or getattr(backend, "padding", None):
        return False
    if getattr(backend, "encode_special_tokens", False):
        return False
    model = getattr(backend, "model", None)
    if type(model).__name__ != "BPE" or getattr(model, "dropout", None):
        return False
    normalizer = _state(backend.normalizer) if backend.normalizer is not None else {}
    if normalizer is None:
        return False
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    if any(s.get("type") not in _UNICODE_NORMALIZERS for s in steps if s):
        return False
    post = _state(backend.post_processor) if backend.post_processor is not None else {}
    if post is None:
        return False
    steps = post.get("processors", []) if post.get("type") == "Sequence" else [post]
    return all(s.get("type") in _POST_PROCESSORS for s in steps if s)


def _probes(added: list[str]) -> list[str]:
    """ASCII texts that exercise every character class, the added tokens, contractions,
    whitespace runs and code (the self-check's corpus)."""
    every = "".join(chr(c) for c in range(128))
    texts = [
        every, every[::-1], every * 2,
        "Hello, world! It's the user's turn: they'll say 'we'd've' and I'M SURE you'RE right.",
        "  two  spaces\tand\ttabs\n\nnew lines\r\n\r\nend   \n   ",
        'def f(x):\n    return {"key": [x ** 2, 3.14159, -7e10]}\n\n\nclass A:  # comment\n\tpass\n',
        "12345678901234567890 a1b2c3 x=10,y=200;z=3000 v2.0.1 0x1F",
        '{"name": "lookup", "arguments": {"key": "the next page"}}',
        "\x0b\x0c\x1c\x1d\x1e\x1f\x7f\x00 mixed \x0b words\x0c here \x1c",
        "don't DON'T Don'T 'tis 'S 's 'll 'LL 're 've 'd 'm ' s",
        "a" * 300 + " " + "1" * 40 + " " * 30 + "!" * 20 + "\n" * 12,
        "CamelCaseWord lowerUPPER MiXeD iPhone eBay HTTPServer URLs",
        "naïve café, 日本語, emoji 🙂, Ελληνικά; then ASCII again's text",
    ]
    tokens = sorted(added)
    for i in range(0, len(tokens), 16):
        group = tokens[i : i + 16]
        texts.append("".join(f"x{t}y {t}{t}\n{every[32 + (i + j) % 90 :][:6]}" for j, t in enumerate(group)))
        texts.append("ü".join(group) + " ünï " + " ".join(group))
    return texts


def piece_encoder(backend: Any) -> PieceEncoder | None:
    """The ``PieceEncoder`` of a ``tokenizers.Tokenizer``, or None when its pipeline is not
    reproduced (see the module docstring) or the encoder disagrees with it on the probes."""
    try:
        if not _reproducible(backend):
            return None
        splits = _splits(_state(backend.pre_tokenizer))
        added = _added(backend)
        if splits is None or added is None:
            return None
        def fallback(text: str) -> list[int]:
            return list(backend.encode(text, add_special_tokens=False).ids)

        encoder = PieceEncoder(backend.model, splits, added, fallback)
        tokens = [t for _, ids in added for t in ids]
        for text in _probes(tokens):
            if encoder.encode(text) != list(backend.encode(text, add_special_tokens=False).ids):
                log.info("gateway: the tokenizer's pieces differ from the fast encoder's on a probe; "
                         "encoding every text with the tokenizer")
                return None
    except Exception:  # an unexpected tokenizer object: the tokenizer encodes everything
        return None
    encoder._cache.clear()
    return encoder
