"""Agents the slime plugin's tests run under the real local runtime.

Ordinary agent code: each calls the OpenAI-compatible base URL from its
payload with the official ``openai`` SDK and returns a reward. ``mode``:

- ``two_turn``: ask, get a tool result, ask again (one row, two generated
  turns, the tool text masked). Reward depends on the second reply's text.
- ``fork``: two turns, then a request that drops the tool exchange (a
  rewritten history), which the gateway records as a second row.
- ``crash``: one model call, then raise (a failed rollout).
- ``no_call``: a reward without any model call (nothing to train on).
- ``math``: the repository's example math agent (``examples.math_agent``), unchanged.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from core.agent import AgentApp, RequestContext

app = AgentApp()


def score(text: str) -> float:
    """A reward in [0, 1] that tells most different replies apart."""
    return (sum(map(ord, text)) % 5) / 4


async def _ask(client: AsyncOpenAI, model: str, messages: list[dict[str, Any]]) -> str:
    out = await client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
    return out.choices[0].message.content or ""


@app.entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    cfg = payload["_config"]
    mode = payload.get("mode", "two_turn")
    if mode == "math":
        from examples.math_agent.agent import solve as math_solve

        return await math_solve(payload, context)  # type: ignore[no-any-return]
    if mode == "no_call":
        return {"reward": 1.0}
    model = cfg["model_id"]
    async with AsyncOpenAI(
        base_url=cfg["base_url"], api_key=cfg["api_key"], max_retries=0, timeout=60.0
    ) as client:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Say a."},
            {"role": "user", "content": f"q{payload.get('n', 0)}"},
        ]
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
    return {"reward": score(second)}
