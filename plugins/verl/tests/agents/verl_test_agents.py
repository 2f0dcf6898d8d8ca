"""Agents the verl plugin's tests run under the real local runtime.

Each is ordinary agent code: it calls the OpenAI-compatible base URL it is
given with the official ``openai`` SDK and returns a reward. The payload's
``mode`` picks a behaviour:

- ``two_turn``: ask, get a tool result back, ask again (one row, 2 turns,
  tool output masked). Reward = number of characters of the second reply
  that are ``a`` over 4 (varies with sampling, so GRPO groups differ).
- ``fork``: two turns, then a third request that rewrites the history (drops
  the tool turn), which forks the gateway's trace into a second row.
- ``crash``: one model call, then raise (a failed rollout).
- ``no_call``: return a reward without calling the model.
- ``swallow``: call the model, ignore the call's error, return a reward (a
  rollout whose model call failed in the gateway but whose agent says ok).
"""

from __future__ import annotations

import contextlib
from typing import Any

from openai import AsyncOpenAI

from core.agent import AgentApp

app = AgentApp()

SYSTEM = "Say a."


def _client(config: dict[str, Any]) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=config["base_url"], api_key=config["api_key"], max_retries=0, timeout=60.0
    )


async def _ask(client: AsyncOpenAI, model: str, messages: list[dict[str, Any]]) -> str:
    response = await client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
    return response.choices[0].message.content or ""


def score(text: str) -> float:
    """A reward in [0, 1] that differs between most different replies."""
    return (sum(map(ord, text)) % 5) / 4


@app.entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    config = payload["_config"]
    mode = payload.get("mode", "two_turn")
    model = config["model_id"]
    if mode == "no_call":
        return {"reward": 1.0}
    async with _client(config) as client:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"q{payload.get('n', 0)}"},
        ]
        if mode == "swallow":
            # The agent hides the failure (the gateway saw it) and claims a reward anyway.
            with contextlib.suppress(Exception):
                await _ask(client, model, messages)
            return {"reward": 1.0}
        first = await _ask(client, model, messages)
        if mode == "crash":
            raise RuntimeError("agent crashed on purpose")
        messages += [
            {"role": "assistant", "content": first},
            {"role": "user", "content": "tool: 7"},
        ]
        second = await _ask(client, model, messages)
        if mode == "fork":
            await _ask(client, model, [messages[0], {"role": "user", "content": "again"}])
    return {"reward": score(second), "metrics": {"chars": float(len(second))}}
