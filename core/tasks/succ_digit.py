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
from collections import Counter
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


def long_tail_delay(*, p50_s: float, ratio: float, key: str, rollout: int) -> float:
    """Rollout ``rollout`` of the row keyed ``key``: one seeded lognormal delay (seconds).

    Median ``p50_s``, p99/p50 ``ratio``; the same arguments give the same delay,
    and each rollout index draws its own, so one group's rollouts differ.
    """
    if p50_s < 0 or ratio < 1:
        raise ValueError(f"long tail needs p50_s >= 0 and ratio >= 1, got {p50_s!r}, {ratio!r}")
    sigma = math.log(ratio) / LONG_TAIL_Z99
    rng = random.Random(f"long-tail-{key}-{rollout}")
    return p50_s * math.exp(sigma * rng.gauss(0.0, 1.0))


def write_dataset(
    train_path: str,
    eval_path: str,
    *,
    rows: int = 1000,
    seed: int = 0,
    long_tail_p50_s: float = 0.0,
    long_tail_ratio: float = 10.0,
    long_tail_fail_slowdown: float = 1.0,
) -> None:
    """Write ``rows`` random training payloads and one eval payload per digit.

    ``long_tail_p50_s`` > 0 makes the task behave like an agent with slow tools:
    each training row gets a ``long_tail`` entry (its key, median
    ``long_tail_p50_s``, p99/p50 ``long_tail_ratio``) from which every rollout
    draws its own seeded lognormal delay to wait after its model call (see
    ``solve``). The rows themselves (and so the data) are the same as without it.
    ``long_tail_fail_slowdown`` > 1 correlates the delay with failure: a rollout
    whose reply is wrong waits that many times longer (an agent whose failures
    loop to the turn cap or time out).
    """
    if long_tail_p50_s < 0 or long_tail_ratio < 1:
        raise ValueError(
            f"long tail needs long_tail_p50_s >= 0 and long_tail_ratio >= 1, "
            f"got {long_tail_p50_s!r}, {long_tail_ratio!r}"
        )
    rng = random.Random(seed)
    Path(train_path).parent.mkdir(parents=True, exist_ok=True)
    with open(train_path, "w") as f:
        for i in range(rows):
            n = rng.randrange(10)
            payload: dict[str, Any] = {"n": n, "answer": str((n + 1) % 10)}
            if long_tail_p50_s > 0:
                payload["long_tail"] = {
                    "key": f"{seed}-{i}",
                    "p50_s": long_tail_p50_s,
                    "ratio": long_tail_ratio,
                }
                if long_tail_fail_slowdown != 1.0:
                    payload["long_tail"]["fail_slowdown"] = long_tail_fail_slowdown
            f.write(json.dumps({"payload": payload}) + "\n")
    with open(eval_path, "w") as f:
        for n in range(10):
            f.write(json.dumps({"payload": {"n": n, "answer": str((n + 1) % 10)}}) + "\n")


app = AgentApp()
_client: FastClient | None = None
_rollouts_started: Counter[str] = Counter()
"""Row key -> rollouts of that row started in this process: the next one's index."""


def rollout_delay(payload: dict[str, Any]) -> float:
    """The seconds this rollout waits after its model call (0 without the long tail).

    An explicit ``delay_s`` wins (tests pin delays with it). With ``long_tail``,
    the k-th rollout of a row started in this process draws delay k of the
    row's seeded sequence: a group's rollouts wait different, reproducible
    times (which of them gets which depends only on start order), the way
    tool latency varies per call rather than per prompt.
    """
    if payload.get("delay_s"):
        return float(payload["delay_s"])
    tail = payload.get("long_tail")
    if not tail:
        return 0.0
    key = str(tail["key"])
    k = _rollouts_started[key]
    _rollouts_started[key] += 1
    return long_tail_delay(
        p50_s=float(tail["p50_s"]), ratio=float(tail["ratio"]), key=key, rollout=k
    )


def _http() -> FastClient:
    global _client
    if _client is None:
        _client = FastClient(max_connections=512, timeout=60.0)
    return _client


@app.entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    config = payload["_config"]
    delay = rollout_delay(payload)  # drawn at the start, so the index follows start order
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
    reward = charwise_reward(reply, str(payload["answer"]))
    if delay > 0:  # the long-tail option: a slow tool after the model call
        if reward < 1.0:  # correlated workload: failing rollouts take longer
            delay *= float((payload.get("long_tail") or {}).get("fail_slowdown", 1.0))
        await asyncio.sleep(delay)
    return {
        "reward": reward,
        "metrics": {"reply_chars": float(len(reply.strip()))},
    }
