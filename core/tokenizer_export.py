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

``python -m core.tokenizer_export NAME_OR_PATH DEST`` runs the child side.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from typing import Any

from core.tokenizer import build_tiny_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

__all__ = ["fingerprint", "first_difference", "load_tokenizer_without_torch"]

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


def _load_copy(path: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


def export(name_or_path: str, dest: str) -> dict[str, Any]:
    """Child side: load with ``AutoTokenizer``, save to ``dest``, check the copy; a JSON-able verdict."""
    original = load_tokenizer(name_or_path)
    original.save_pretrained(dest)
    expected = fingerprint(original)
    difference = first_difference(expected, fingerprint(_load_copy(dest)))
    return {"ok": difference is None, "difference": difference, "fingerprint": expected,
            "class": type(original).__name__}


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
        tokenizer = _load_copy(dest)
    difference = first_difference(verdict["fingerprint"], json.loads(json.dumps(fingerprint(tokenizer))))
    if difference is not None:
        log.warning("tokenizer %s: the copy loaded here differs in %r; loading it with AutoTokenizer",
                    name_or_path, difference)
        return load_tokenizer(name_or_path)
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
