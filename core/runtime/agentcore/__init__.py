"""The ``agentcore`` rollout runtime: rollouts on AWS Bedrock AgentCore Runtime microVMs.

Importable without boto3 (it is loaded when the runtime starts). Defines
(re-exported from private modules):

- ``AgentCoreRuntime``: the ``RolloutRuntime`` (``runtime=agentcore``).
- ``AgentCoreRuntimeConfig``: its Hydra node.
- ``TpsLimiter``: the spacing limiter shared by invocations and StopRuntimeSession.
- ``parse_runtime_arn`` / ``RuntimeArn``: ARN parsing (region, account, id).
- ``check_gateway_reachable`` / ``is_local_host``: the loopback-gateway preflight.

See docs/agentcore.md for deployment, IAM and networking.
"""

from __future__ import annotations

from core.runtime.agentcore._limiter import TpsLimiter
from core.runtime.agentcore._preflight import check_gateway_reachable, is_local_host
from core.runtime.agentcore.config import AgentCoreRuntimeConfig, RuntimeArn, parse_runtime_arn
from core.runtime.agentcore.runtime import AgentCoreRuntime, runtime_session_id

__all__ = [
    "AgentCoreRuntime",
    "AgentCoreRuntimeConfig",
    "RuntimeArn",
    "TpsLimiter",
    "check_gateway_reachable",
    "is_local_host",
    "parse_runtime_arn",
    "runtime_session_id",
]
