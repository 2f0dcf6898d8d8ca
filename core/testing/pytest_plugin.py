"""pytest plugin shipped with tracerl: shared fixtures for core, plugins and third parties.

Enable it with ``-p core.testing.pytest_plugin`` (tracerl's own pyproject does).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    """The offline tiny tokenizer (ASCII coverage, Qwen3-style tool template)."""
    from core.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def byte_tokenizer() -> Any:
    """A tiny tokenizer with the full byte alphabet: any text round-trips."""
    from core.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(full_byte_alphabet=True, vocab_size=320)
