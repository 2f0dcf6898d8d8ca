"""Agents for the eval and reward tests, served by the local runtime in their own
processes (the tests put this directory on the agents' PYTHONPATH)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from core.agent import AgentApp
from core.http import FastClient
from core.tasks.succ_digit import solve

late = AgentApp()
_tasks: set[asyncio.Task[None]] = set()


async def _post_later(base_url: str, rollout_id: str, reward: float) -> None:
    await asyncio.sleep(0.3)  # well after the rollout returned
    client = FastClient(max_connections=4, timeout=10.0)
    root = base_url.rstrip("/").removesuffix("/v1")
    response = await client.post(
        f"{root}/admin/rollouts/{rollout_id}/reward",
        json={"reward": reward},
        headers={"Authorization": f"Bearer {os.environ['TEST_ADMIN_TOKEN']}"},
    )
    assert response.status_code == 200, response.text


@late.entrypoint
async def late_reward(payload: dict[str, Any]) -> dict[str, Any]:
    """Calls the model like succ_digit, then leaves the reward pending. A scorer posts
    it 0.3 s later for even ``n`` (reward n / 10); odd ``n`` never gets one."""
    await solve(payload)
    n = int(payload["n"])
    if n % 2 == 0:
        config = payload["_config"]
        task = asyncio.get_running_loop().create_task(_post_later(config["base_url"], config["rollout_id"], n / 10))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
    return {"reward_pending": True}
