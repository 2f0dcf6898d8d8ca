"""Offline tokenizers shaped like real models' for tests: nothing is downloaded.

Defines ``build_llama3_style_tokenizer``: the tiny byte-level tokenizer with
Llama 3's chat scaffolding, whose end-of-turn token (``<|eot_id|>``) is not its
EOS (``<|end_of_text|>``), and optionally saved with a ``generation_config.json``
that lists several ``eos_token_id`` (as Llama 3.1's does), so tests can check
that samplers and the gateway stop on every end-of-turn id a model declares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["EOM", "EOS", "EOT", "LLAMA3_STYLE_TEMPLATE", "build_llama3_style_tokenizer"]

EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
EOM = "<|eom_id|>"
_HEADER = ("<|start_header_id|>", "<|end_header_id|>")

LLAMA3_STYLE_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
"""Llama 3's message framing (no tools, no BOS): every message ends with ``<|eot_id|>``."""


def build_llama3_style_tokenizer(directory: str | Path | None = None, *, generation_eos: list[str] | None = None) -> Any:
    """A byte-level tokenizer with EOS ``<|end_of_text|>`` and end-of-turn ``<|eot_id|>``.

    Args:
        directory: When given, save the tokenizer there (with
            ``generation_config.json`` if ``generation_eos`` is set) and return it
            reloaded from that directory, as ``AutoTokenizer.from_pretrained`` loads a model's.
        generation_eos: Token strings whose ids ``generation_config.json`` lists
            as ``eos_token_id`` (e.g. ``[EOS, EOM, EOT]``).
    """
    from transformers import AutoTokenizer

    from core.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320, chat_template=LLAMA3_STYLE_TEMPLATE)
    tok.add_special_tokens({"eos_token": EOS, "additional_special_tokens": [*_HEADER, EOT, EOM]})
    if directory is None:
        return tok
    path = Path(directory)
    tok.save_pretrained(path)
    if generation_eos:
        ids = [tok.convert_tokens_to_ids(t) for t in generation_eos]
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}), encoding="utf-8")
    return AutoTokenizer.from_pretrained(str(path))
