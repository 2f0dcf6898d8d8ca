"""Helpers shared by the local backend tests (imported as ``local_helpers``; fixtures are in conftest)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from tracerl_local.backend import LocalBackend

from core.types import Datum, SampleResult

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine on a fresh event loop (no pytest asyncio plugin needed)."""
    return asyncio.run(coro)


def chat_prompt(backend: LocalBackend, n: int = 3) -> list[int]:
    """The succ_digit prompt for ``After n?`` rendered with the tiny chat template."""
    tok = backend.get_tokenizer()
    enc = tok.apply_chat_template(
        [
            {"role": "system", "content": "Say the next digit."},
            {"role": "user", "content": f"After {n}?"},
        ],
        add_generation_prompt=True,
        tokenize=True,
    )
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def make_datum(prompt: Sequence[int], result: SampleResult, advantage: float = 0.0) -> Datum:
    """A Datum from a prompt and what the sampler returned, per core.types' convention."""
    ids = list(prompt) + list(result.token_ids)
    mask = [0] * len(prompt) + [1] * len(result.token_ids)
    logprobs = [0.0] * len(prompt) + list(result.logprobs)
    return Datum(
        model_input=ids[:-1],
        target_tokens=ids[1:],
        logprobs=logprobs[1:],
        advantages=[advantage * m for m in mask[1:]],
        weights=[float(m) for m in mask[1:]],
    )
