"""A sampler that replays preset token sequences.

Defines ``ScriptedSampler``, ``SamplerCall``, ``encode_reply`` and ``spread_delay``.

It honours ``max_tokens`` (cutting the reply, finish ``length``), stop token
ids and, given a tokenizer, stop strings (ending after the token that
completes one), so gateway tests exercise the same paths a real model does.
Logprobs are fake but deterministic (a function of token id and position),
which lets tests check that every logprob lands on the token it belongs to.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import SamplerError
from core.types import FinishReason, SampleResult, SamplingParams

__all__ = ["SamplerCall", "ScriptedSampler", "encode_reply", "fake_logprob", "spread_delay"]


def encode_reply(tokenizer: Any, text: str, *, eos: bool = True) -> list[int]:
    """Token ids of ``text`` as a model would emit it, followed by EOS unless ``eos=False``."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if eos:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def spread_delay(prompt_tokens: int, low_s: float, high_s: float) -> float:
    """A sampler latency between ``low_s`` and ``high_s``, log-uniform over prompt lengths.

    Why a function of the prompt's length: a benchmark client reads the prompt's
    length from ``usage`` and subtracts exactly the sleep its turn got, so what is
    left is the latency the gateway added.
    """
    if high_s <= low_s:
        return low_s
    u = ((prompt_tokens * 2654435761) % 2**32) / 2**32
    return float(low_s * (high_s / low_s) ** u)


def fake_logprob(token_id: int, position: int) -> float:
    """The deterministic logprob the scripted sampler reports for a token."""
    return -((token_id * 7 + position) % 97 + 1) / 64.0


@dataclass(frozen=True)
class SamplerCall:
    """One call the sampler received (for assertions)."""

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    session_id: str


class ScriptedSampler:
    """Returns preset replies: per session first, then a shared queue, then ``default``.

    Example::

        tok = build_tiny_tokenizer()
        sampler = ScriptedSampler([encode_reply(tok, "4")], tokenizer=tok)
    """

    def __init__(
        self,
        replies: Iterable[Sequence[int]] = (),
        *,
        default: Sequence[int] | None = None,
        tokenizer: Any = None,
        eos_token_id: int | None = None,
        weight_version: int = 0,
        delay_s: float | tuple[float, float] = 0.0,
        record_calls: bool = True,
    ) -> None:
        """Create a sampler.

        Args:
            replies: Token sequences handed out in order to any session.
            default: Reply used when no scripted one is left; None raises ``SamplerError`` then.
            tokenizer: Needed only to honour stop strings; also supplies the EOS id.
            eos_token_id: Stop token; defaults to the tokenizer's EOS.
            weight_version: Reported on every result (bump it to mimic a weight sync).
            delay_s: Sleep per call, to test concurrency, streaming and disconnects; a
                (low, high) pair sleeps ``spread_delay(len(prompt), low, high)``.
            record_calls: Keep every call in ``calls`` (off for benchmarks).
        """
        self._queue: deque[list[int]] = deque(list(r) for r in replies)
        self._per_session: dict[str, deque[list[int]]] = {}
        self.default = list(default) if default is not None else None
        self.tokenizer = tokenizer
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        self.eos_token_id = eos_token_id
        self.weight_version = weight_version
        self.delay_s = delay_s
        self.record_calls = record_calls
        self.calls: list[SamplerCall] = []

    def push(self, *replies: Sequence[int], session_id: str | None = None) -> None:
        """Queue more replies, for one session or for anyone."""
        if session_id is None:
            self._queue.extend(list(r) for r in replies)
        else:
            self._per_session.setdefault(session_id, deque()).extend(list(r) for r in replies)

    def _next(self, session_id: str) -> list[int]:
        own = self._per_session.get(session_id)
        if own:
            return own.popleft()
        if self._queue:
            return self._queue.popleft()
        if self.default is not None:
            return self.default
        raise SamplerError(
            f"ScriptedSampler has no reply left for session {session_id[:10]!r}; "
            "push() more replies or pass default="
        )

    def _cut_at_stop_string(self, ids: list[int], stops: tuple[str, ...]) -> int | None:
        """Length of the prefix ending with the token that completes a stop string."""
        if not stops or self.tokenizer is None:
            return None
        for n in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=False)
            if any(s and s in text for s in stops):
                return n
        return None

    async def sample(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> SampleResult:
        """Return the next scripted reply, cut by ``max_tokens``, stop ids and stop strings."""
        if self.record_calls:
            self.calls.append(SamplerCall(tuple(prompt_token_ids), params, session_id))
        if isinstance(self.delay_s, tuple):
            await asyncio.sleep(spread_delay(len(prompt_token_ids), *self.delay_s))
        elif self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = self._next(session_id)
        finish = FinishReason.LENGTH
        stop_ids = set(params.stop_token_ids)
        if self.eos_token_id is not None:
            stop_ids.add(self.eos_token_id)
        for i, t in enumerate(ids):
            if t in stop_ids:
                ids = ids[: i + 1]
                finish = FinishReason.STOP
                break
        cut = self._cut_at_stop_string(ids, params.stop)
        if cut is not None:
            ids, finish = ids[:cut], FinishReason.STOP
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], FinishReason.LENGTH
        return SampleResult(
            token_ids=ids,
            logprobs=[fake_logprob(t, i) for i, t in enumerate(ids)],
            finish_reason=finish,
            weight_version=self.weight_version,
        )
