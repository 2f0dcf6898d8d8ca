"""A two-role toy task for multi-agent training: both roles read "After 3?", ``up`` must
answer the next digit ("4"), ``down`` the previous one ("2"), both mod 10.

Each rollout makes two model calls through one gateway session, one per role, each its own
conversation with the same system and user text; the agent names the role as the call's
``model`` (``up`` or ``down``), which the gateway routes to that role's policy when the run
configures them (``+policies.up={} +policies.down={}``, docs/multi_agent.md).

Why it proves a policy per role: the two calls' prompts are token for token the same, so one
shared policy answers both from one distribution, and any reply earns at most 1 across the
two roles (a one-digit target matches a reply's first character or not; it cannot be both
digits). The rollout's reward, the mean of the two, is therefore capped at 0.5 for one
shared policy, whatever it learns; two policies can reach 1.0.

Reward: each role's ``succ_digit.charwise_reward`` against its target (the agent returns
them as ``role_rewards``, giving each policy its own group baseline), and their mean as
the rollout's ``reward``.

Shrunk for the tiny model, as ``lookup`` is: the task's tokenizer keeps every whole prompt
one token (``tokenizer_tokens``), digits are tokens of their own, and
``recipe/two_roles-local.yaml`` caps a reply at one token, so an answer is one digit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from core.agent import AgentApp
from core.http import FastClient
from core.tasks.succ_digit import charwise_reward

SYSTEM = "Say the digit."
ROLES: dict[str, int] = {"up": 1, "down": -1}
"""Role name (the ``model`` its calls send, and its policy's name) -> the step its answer takes."""
SHARED_CAP = 0.5
"""The best mean reward one shared policy can reach (module docstring)."""


def question(n: int) -> str:
    return f"After {n}?"


def target(role: str, n: int) -> str:
    """The answer of ``role`` to ``question(n)``."""
    return str((n + ROLES[role]) % 10)


def _chat_text(n: int, answer: str) -> str:
    from core.tokenizer import IM_END, IM_START

    return (
        f"{IM_START}system\n{SYSTEM}{IM_END}\n{IM_START}user\n{question(n)}{IM_END}\n"
        f"{IM_START}assistant\n{answer}{IM_END}\n"
    )


def tokenizer_corpus() -> list[str]:
    """The task's rendered chats (every digit, both roles' answers), for a tokenizer built from scratch."""
    return [_chat_text(n, target(role, n)) for n in range(10) for role in ROLES] * 20


def tokenizer_tokens() -> list[str]:
    """Texts the task's tokenizer keeps whole: each question, so a prompt is a few tokens and
    the digits stay tokens of their own."""
    return [question(n) for n in range(10)]


def write_dataset(train_path: str, eval_path: str, *, rows: int = 1000, digits: int = 10, seed: int = 0) -> None:
    """Write ``rows`` training payloads ``{"n": 0..digits-1}`` and one eval payload per digit."""
    if not 1 <= digits <= 10:
        raise ValueError(f"task.generator_kwargs.digits must be 1..10, got {digits}")
    rng = random.Random(seed)
    Path(train_path).parent.mkdir(parents=True, exist_ok=True)
    with open(train_path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"payload": {"n": rng.randrange(digits)}}) + "\n")
    with open(eval_path, "w") as f:
        for n in range(digits):
            f.write(json.dumps({"payload": {"n": n}}) + "\n")


app = AgentApp()
_client: FastClient | None = None


def _http() -> FastClient:
    global _client
    if _client is None:
        _client = FastClient(max_connections=512, timeout=60.0)
    return _client


async def _ask(config: dict[str, Any], role: str, n: int) -> str:
    """One call of ``role``: its own conversation, the same text for every role."""
    body: dict[str, Any] = {
        "model": role,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(n)}],
    }
    body.update(config.get("sampling_params") or {})
    response = await _http().post(
        f"{config['base_url'].rstrip('/')}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {config['api_key']}"},
    )
    if response.status_code != 200:
        raise RuntimeError(f"gateway answered HTTP {response.status_code}: {response.text[:500]}")
    return str(response.json()["choices"][0]["message"]["content"] or "")


@app.entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Ask both roles, one after the other, each in its own single-turn conversation, and score each."""
    config, n = payload["_config"], int(payload["n"])
    role_rewards: dict[str, float] = {}
    for role in ROLES:
        reply = await _ask(config, role, n)
        role_rewards[role] = charwise_reward(reply, target(role, n))
    return {
        "reward": sum(role_rewards.values()) / len(role_rewards),
        "role_rewards": role_rewards,
        "metrics": {f"{role}_right": float(r == 1.0) for role, r in role_rewards.items()},
    }
