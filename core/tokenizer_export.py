"""Load a Hugging Face tokenizer in a process that must not import torch.

Why: in transformers 5, ``AutoTokenizer`` imports the model-configuration
registry and with it torch (about 9 s and 180 MB more for a gateway that only
renders and parses). Choosing the tokenizer class ourselves would skip
``AutoTokenizer``'s corrections for checkpoints that declare the wrong class,
which can change token ids. So a child process loads the tokenizer with
``AutoTokenizer``, saves it (``tokenizer.json`` plus its config), reloads the
copy with transformers' generic fast class and compares the two on a probe
set: plain, unicode and special-token text, the chat template with and without
tools, decoding. The parent loads the copy only when they agree; otherwise it
loads with ``AutoTokenizer`` itself and says why. The child's torch is gone
when it exits.

The copy of a byte-pair-encoding tokenizer travels in pieces (``_write_split``):
the vocabulary and merges in ``tokenizers``' own ``vocab.json``/``merges.txt`` formats,
the rest of the pipeline and the added tokens in ``SPLIT_FILE``, and
``added_tokens_decoder`` in ``tokenizer_config.json``. Why: the parent is a
long-lived gateway, and its peak memory was the load. Deserializing a
``tokenizer.json`` goes through serde's generic intermediate copies of the model
(Qwen3's: about 125 MB above the 45 MB the loaded tokenizer keeps), and
transformers' ``from_pretrained`` also parsed the whole file with Python's
``json`` (about 75 MB more, alive at the same time) to read the added tokens a
config without ``added_tokens_decoder`` does not list. ``BPE.from_file`` reads
the two files directly (about 52 MB above). The child keeps the split form only
when the rebuilt backend serializes exactly as the original (``to_str``), and
the parent checks the same digest before it imports transformers, so what the
gateway tokenizes with is the original's backend byte for byte.

``save_copy`` and ``load_checked_copy`` are the two sides (save in pieces and
return the digest; load, check the digest and the fingerprint, or fall back with
a warning); the trainer ships its gateway shards their tokenizer the same way
(``core.rollout.shards``). ``python -m core.tokenizer_export NAME_OR_PATH DEST``
runs the child side.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.tokenizer import build_tiny_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

__all__ = [
    "CopyDiffers", "SPLIT_FILE", "fingerprint", "first_difference", "load_checked_copy", "load_tokenizer_without_torch",
    "save_copy",
]

SPLIT_FILE = "tracerl-split.json"
"""In a copy ``export`` saved in pieces: the backend's pipeline (its BPE model without vocabulary and
merges) and its added tokens; ``_SPLIT_PREFIX``-vocab.json and -merges.txt lie beside it."""
_SPLIT_PREFIX = "tracerl"
_BPE_OPTIONS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                "byte_fallback", "ignore_merges")
"""``BPE.from_file`` keyword arguments, read from the model's JSON; a model with any other key is
not split (the rebuilt backend would differ, which the exact check also catches)."""

PROBE_TEXTS = (
    "Hello world",
    " leading space and trailing space ",
    "tabs\tand\nnew\n\nlines\r\n",
    "multiple   spaces",
    "naïve café, 日本語, emoji 🙂, Ελληνικά",
    "digits 12345 3.14159 -7e10",
    'def f(x):\n    return {"key": [x ** 2]}\n',
    "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"key\": \"a\"}}\n</tool_call>",
)

_TOOLS = [{
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}]

_CHATS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "plain": ([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi, what is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ], None),
    "tools": ([
        {"role": "user", "content": "Look up a."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call_1", "function": {"name": "lookup", "arguments": {"key": "a"}}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ], _TOOLS),
}


def _outcome(call: Any) -> Any:
    """The call's result, or its exception's type: both sides must agree either way."""
    try:
        return call()
    except Exception as exc:  # a template that refuses a chat must refuse it on both sides
        return f"raises {type(exc).__name__}"


def fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What must be equal for two tokenizers to produce the same token ids and text."""
    specials = list(getattr(tokenizer, "all_special_tokens", []) or [])
    added = [str(getattr(t, "content", t)) for t in dict(getattr(tokenizer, "added_tokens_decoder", {}) or {}).values()]
    texts = [*PROBE_TEXTS, "".join(specials), " ".join(added[:64]), "x" + "y".join(specials) + "z"]
    out: dict[str, Any] = {
        "size": len(tokenizer),
        "ids": {k: getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")},
        "special_ids": sorted(int(i) for i in getattr(tokenizer, "all_special_ids", []) or []),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "encode": [],
    }
    for text in texts:
        plain = list(tokenizer.encode(text, add_special_tokens=False))
        out["encode"].append({
            "plain": plain,
            "special": list(tokenizer.encode(text, add_special_tokens=True)),
            "decode": tokenizer.decode(plain, skip_special_tokens=False),
            "decode_skip": tokenizer.decode(plain, skip_special_tokens=True),
        })
    if out["chat_template"]:
        for name, (chat, tools) in _CHATS.items():
            for generation_prompt in (False, True):
                out[f"chat/{name}/{generation_prompt}"] = _outcome(lambda c=chat, t=tools, g=generation_prompt: str(
                    tokenizer.apply_chat_template(c, tools=t, tokenize=False, add_generation_prompt=g)))
    return out


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first key (sorted) of two ``fingerprint``s whose values differ; ``None`` when equal."""
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return key
    return None


class CopyDiffers(ValueError):
    """The backend rebuilt from a split copy does not serialize as the original did."""


def _digest(backend: Any) -> str:
    """sha256 of a ``tokenizers.Tokenizer``'s serialization (vocabulary, merges, pipeline, added tokens)."""
    return hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()


def _split_paths(dest: str) -> tuple[Path, Path, Path]:
    root = Path(dest)
    return root / SPLIT_FILE, root / f"{_SPLIT_PREFIX}-vocab.json", root / f"{_SPLIT_PREFIX}-merges.txt"


def _build_backend(dest: str) -> Any:
    """The ``tokenizers.Tokenizer`` a split copy holds, built without parsing a ``tokenizer.json``.

    The pipeline (normalizer, pre-tokenizer, post-processor, decoder, truncation,
    padding) comes from ``SPLIT_FILE`` with an empty BPE model; the model is read
    by ``BPE.from_file``; the added tokens are added in id order, so each gets its
    id from the vocabulary or the next free one, as the original's did (checked by
    the caller's digest).
    """
    from tokenizers import AddedToken, Tokenizer, models

    split, vocab, merges = _split_paths(dest)
    spec = json.loads(split.read_text(encoding="utf-8"))
    pipeline = spec["pipeline"]
    # None is the default of each optional setting, and BPE.from_file refuses it as a value
    options = {k: v for k, v in pipeline["model"].items() if k in _BPE_OPTIONS and v is not None}
    backend = Tokenizer.from_str(json.dumps(pipeline))
    backend.model = models.BPE.from_file(str(vocab), str(merges), **options)
    for token in sorted(spec["added_tokens"], key=lambda t: int(t["id"])):
        added = AddedToken(token["content"], single_word=token["single_word"], lstrip=token["lstrip"],
                           rstrip=token["rstrip"], normalized=token["normalized"], special=token["special"])
        (backend.add_special_tokens if token["special"] else backend.add_tokens)([added])
    return backend


def _write_split(tokenizer: Any, dest: str) -> str | None:
    """Child side: replace ``dest``'s ``tokenizer.json`` by its pieces when they rebuild the
    backend exactly; the digest the rebuilt backend has, or None (``tokenizer.json`` kept).

    Only a BPE model is split (``BPE.from_file``; other models have no such reader).
    ``tokenizer_config.json`` gets ``added_tokens_decoder``, which transformers would
    otherwise read from the ``tokenizer.json``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE":
        return None
    full = backend.to_str()
    data = json.loads(full)
    model = data.get("model") or {}
    if model.get("type") != "BPE" or set(model) - {"type", "vocab", "merges", *_BPE_OPTIONS}:
        return None
    added = data.get("added_tokens") or []
    data["model"] = {**model, "vocab": {}, "merges": []}
    data["added_tokens"] = []
    split, vocab, merges = _split_paths(dest)
    written = [Path(p) for p in backend.model.save(dest, _SPLIT_PREFIX)]
    split.write_text(json.dumps({"pipeline": data, "added_tokens": added}), encoding="utf-8")
    try:
        same = {vocab, merges} == set(written) and _build_backend(dest).to_str() == full
    except Exception:  # a pipeline the pieces cannot rebuild: keep tokenizer.json
        same = False
    if not same:
        for path in (split, *written):
            path.unlink(missing_ok=True)
        return None
    (Path(dest) / "tokenizer.json").unlink()
    config_path = Path(dest) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.setdefault("added_tokens_decoder", {  # as from_pretrained read it from tokenizer.json
        str(token["id"]): {k: token[k] for k in ("content", "single_word", "lstrip", "rstrip", "normalized", "special")}
        for token in added
    })
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    return hashlib.sha256(full.encode("utf-8")).hexdigest()


class _Adopted:
    """Hands a built backend to transformers without a copy: its ``__init__`` deep-copies
    ``tokenizer_object``, and a ``tokenizers.Tokenizer`` copies through its JSON, which is
    the deserialization the split form avoids."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self.backend


def _load_copy(path: str, *, digest: str | None = None) -> Any:
    """The tokenizer ``export`` saved at ``path``, as transformers' generic fast class.

    A split copy's backend is built first, and checked against ``digest`` when one
    is given, before transformers is imported: the build's transient memory then sits
    below what the imports add. Raises ``CopyDiffers`` when the digest differs.
    """
    backend = None
    if _split_paths(path)[0].is_file():
        backend = _build_backend(path)
        if digest is not None and (rebuilt := _digest(backend)) != digest:
            raise CopyDiffers(
                f"the backend rebuilt from {path} does not serialize as the original's "
                f"(sha256 {rebuilt[:12]}..., the original's {digest[:12]}...)"
            )
    from transformers import PreTrainedTokenizerFast

    if backend is None:
        return PreTrainedTokenizerFast.from_pretrained(path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, tokenizer_object=_Adopted(backend))
    if tokenizer.backend_tokenizer is not backend:  # transformers no longer copies: not this backend
        raise CopyDiffers(f"transformers did not adopt the backend rebuilt from {path}")
    return tokenizer


def save_copy(tokenizer: Any, dest: str) -> str | None:
    """Save ``tokenizer`` to ``dest`` for ``load_checked_copy``: in pieces when they rebuild its
    backend exactly (the sha256 returned is what the loader checks), else whole (None).

    The gateway's child saves its copy with this; so does the trainer for its gateway shards
    (``core.rollout.shards.shard_spec``).
    """
    tokenizer.save_pretrained(dest)
    return _write_split(tokenizer, dest)


def load_checked_copy(
    dest: str, expected: dict[str, Any], *, digest: str | None, name: str,
    fallback: Callable[[], Any], fallback_name: str = "AutoTokenizer",
) -> Any:
    """The tokenizer ``save_copy`` saved at ``dest``, when it reproduces the original; else
    ``fallback()``, with a warning naming what differed.

    Args:
        dest: The copy's directory.
        expected: The original's ``fingerprint`` (JSON-shaped).
        digest: What ``save_copy`` returned: a split copy must rebuild to it.
        name: The tokenizer as the warning names it.
        fallback: Loads the tokenizer another way (called when the copy differs).
        fallback_name: That way, as the warning names it.
    """
    try:
        tokenizer = _load_copy(dest, digest=digest)
    except CopyDiffers as exc:
        log.warning("tokenizer %s: %s; loading it with %s", name, exc, fallback_name)
        return fallback()
    difference = first_difference(expected, json.loads(json.dumps(fingerprint(tokenizer))))
    if difference is not None:
        log.warning("tokenizer %s: the copy loaded here differs in %r; loading it with %s",
                    name, difference, fallback_name)
        return fallback()
    return tokenizer


def export(name_or_path: str, dest: str) -> dict[str, Any]:
    """Child side: load with ``AutoTokenizer``, save to ``dest`` (``save_copy``), check the
    copy; a JSON-able verdict."""
    original = load_tokenizer(name_or_path)
    digest = save_copy(original, dest)
    expected = fingerprint(original)
    try:
        difference = first_difference(expected, fingerprint(_load_copy(dest, digest=digest)))
    except CopyDiffers:
        difference = "backend"
    return {"ok": difference is None, "difference": difference, "fingerprint": expected,
            "class": type(original).__name__, "digest": digest}


def load_tokenizer_without_torch(name_or_path: str, *, timeout_s: float = 600.0) -> Any:
    """The tokenizer ``load_tokenizer(name_or_path)`` gives, loaded without importing torch here.

    Falls back to ``load_tokenizer`` (which may import torch) when the copy
    does not reproduce the original, and logs which probe differed.
    """
    if name_or_path == "tiny":
        return build_tiny_tokenizer()
    with tempfile.TemporaryDirectory(prefix="tracerl-tokenizer-") as dest:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "core.tokenizer_export", name_or_path, dest],
                capture_output=True, text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            log.warning("tokenizer %s: the torch-free copy took over %ss; loading it with AutoTokenizer",
                        name_or_path, timeout_s)
            return load_tokenizer(name_or_path)
        lines = proc.stdout.strip().splitlines()
        verdict = None
        if proc.returncode == 0 and lines:
            try:  # the verdict is the child's last line; a library may print after it
                verdict = json.loads(lines[-1])
            except ValueError:
                verdict = None
        if not isinstance(verdict, dict):
            reason = (proc.stderr.strip().splitlines() or [f"no verdict in its output ({len(lines)} lines)"])[-1]
            log.warning("tokenizer %s: the torch-free copy failed (%s); loading it with AutoTokenizer",
                        name_or_path, reason)
            return load_tokenizer(name_or_path)
        if not verdict["ok"]:
            log.warning("tokenizer %s (%s): its torch-free copy differs in %r; loading it with AutoTokenizer",
                        name_or_path, verdict["class"], verdict["difference"])
            return load_tokenizer(name_or_path)
        tokenizer = load_checked_copy(dest, verdict["fingerprint"], digest=verdict.get("digest"), name=name_or_path,
                                      fallback=lambda: load_tokenizer(name_or_path))
    # end_of_turn_ids reads generation_config.json beside the original's files.
    tokenizer.name_or_path = name_or_path
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    """``python -m core.tokenizer_export NAME_OR_PATH DEST``: print the verdict as one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m core.tokenizer_export NAME_OR_PATH DEST", file=sys.stderr)
        return 2
    print(json.dumps(export(args[0], args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
