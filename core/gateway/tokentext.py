"""Each generated token's own text and bytes, for the logprobs a client asks for.

Defines ``TokenText`` (built once per gateway) and ``TokenLogprob``.

Why not ``decode([id])``: a byte-level BPE token may hold part of a UTF-8
character, which decodes to U+FFFD and loses the bytes OpenAI's ``bytes``
field exists to carry. For byte-level tokenizers (GPT-2 style, the Qwen,
Llama 3, DeepSeek and gpt-oss families) the token string is mapped back
through the byte-to-character table; other tokenizers and special tokens
fall back to decoding the single token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = ["TokenLogprob", "TokenText"]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token as a client sees it."""

    token: str
    """The token's text (U+FFFD where it holds part of a character)."""
    logprob: float
    """Log-probability the sampler reported (of the distribution actually sampled)."""
    bytes: list[int]
    """The token's UTF-8 bytes."""


@cache
def _byte_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenText:
    """Token id -> (text, bytes) for one tokenizer, cached per id.

    Why a cache: the conversion runs on the event loop for every turn that asks for
    logprobs; a turn reuses few distinct ids, so after warm-up a 4000-token turn costs
    dictionary lookups instead of thousands of tokenizer calls (misses are converted in
    one batch call). Bounded: cleared past ``CACHE_IDS`` ids.
    """

    CACHE_IDS = 65_536

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added = frozenset(int(i) for i in added)
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _bytes(self, token_id: int, piece: Any) -> bytes:
        if self._byte_level and token_id not in self._added:
            table = _byte_table()
            if isinstance(piece, str) and all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return str(text).encode("utf-8", errors="surrogatepass")

    def _fill(self, ids: list[int]) -> None:
        pieces = self._tokenizer.convert_ids_to_tokens(ids) if self._byte_level else [None] * len(ids)
        for t, piece in zip(ids, pieces, strict=True):
            raw = self._bytes(t, piece)
            # The bytes list is shared by every entry of this id: nothing mutates it.
            self._cache[t] = (raw.decode("utf-8", errors="replace"), list(raw))

    def logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> list[TokenLogprob]:
        """One ``TokenLogprob`` per token."""
        ids = [int(t) for t in token_ids]
        cache = self._cache
        distinct = set(ids)
        missing = [t for t in distinct if t not in cache]
        if missing:
            if len(cache) + len(missing) > self.CACHE_IDS:
                cache.clear()
                missing = list(distinct)
            self._fill(missing)
        return [TokenLogprob(cache[t][0], float(lp), cache[t][1]) for t, lp in zip(ids, logprobs, strict=True)]
