"""A local stand-in for the AgentCore Runtime data plane (InvokeAgentRuntime, StopRuntimeSession).

Point boto3's ``bedrock-agentcore`` client (or ``runtime.endpoint_url``) at it
to run an agent's RL wiring end to end before deploying it. Defines
(re-exported from private modules):

- ``AcrStandIn``: the ASGI app; one agent process per session, fault knobs, call records.
- ``StandInServer``: serves it on a background thread.
- ``CallRecord``: one recorded call.
- ``EXAMPLE_ARN``: an ARN of the right shape for local runs.

Command line: ``python -m core.testing.agentcore_standin my_agent:app --port 9000``.
"""

from __future__ import annotations

from core.testing.agentcore_standin._app import AcrStandIn, CallRecord
from core.testing.agentcore_standin._server import EXAMPLE_ARN, StandInServer

__all__ = ["EXAMPLE_ARN", "AcrStandIn", "CallRecord", "StandInServer"]
