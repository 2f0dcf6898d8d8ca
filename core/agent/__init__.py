"""Agent side of tracerl: serve an agent under the AgentCore Runtime HTTP contract.

Importable without torch, Hydra, transformers or boto3 (boto3 is loaded only
when a payload asks for S3 results), so agent containers stay small.

Defines (re-exported from private modules):

- ``AgentApp``: the app; ``@app.entrypoint`` registers a handler returning
  ``{"reward": float, "metrics": {...}}``.
- ``AgentCoreRLApp`` / ``AgentCoreRuntimeApp``: drop-in names for agents written
  for agentcore-rl-toolkit (only the import changes).
- ``ModelConfig``: the gateway URL, model id, api key and sampling params of a payload.
- ``RequestContext``: session id, invocation id and per-session working directory.
- ``SESSION_HEADER``: the session header name.
- ``TOKEN_ENV`` / ``TOKEN_HEADER``: the invocation token a server demands when the
  variable is set, and the header that carries it.
"""

from __future__ import annotations

from core.agent._app import AgentApp, AgentCoreRLApp, AgentCoreRuntimeApp, RequestContext
from core.agent._auth import TOKEN_ENV, TOKEN_HEADER
from core.agent._protocol import SESSION_HEADER, ModelConfig

__all__ = [
    "SESSION_HEADER",
    "TOKEN_ENV",
    "TOKEN_HEADER",
    "AgentApp",
    "AgentCoreRLApp",
    "AgentCoreRuntimeApp",
    "ModelConfig",
    "RequestContext",
]
