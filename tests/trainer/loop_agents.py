"""Agents for the loop tests, served by the local runtime in their own processes
(the tests put this directory on the agents' PYTHONPATH)."""

from __future__ import annotations

from typing import Any

from core.agent import AgentApp
from core.tasks.succ_digit import solve

flaky = AgentApp()


@flaky.entrypoint
async def flaky_solve(payload: dict[str, Any]) -> dict[str, Any]:
    """The succ_digit agent, except that rows marked ``fail`` crash."""
    if payload.get("fail"):
        raise RuntimeError(f"agent crashed on purpose for n={payload['n']}")
    return await solve(payload)


silent = AgentApp()


@silent.entrypoint
async def no_model_call(payload: dict[str, Any]) -> dict[str, Any]:
    """Returns a reward without ever calling the gateway (a miswired agent)."""
    return {"reward": 1.0}


crashing = AgentApp()


@crashing.entrypoint
async def always_crash(payload: dict[str, Any]) -> dict[str, Any]:
    raise ConnectionError("cannot reach http://localhost:9999/v1: connection refused")
