"""The embedded default's toy task: "After 3?" -> "4" (the next digit, mod 10).

Chosen from a prototype on this project's machines (docs/research/toy-task.md):
a constant reply scores at most 0.1, so 0.8 needs the model to read the
prompt, and a 137k-parameter model learns it from scratch in under a minute
on 2 CPU cores with the reward below.

The agent is ordinary production-style code: it calls the OpenAI-compatible
endpoint it is given (one ``core.http.FastClient`` per process, to keep the
toy agent cheap with hundreds of sessions in flight; the examples/ agents use
the official SDKs) and returns a reward.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from core.agent import AgentApp
from core.http import FastClient

SYSTEM = "Say the next digit."


def question(n: int) -> str:
    return f"After {n}?"


def charwise_reward(reply: str, target: str) -> float:
    """Matching characters over the longer length, on the stripped reply; 0 if empty.

    A right first digit followed by k junk characters earns 1/(k+1): a signal
    for the answer and a pull towards stopping (exact match gives neither).
    """
    reply = reply.strip()
    if not reply:
        return 0.0
    hits = sum(1 for a, b in zip(reply, target, strict=False) if a == b)
    return hits / max(len(reply), len(target))


def tokenizer_corpus() -> list[str]:
    """The task's rendered chats, for a tokenizer built from scratch.

    Only the characters of this task get a token (plus merges), as in the
    prototype: a ~120-token vocabulary keeps the end-of-turn token findable by
    a random policy. Text with other characters cannot be encoded with it.
    """
    from core.tokenizer import IM_END, IM_START

    texts = []
    for n in range(10):
        texts.append(
            f"{IM_START}system\n{SYSTEM}{IM_END}\n{IM_START}user\n{question(n)}{IM_END}\n"
            f"{IM_START}assistant\n{(n + 1) % 10}{IM_END}\n"
        )
    return texts * 30


def write_dataset(train_path: str, eval_path: str, *, rows: int = 1000, seed: int = 0) -> None:
    """Write ``rows`` random training payloads and one eval payload per digit."""
    rng = random.Random(seed)
    Path(train_path).parent.mkdir(parents=True, exist_ok=True)
    with open(train_path, "w") as f:
        for _ in range(rows):
            n = rng.randrange(10)
            f.write(json.dumps({"payload": {"n": n, "answer": str((n + 1) % 10)}}) + "\n")
    with open(eval_path, "w") as f:
        for n in range(10):
            f.write(json.dumps({"payload": {"n": n, "answer": str((n + 1) % 10)}}) + "\n")


app = AgentApp()
_client: FastClient | None = None


def _http() -> FastClient:
    global _client
    if _client is None:
        _client = FastClient(max_connections=512, timeout=60.0)
    return _client


@app.entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    config = payload["_config"]
    body: dict[str, Any] = {
        "model": config["model_id"],
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question(int(payload["n"]))},
        ],
    }
    body.update(config.get("sampling_params") or {})
    response = await _http().post(
        f"{config['base_url'].rstrip('/')}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {config['api_key']}"},
    )
    if response.status_code != 200:
        raise RuntimeError(f"gateway answered HTTP {response.status_code}: {response.text[:500]}")
    reply = response.json()["choices"][0]["message"]["content"] or ""
    return {
        "reward": charwise_reward(reply, str(payload["answer"])),
        "metrics": {"reply_chars": float(len(reply.strip()))},
    }
