"""A turn's sampling parameters: what the request may change, and the seed of each call.

Defines:

- ``turn_params``: the parameters a request's turn is sampled with.
- ``call_seed``: the seed of a session's sampler call, from the session's seed, the
  client's ``seed`` (OpenAI) and the call's index.
- ``turn_seed``: the seed of call ``n`` of a session seeded with ``seed``.

Sampling precedence (documented in docs/gateway.md): the session's
``SamplingParams`` are the defaults (with the turn's policy's own over them, in a run
whose policies sample apart: docs/multi_agent.md); a request may lower ``max_tokens`` and add
stop strings; it may set temperature/top_p/top_k only when the session allows
overrides (``GatewayConfig.allow_sampling_overrides`` or the per-session flag),
otherwise the session's values win and the ignored request is counted. Every
turn records the parameters it was sampled with (row metadata ``turn_params``).

Seeds: a seeded session draws fresh randomness on each call (concurrent calls
included) yet reproduces run to run, and rollouts of a group sample apart even when
their agent hard-codes one ``seed``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from core.gateway.errors import bad_request
from core.gateway.session import Session
from core.gateway.turn import TurnRequest
from core.types import SamplingParams

__all__ = ["call_seed", "turn_params", "turn_seed"]


def turn_params(s: Session, req: TurnRequest, policy: str) -> SamplingParams:
    """The parameters ``req``'s turn of ``policy`` in session ``s`` is sampled with (before the
    context budget and the seed): the session's, with ``policy``'s own defaults over them
    (``SamplingParams.by_policy``); an override the session does not allow is counted and ignored.

    Raises:
        GatewayError: 400 for a ``max_tokens`` below 1 or parameters out of range.
    """
    base = s.sampling.for_policy(policy)
    changes: dict[str, Any] = {}
    if req.max_tokens is not None:
        if req.max_tokens < 1:
            raise bad_request(f"max_tokens must be >= 1, got {req.max_tokens!r}", param="max_tokens")
        changes["max_tokens"] = min(req.max_tokens, base.max_tokens)
    asked = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
    asked = {k: v for k, v in asked.items() if v is not None and v != getattr(base, k)}
    if asked:
        if s.allow_sampling_overrides:
            changes.update(asked)
        else:
            s.counters["sampling_overrides_ignored"] += 1
    if req.hints_ignored:
        s.counters["hints_ignored"] += 1
    if req.stop:
        changes["stop"] = tuple(dict.fromkeys((*base.stop, *req.stop)))
    if not changes:
        return base
    try:
        return dataclasses.replace(base, **changes)
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def call_seed(session_seed: int | None, client_seed: int | None, call: int) -> int | None:
    """Seed of a session's sampler call ``call`` (0-based, counted when the call starts).

    Without a client seed: ``turn_seed(session_seed, call)`` (None when the session
    is unseeded). With one (OpenAI ``seed``), it feeds in deterministically: a seeded
    session uses ``turn_seed(mix(session_seed, client_seed), call)``, so rollouts of a
    group (each session seeded apart, as the training loop does) still sample apart
    when their agent hard-codes ``seed=42``; an unseeded session takes the client's
    seed as its session seed, ``turn_seed(client_seed mod 2**63, call)``, so the same
    agent run against fresh sessions reproduces its samples.
    """
    if client_seed is None:
        return None if session_seed is None else turn_seed(session_seed, call)
    if session_seed is None:
        return turn_seed(client_seed % 2**63, call)
    digest = hashlib.blake2b(f"{session_seed}:{client_seed}".encode(), digest_size=8).digest()
    return turn_seed(int.from_bytes(digest, "big") % 2**63, call)


def turn_seed(seed: int, turn: int) -> int:
    """Seed of sampler call ``turn`` (0-based, counted per session when the call starts)
    of a session seeded with ``seed``: a seeded session draws fresh randomness each
    call, concurrent calls included, reproducibly."""
    return seed if turn == 0 else (seed + 1_000_003 * turn) % (2**63)
