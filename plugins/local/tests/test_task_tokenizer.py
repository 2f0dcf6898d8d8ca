"""The tiny preset builds its tokenizer from the task's own texts when the task gives them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from tracerl_local.backend import LocalBackend

from core.errors import ConfigError


def _cfg(**task: object) -> object:
    return OmegaConf.create({"seed": 0, "backend": {"name": "local", "model": "tiny"}, "task": task})


def test_task_corpus_gives_a_small_vocabulary() -> None:
    backend = LocalBackend.from_config(
        _cfg(tokenizer_corpus="core.tasks.succ_digit:tokenizer_corpus", tokenizer_vocab_size=120)
    )
    tok = backend.get_tokenizer()
    assert len(tok) <= 120
    assert backend._model.config.vocab_size == len(tok)  # noqa: SLF001 - the model is sized to it
    text = tok.apply_chat_template(
        [{"role": "user", "content": "After 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert tok.decode(tok.encode(text)) == text


def test_default_corpus_without_task_settings() -> None:
    assert len(LocalBackend.from_config(_cfg()).get_tokenizer()) == 160


def test_bad_corpus_spec_names_the_key() -> None:
    with pytest.raises(ConfigError, match="task.tokenizer_corpus"):
        LocalBackend.from_config(_cfg(tokenizer_corpus="core.tasks.succ_digit:nope"))


def test_task_whole_tokens_are_single_tokens_of_the_tiny_tokenizer() -> None:
    from core.tasks.lookup import call_text

    backend = LocalBackend.from_config(
        _cfg(
            tokenizer_corpus="core.tasks.lookup:tokenizer_corpus",
            tokenizer_vocab_size=100,
            tokenizer_tokens="core.tasks.lookup:tokenizer_tokens",
        )
    )
    tok = backend.get_tokenizer()
    assert tok.encode(call_text("a"), add_special_tokens=False) == [tok.convert_tokens_to_ids(call_text("a"))]
    assert backend._model.config.vocab_size == len(tok)  # noqa: SLF001 - the model can emit them


def test_bad_whole_tokens_spec_names_the_key() -> None:
    with pytest.raises(ConfigError, match="task.tokenizer_tokens"):
        LocalBackend.from_config(_cfg(tokenizer_tokens="core.tasks.nowhere:tokens"))
