"""Agents for the runtime tests: one app whose behaviour the payload picks.

Served in real agent processes by the local runtime (never imported by pytest).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from core.agent import AgentApp, ModelConfig, RequestContext

# Fault switch for the restart test: a replacement process hangs at import.
_block = os.environ.get("TRACERL_TEST_BLOCK_FILE")
if _block and os.path.exists(_block):
    time.sleep(3600)

app = AgentApp()


@app.entrypoint
async def handler(payload: dict, context: RequestContext) -> dict:
    mode = payload.get("mode", "ok")
    (context.workdir / "note.txt").write_text(payload.get("note", "x"))
    if mode == "ok":
        cfg = ModelConfig.from_payload(payload)
        await asyncio.sleep(float(payload.get("sleep_s", 0.0)))
        return {
            "reward": float(payload.get("reward", 1.0)),
            "metrics": {"pid": os.getpid(), "api_key_len": len(cfg.api_key)},
            "echo": {
                "api_key": cfg.api_key,
                "base_url": cfg.base_url,
                "session": context.session_id,
                "workdir": str(context.workdir),
                "sampling": cfg.sampling_params,
            },
        }
    if mode == "env":  # which of the named environment variables this process sees
        return {"reward": 1.0, "env": {n: os.environ.get(n) for n in payload["names"]}}
    if mode == "steer_key":  # tries to move its S3 result onto a sibling's key
        context.session_id = payload["sibling"]
        return {"reward": 1.0}
    if mode == "quiet":  # a reward and nothing the agent was given
        return {"reward": float(payload.get("reward", 1.0)), "metrics": {"turns": 1.0}}
    if mode == "raise":
        raise RuntimeError(f"agent bug on purpose: {payload.get('tag')}")
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "no_reward":
        return {"metrics": {"x": 1.0}}
    if mode == "bad_reward":
        return {"reward": payload["value"]}
    if mode == "rewards_list":
        return {"rewards": payload["value"]}
    if mode == "not_dict":
        return [1, 2]  # type: ignore[return-value]
    raise ValueError(f"unknown mode {mode!r}")


sync_app = AgentApp()


@sync_app.entrypoint
def sync_handler(payload: dict) -> dict:
    if payload.get("mode") == "hang":  # stuck for good: a thread cannot be interrupted
        threading.Event().wait()
    time.sleep(float(payload.get("sleep_s", 0.0)))
    if payload.get("mode") == "raise":
        raise KeyError("sync bug")
    return {"reward": 0.5, "metrics": {"pid": os.getpid()}}
