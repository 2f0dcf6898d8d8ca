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

import asyncio
import json
import math
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


LONG_TAIL_Z99 = 2.3263
"""The 99th percentile of the standard normal: a lognormal delay with sigma
``ln(ratio) / LONG_TAIL_Z99`` has p99 / p50 = ``ratio``."""


def long_tail_delays(n: int, *, p50_s: float, ratio: float = 10.0, seed: int = 0) -> list[float]:
    """``n`` seeded lognormal delays (seconds) with median ``p50_s`` and p99/p50 ``ratio``."""
    if p50_s < 0 or ratio < 1:
        raise ValueError(f"long tail needs p50_s >= 0 and ratio >= 1, got {p50_s!r}, {ratio!r}")
    rng = random.Random(f"long-tail-{seed}")
    sigma = math.log(ratio) / LONG_TAIL_Z99
    return [p50_s * math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(n)]


def write_dataset(
    train_path: str,
    eval_path: str,
    *,
    rows: int = 1000,
    seed: int = 0,
    long_tail_p50_s: float = 0.0,
    long_tail_ratio: float = 10.0,
) -> None:
    """Write ``rows`` random training payloads and one eval payload per digit.

    ``long_tail_p50_s`` > 0 makes the task behave like an agent with slow tools:
    each training row gets a ``delay_s`` (seeded lognormal, median
    ``long_tail_p50_s``, p99/p50 ``long_tail_ratio``) that the agent waits after
    its model call; all rollouts of a row wait the same. The rows themselves
    (and so the data) are the same as without it.
    """
    rng = random.Random(seed)
    delays = long_tail_delays(rows, p50_s=long_tail_p50_s, ratio=long_tail_ratio, seed=seed)
    Path(train_path).parent.mkdir(parents=True, exist_ok=True)
    with open(train_path, "w") as f:
        for i in range(rows):
            n = rng.randrange(10)
            payload: dict[str, Any] = {"n": n, "answer": str((n + 1) % 10)}
            if long_tail_p50_s > 0:
                payload["delay_s"] = round(delays[i], 4)
            f.write(json.dumps({"payload": payload}) + "\n")
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
    if payload.get("delay_s"):  # the long-tail option: a slow tool after the model call
        await asyncio.sleep(float(payload["delay_s"]))
    return {
        "reward": charwise_reward(reply, str(payload["answer"])),
        "metrics": {"reply_chars": float(len(reply.strip()))},
    }
