"""The piece encoder (core.gateway.pieces) gives the tokenizer's own ids, or is not used.

The gateway encodes a turn's new text with it instead of the Rust tokenizer, so
any difference would put wrong tokens in a trace. Each real family's tokenizer
(tests/gateway/families) is fuzzed with texts mixing every ASCII character,
contractions, whitespace runs, the family's added tokens and non-ASCII text; a
sabotaged translation shows the fuzz and the start-up self-check catch a wrong split.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers

from core.gateway import pieces
from core.gateway.pieces import PieceEncoder, piece_encoder, translate_pattern
from core.gateway.render import ChatRenderer
from core.tokenizer import build_tiny_tokenizer
from tests.gateway.families import load

FAMILIES = ("qwen3", "llama3.1", "deepseek-v3", "gpt-oss", "mistral-nemo", "qwen3.5", "kimi-k2.5")
"""One family per distinct pre-tokenizer / added-token set."""

_WORDS = ("the", " The", "don't", "I'M", "we'D", "12345", " 3.14", "\n\n", "   ", "\t", "foo_bar", "CamelCase",
          "x'S", '{"k":', "</", "<|", "|>", "\r\n", "\x0b", "\x0c", "\x1c", "\x7f", " \n ", "a" * 70)
_OTHER = ("é", "日本", "🙂", "\u00a0", "\u2028", "ſ", "\u212a", "ü ")
"""Non-ASCII text: Unicode spaces, letters that case-fold to ASCII ones (long s, Kelvin)."""


def _texts(added: list[str], n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 14)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(_WORDS))
            elif r < 0.5 and added:
                parts.append(rng.choice(added))
            elif r < 0.55:
                parts.append(rng.choice(_OTHER))
            else:
                parts.append("".join(chr(rng.randrange(128)) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def _added(backend: Tokenizer) -> list[str]:
    return sorted(str(t.content) for t in backend.get_added_tokens_decoder().values())


def _mismatches(encoder: PieceEncoder, backend: Tokenizer, texts: list[str]) -> list[str]:
    return [t for t in texts if encoder.encode(t) != backend.encode(t, add_special_tokens=False).ids]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_encodes_exactly_as_its_tokenizer(name: str) -> None:
    backend = load(name).backend_tokenizer
    encoder = piece_encoder(backend)
    assert encoder is not None, f"{name}: no piece encoder (the gateway would tokenize every turn in Rust)"
    texts = _texts(_added(backend), 1500)
    assert _mismatches(encoder, backend, texts) == []
    assert encoder._cache, "the fuzz never went through the piece cache"


def test_the_tiny_tokenizer_has_one_too() -> None:
    backend = build_tiny_tokenizer().backend_tokenizer
    encoder = piece_encoder(backend)
    assert encoder is not None
    assert _mismatches(encoder, backend, _texts(_added(backend), 1000)) == []


def test_the_renderers_prompts_are_the_tokenizers_ids() -> None:
    tok = load("qwen3")
    renderer = ChatRenderer(tok)
    assert renderer._pieces is not None
    messages = [
        {"role": "system", "content": "You're terse.\n\n  Answer in JSON: {\"a\": 1}"},
        {"role": "user", "content": "What's 12*7?\tAnd    why?\r\n"},
        {"role": "assistant", "content": "84 -- it's 12 sevens."},
        {"role": "user", "content": "Now in Français, s'il vous plaît: naïve café 🙂"},
    ]
    text = renderer.render_text(messages, None, add_generation_prompt=True)
    want = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert renderer.render_prompt(messages, None) == want
    assert renderer._pieces._cache, "the prompt was not encoded by the piece encoder"


def _sabotaged(pattern: str) -> str | None:
    """The translation with ``\\s`` as a plain space: vertical tab and form feed split wrong."""
    translated = translate_pattern(pattern)
    return None if translated is None else translated.replace("\\s", "[ \\t\\r\\n]")


def test_a_wrong_split_is_caught_by_the_fuzz_and_by_the_self_check(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = load("qwen3").backend_tokenizer
    state = pieces._state(backend.pre_tokenizer)
    assert state is not None
    split = re.compile(str(_sabotaged(state["pretokenizers"][0]["pattern"]["Regex"])), re.ASCII)
    added = pieces._added(backend)
    assert added is not None
    wrong = PieceEncoder(backend.model, [split], added,
                         lambda t: list(backend.encode(t, add_special_tokens=False).ids))
    assert _mismatches(wrong, backend, _texts(_added(backend), 1500)), "the fuzz does not see a wrong split"
    monkeypatch.setattr(pieces, "translate_pattern", _sabotaged)
    assert piece_encoder(backend) is None, "the self-check let a wrong split through"


def test_a_wrong_added_token_split_is_caught_by_the_self_check(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = load("qwen3").backend_tokenizer
    real = pieces._added

    def shortest_first(b: Any) -> Any:
        passes = real(b)
        return [(re.compile("|".join(re.escape(t) for t in sorted(ids, key=len))) if ids else None, ids)
                for _, ids in passes]

    monkeypatch.setattr(pieces, "_added", shortest_first)
    # <tool_call> is a prefix of no other token, but <|im_start|> ... all are found either way;
    # a token that is a prefix of another is needed: add one.
    tok = Tokenizer.from_str(backend.to_str())
    tok.add_tokens([AddedToken("<tool", normalized=False)])
    assert piece_encoder(tok) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda t: setattr(t, "normalizer", normalizers.Lowercase()), "a normalizer that changes ASCII"),
        (lambda t: t.add_tokens([AddedToken("zz", lstrip=True)]), "an added token that strips"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex("a"), "removed"), pre_tokenizers.ByteLevel(use_regex=False)])),
         "a split that removes text"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
         "a prefix space"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()), "no byte-level"),
        (lambda t: t.enable_truncation(8), "truncation"),
    ],
)
def test_pipelines_it_does_not_reproduce_get_no_encoder(change: Any, why: str) -> None:
    tok = Tokenizer.from_str(build_tiny_tokenizer().backend_tokenizer.to_str())
    assert piece_encoder(tok) is not None
    change(tok)
    assert piece_encoder(tok) is None, why


def test_translate_pattern() -> None:
    assert translate_pattern(r"\p{L}+|\p{N}") == "[ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz]+|[0123456789]"
    assert translate_pattern(r"[^\s\p{L}]") == "[^\\sABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz]"
    assert translate_pattern(r"[\p{M}]+") == "[\\x80]+"  # no ASCII member: matches no ASCII text
    assert translate_pattern(r"(a)|(?i:'s)") == "(?:a)|(?i:'s)"
    for refused in (r"^a", r"a$", r"a\Z", r"(?m:.)", r"(a)\1", r"[a[b]]", r"[a&&b]", r"\p{Han}", r"[\P{L}]",
                    r"(?<name>a)", "[a"):
        assert translate_pattern(refused) is None, refused


def test_the_translation_splits_ascii_like_the_tokenizer() -> None:
    """Every ASCII character, alone and in runs, split by Qwen3's pattern in both engines."""
    backend = load("qwen3").backend_tokenizer
    state = pieces._state(backend.pre_tokenizer)
    assert state is not None
    onig = pre_tokenizers.Split(Regex(state["pretokenizers"][0]["pattern"]["Regex"]), "isolated")
    ours = re.compile(str(translate_pattern(state["pretokenizers"][0]["pattern"]["Regex"])), re.ASCII)
    rng = random.Random(3)
    for _ in range(2000):
        text = "".join(chr(rng.randrange(128)) for _ in range(rng.randint(1, 12)))
        assert pieces._isolated(ours, text) == [p for p, _ in onig.pre_tokenize_str(text)], repr(text)
