"""A two-role toy task for multi-agent training, a relay in one conversation: role ``up``
answers "After n?" with the next digit, role ``down`` with the previous one (mod 10), and the
roles take turns, each asked about the answer the other just gave.

A rollout is one conversation, ``turns`` turns long, with the whole history resent each turn
(as agents do). Turn 1 asks the rollout's first role (``first`` in its payload: up or down,
each as often for every n) "After n?"; each later turn asks the other role about the answer
just given (n again when that answer is not a digit). With both roles right, "After 3?" -> up "4", "After 4?" ->
down "3", "After 3?" -> up "4", ... The agent names the role as each call's ``model``, which
the gateway routes to that role's policy when the run configures them (``+policies.up={}
+policies.down={}``, docs/multi_agent.md): when the policy changes, the turn starts a row of
its own, the earlier turns its context.

Why it proves a policy per role: one shared policy is capped at a mean reward of 0.5, whatever
it learns. It never sees the role, and which role speaks first is a coin flip (the payload's
``first``, as often up as down for each n) drawn apart from everything the policy sees, so
under one policy a conversation's history is as likely whichever role is about to answer.
Each turn's expected score is then at most 0.5: a one-digit answer matches one role's target
or the other's, never both. (A history does show which way the last role stepped if its answer
was right, but the policy cannot know it was right: the history is as likely either way.)
Two policies can reach 1.0.

Reward: a turn scores ``succ_digit.charwise_reward`` against its target while every turn
before it was right, and 0 once one missed (the baton is dropped), so answers that ignore the
question cannot score past the first turn by agreeing on constants. Each role's mean over its
turns is returned as ``role_rewards`` (giving each policy its own group baseline), and the
mean over all turns as the rollout's ``reward``.

Shrunk for the tiny model, as ``lookup`` is: the task's tokenizer keeps every whole question
one token (``tokenizer_tokens``), digits are tokens of their own, and
``recipe/two_roles-local.yaml`` caps a reply at one token, so an answer is one digit.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from core.agent import AgentApp
from core.http import FastClient
from core.tasks.succ_digit import charwise_reward

SYSTEM = "Say the digit."
ROLES: dict[str, int] = {"up": 1, "down": -1}
"""Role name (the ``model`` its calls send, and its policy's name) -> the step its answer takes."""
OTHER = {"up": "down", "down": "up"}
"""Who answers after each role."""
SHARED_CAP = 0.5
"""The best mean reward one shared policy can reach (module docstring)."""
TURNS = 2
"""Turns a rollout plays when its payload does not say (``task.generator_kwargs.turns``)."""

Messages = list[dict[str, str]]
Ask = Callable[[str, Messages], Awaitable[str]]
"""``ask(role, messages) -> reply``: one model call of ``role`` on its whole conversation."""


def question(n: int) -> str:
    return f"After {n}?"


def target(role: str, n: int) -> str:
    """The answer of ``role`` to ``question(n)``."""
    return str((n + ROLES[role]) % 10)


def next_question(reply: str, fallback: int) -> int:
    """The digit a reply hands the other role: its first character if that is a digit, else
    ``fallback`` (the rollout's n), the same rule whoever answered."""
    head = reply.strip()[:1]
    return int(head) if head.isdigit() else fallback


async def play(ask: Ask, n: int, turns: int = TURNS, first: str = "up") -> dict[str, Any]:
    """Play the relay from ``question(n)`` for ``turns`` turns, ``first`` answering first;
    return the agent's result."""
    if turns < 1:
        raise ValueError(f"two_roles needs at least one turn, got turns={turns}")
    if first not in ROLES:
        raise ValueError(f"two_roles' first role is one of {sorted(ROLES)}, got {first!r}")
    messages: Messages = [{"role": "system", "content": SYSTEM}]
    scores: list[float] = []
    by_role: dict[str, list[float]] = {role: [] for role in ROLES}
    role, asked = first, n
    for _ in range(turns):
        messages.append({"role": "user", "content": question(asked)})
        reply = await ask(role, messages)
        messages.append({"role": "assistant", "content": reply})
        # A relay: once a turn misses, the turns after it score nothing (the baton is dropped).
        score = charwise_reward(reply, target(role, asked)) if all(x == 1.0 for x in scores) else 0.0
        scores.append(score)
        by_role[role].append(score)
        role, asked = OTHER[role], next_question(reply, n)
    role_rewards = {role: sum(s) / len(s) for role, s in by_role.items() if s}
    return {
        "reward": sum(scores) / len(scores),
        "role_rewards": role_rewards,
        "metrics": {f"{role}_right": sum(x == 1.0 for x in s) / len(s) for role, s in by_role.items() if s},
    }


def _chat_text(n: int, first: str, turns: int) -> str:
    """The rendered relay with every answer right."""
    from core.tokenizer import IM_END, IM_START

    text = f"{IM_START}system\n{SYSTEM}{IM_END}\n"
    role, asked = first, n
    for _ in range(turns):
        answer = target(role, asked)
        text += f"{IM_START}user\n{question(asked)}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n"
        role, asked = OTHER[role], int(answer)
    return text


def tokenizer_corpus() -> list[str]:
    """The task's rendered relays (every digit, either role first, one to four turns), for a
    tokenizer built from scratch."""
    return [_chat_text(n, first, turns) for n in range(10) for first in ROLES for turns in range(1, 5)] * 5


def tokenizer_tokens() -> list[str]:
    """Texts the task's tokenizer keeps whole: each question, so a prompt is a few tokens and
    the digits stay tokens of their own."""
    return [question(n) for n in range(10)]


def write_dataset(
    train_path: str, eval_path: str, *, rows: int = 1000, digits: int = 10, turns: int = TURNS, seed: int = 0
) -> None:
    """Write ``rows`` training payloads ``{"n": 0..digits-1, "first": "up" or "down", "turns":
    turns}`` (n drawn at random, each n's rows as often up-first as down-first) and an eval
    payload per digit and first role."""
    if not 1 <= digits <= 10:
        raise ValueError(f"task.generator_kwargs.digits must be 1..10, got {digits}")
    if turns < 1:
        raise ValueError(f"task.generator_kwargs.turns must be at least 1, got {turns}")
    rng = random.Random(seed)
    roles = sorted(ROLES)
    # Each digit's rows alternate their first role, from a random start: the cap needs the first
    # role independent of n (a policy may read n), so the file holds each n as often up-first
    # as down-first, to one row.
    starts = [rng.randrange(2) for _ in range(digits)]
    seen = [0] * digits
    Path(train_path).parent.mkdir(parents=True, exist_ok=True)
    with open(train_path, "w") as f:
        for _ in range(rows):
            n = rng.randrange(digits)
            first = roles[(starts[n] + seen[n]) % 2]
            seen[n] += 1
            f.write(json.dumps({"payload": {"n": n, "first": first, "turns": turns}}) + "\n")
    with open(eval_path, "w") as f:
        for n in range(digits):
            for first in roles:
                f.write(json.dumps({"payload": {"n": n, "first": first, "turns": turns}}) + "\n")


app = AgentApp()
_client: FastClient | None = None


def _http() -> FastClient:
    global _client
    if _client is None:
        _client = FastClient(max_connections=512, timeout=60.0)
    return _client


async def _chat(config: dict[str, Any], role: str, messages: Messages) -> str:
    """One call of ``role`` on its conversation so far, through the gateway."""
    body: dict[str, Any] = {"model": role, "messages": messages}
    body.update(config.get("sampling_params") or {})
    response = await _http().post(
        f"{config['base_url'].rstrip('/')}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {config['api_key']}"},
    )
    if response.status_code != 200:
        raise RuntimeError(f"gateway answered HTTP {response.status_code}: {response.text[:500]}")
    return str(response.json()["choices"][0]["message"]["content"] or "")


async def _ask(config: dict[str, Any], role: str, n: int) -> str:
    """One single-turn call of ``role`` on ``question(n)`` (test agents built on the task's calls)."""
    return await _chat(config, role, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(n)}])


@app.entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Play the relay through the gateway, each call naming its role as ``model``."""
    config = payload["_config"]

    async def ask(role: str, messages: Messages) -> str:
        return await _chat(config, role, messages)

    return await play(ask, int(payload["n"]), int(payload.get("turns", TURNS)), first_role(payload))


def first_role(payload: dict[str, Any]) -> str:
    """The payload's first role. Required: with every rollout up-first, a shared policy could
    tell the roles apart by position and the cap would not hold."""
    if "first" not in payload:
        raise ValueError(
            f"a two_roles payload needs 'first' (up or down), got {sorted(payload)}: data written before the "
            "relay has none; delete the run directory's data/ (or task.train_path) to write it anew"
        )
    return str(payload["first"])
