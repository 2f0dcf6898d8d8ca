"""Helpers for the agentcore runtime tests (a plain module, imported by name).

AWS itself is a network edge CI cannot reach: the data plane is tracerl's
stand-in (``core.testing.agentcore_standin``) and S3 is moto's server mode, both on
127.0.0.1; boto3 is the real client, pointed at them with ``endpoint_url``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from core.runtime.agentcore import AgentCoreRuntime, AgentCoreRuntimeConfig
from core.testing.agentcore_standin import EXAMPLE_ARN
from core.types import RolloutRequest

AGENTS_DIR = Path(__file__).parent / "agents"
BUCKET = "tracerl-acr-results"
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-west-2",
}


def agent_env(**extra: str) -> dict[str, str]:
    """Environment that makes the test agents importable in agent processes."""
    path = os.pathsep.join(p for p in (str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, **CREDS, **extra}


def make_runtime(endpoint: str, **overrides: Any) -> AgentCoreRuntime:
    """An agentcore runtime against the stand-in at ``endpoint``, fast polling for tests."""
    fields: dict[str, Any] = {
        "agent_runtime_arn": EXAMPLE_ARN,
        "endpoint_url": endpoint,
        "result_channel": "http",
        "poll_interval_s": 0.05,
        "max_poll_interval_s": 0.3,
        "http_wait_s": 2.0,
        "cold_start_retry_delay_s": 0.1,
        **overrides,
    }
    return AgentCoreRuntime(AgentCoreRuntimeConfig(**fields), gateway_host="127.0.0.1")


def make_request(
    payload: dict[str, Any] | None = None, *, timeout_s: float = 30.0, group: str = "g0", **kw: Any
) -> RolloutRequest:
    """A rollout with a fresh 36-character session id; the payload can check what arrived."""
    sid = kw.pop("session_id", f"sess-{uuid.uuid4().hex}")
    base_url = kw.pop("base_url", "http://127.0.0.1:9/v1")
    return RolloutRequest(
        rollout_id=f"r-{uuid.uuid4().hex[:12]}",
        group_id=group,
        payload={"expect_key": sid, "expect_base_url": base_url, **(payload or {})},
        base_url=base_url,
        session_id=sid,
        model_id=kw.pop("model_id", "tiny"),
        sampling_params=kw.pop("sampling_params", {"temperature": 1.0, "max_tokens": 8}),
        timeout_s=timeout_s,
    )
