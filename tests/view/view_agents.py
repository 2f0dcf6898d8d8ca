"""An agent for the viewer tests, served by the local runtime in its own processes
(the tests put this directory on the agents' PYTHONPATH)."""

from __future__ import annotations

from typing import Any

from core.agent import AgentApp
from core.tasks.succ_digit import solve

app = AgentApp()

HOSTILE = '<img src=x onerror="window.__xss=1"></script><script>window.__xss=2</script>'
"""Markup in the crash message: the viewer must show it as text, never run it."""


@app.entrypoint
async def solve_or_crash(payload: dict[str, Any]) -> dict[str, Any]:
    """The succ_digit agent, except that rows marked ``fail`` crash before any model call."""
    if payload.get("fail"):
        raise RuntimeError(f"agent crashed on purpose for n={payload['n']}: {HOSTILE}")
    return await solve(payload)
