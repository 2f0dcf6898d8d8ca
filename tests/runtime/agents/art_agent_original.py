"""An agent written for agentcore-rl-toolkit 0.2.0's AgentCoreRLApp, as its users write them.

It reads the model config from ``_rollout``, returns ``rewards`` (the last
element counts) and lets the toolkit save the result to S3.
"""

import asyncio

from agentcore_rl_toolkit import AgentCoreRLApp

app = AgentCoreRLApp()


@app.rollout_entrypoint
async def invoke_agent(payload, context):
    rollout = payload["_rollout"]
    if payload.get("mode") == "raise":
        raise RuntimeError("toolkit agent failed on purpose")
    await asyncio.sleep(float(payload.get("sleep_s", 0.0)))
    return {
        "rewards": [0.0, float(payload["reward"])],
        "metrics": {"turns": 1.0},
        "echo": {
            "base_url": rollout["base_url"],
            "model_id": rollout["model_id"],
            "api_key": rollout.get("api_key"),
            "session": context.session_id,
        },
    }
