"""The agent of the per-node gateway shard tests (``test_ray_node_shards.py``).

Two model calls through the gateway at its ``_config`` base URL with the official
openai SDK, the second resending the history. It reports its parent process (the
agent actor that spawned it, and so the Ray node it runs on). With ``payload["gate"]``
it writes ``<gate>/<n>.first`` after its first call and waits for ``<gate>/go``
before the second, so a test can break something while every rollout is mid-way.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import openai

from core.agent import AgentApp, ModelConfig

app = AgentApp()


@app.entrypoint
async def handler(payload: dict[str, Any]) -> dict[str, Any]:
    """Ask ``payload["question"]``, then "Sure?"; reward 1.0."""
    cfg = ModelConfig.from_payload(payload)
    messages: list[Any] = [{"role": "user", "content": str(payload["question"])}]
    gate = str(payload.get("gate") or "")
    async with openai.AsyncOpenAI(base_url=cfg.base_url, api_key=cfg.api_key, max_retries=0) as client:
        for turn in range(2):
            if turn == 1 and gate:
                (Path(gate) / f"{payload['n']}.first").write_text(cfg.base_url)
                while not (Path(gate) / "go").exists():
                    await asyncio.sleep(0.05)
            out = await client.chat.completions.create(model=cfg.model_id, messages=messages)
            reply = out.choices[0].message.content
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
    return {"reward": 1.0, "metrics": {"agent_parent_pid": float(os.getppid())}}
