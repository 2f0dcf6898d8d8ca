"""The agent the runtime conformance suite runs: its payload picks a behaviour.

Serve it as ``core.testing.conformance_agent:app`` (``CONFORMANCE_AGENT``).
It never calls the model, so no gateway is needed. Modes:

- ``ok``: returns ``payload["reward"]`` (default 1.0) after ``sleep_s``.
- ``raise``: raises ``RuntimeError`` carrying ``payload["tag"]``.
- ``hang``: sleeps for an hour (the runtime must time it out or cancel it).
- ``die``: the process exits at once, mid-rollout (``os._exit``).
- ``bad_reward``: returns ``{"reward": payload["value"]}`` as given.
- ``no_reward``: returns metrics without a reward.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from core.agent import AgentApp

CONFORMANCE_AGENT = "core.testing.conformance_agent:app"

app = AgentApp()


@app.entrypoint
async def handler(payload: dict[str, Any]) -> dict[str, Any]:
    """Do what ``payload["mode"]`` says (see the module docstring)."""
    mode = payload.get("mode", "ok")
    if mode == "ok":
        await asyncio.sleep(float(payload.get("sleep_s", 0.0)))
        return {"reward": float(payload.get("reward", 1.0)), "metrics": {"pid": float(os.getpid())}}
    if mode == "raise":
        raise RuntimeError(f"conformance agent raised on purpose: {payload.get('tag')}")
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "die":
        os._exit(3)
    if mode == "bad_reward":
        return {"reward": payload.get("value")}
    if mode == "no_reward":
        return {"metrics": {"x": 1.0}}
    raise ValueError(f"unknown conformance agent mode {mode!r}")
