"""Helpers for the runtime tests: real agent processes serving tests/runtime/agents.

A plain module (not a conftest) so tests import the helpers by name."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from core.types import RolloutRequest

AGENTS_DIR = Path(__file__).parents[1] / "agents"


def agent_env(**extra: str) -> dict[str, str]:
    """Environment that makes the test agent modules importable in the agent processes."""
    path = os.pathsep.join(p for p in (str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, **extra}


def make_request(
    payload: dict[str, Any] | None = None, *, timeout_s: float = 20.0, group: str = "g0", **kw: Any
) -> RolloutRequest:
    """A rollout request with a fresh rollout id and session id."""
    return RolloutRequest(
        rollout_id=f"r-{uuid.uuid4().hex[:12]}",
        group_id=group,
        payload=payload or {},
        base_url=kw.pop("base_url", "http://127.0.0.1:9/v1"),
        session_id=kw.pop("session_id", f"sess-{uuid.uuid4().hex}"),
        model_id=kw.pop("model_id", "tiny"),
        sampling_params=kw.pop("sampling_params", {"temperature": 1.0, "max_tokens": 8}),
        timeout_s=timeout_s,
    )
